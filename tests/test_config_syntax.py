"""One configuration syntax: ``PosEncConfig.parse("yarn:factor=4,beta_fast=16")`` read by every flag, variant,
evaluator and file form, one error text, and ``str(config)`` writing it back."""

import argparse
import json

import pytest
from helpers import refused

from hf_posenc import PosEncConfig
from hf_posenc.cli.flags import method_config
from hf_posenc.config_syntax import EXAMPLE, FORM, config_error, parse_method_params, spec_text
from hf_posenc.eval.key_tokens import evaluator_config
from hf_posenc.eval.variants import parse_variant
from hf_posenc.methods import METHODS
from hf_posenc.tuning.space import load_space

YARN_KEYS = ("yarn takes: factor, original_max_position_embeddings, beta_fast, beta_slow, attention_factor, mscale, "
             "mscale_all_dim, truncate, layer_types.")

# one configuration of every registered method with knobs away from their defaults, written as str() writes it
NON_DEFAULT = {
    "none": "none:original_max_position_embeddings=64",
    "pi": 'pi:factor=2.5,layer_types=["full_attention"]',
    "ntk": "ntk:factor=3,original_max_position_embeddings=128",
    "dynamic_ntk": "dynamic_ntk:factor=2,cache=exact",
    "yarn": "yarn:factor=4,beta_fast=16,beta_slow=2.0,attention_factor=1.2,truncate=false",
    "dynamic_yarn": "dynamic_yarn:factor=4,beta_fast=16.0,finetuned=true,cache=stale",
    "llama3": "llama3:factor=8,low_freq_factor=2,high_freq_factor=8.0",
    "longrope": "longrope:factor=2,short_factor=[1.0,1.0],long_factor=[1.0,1.5]",
    "interpolate": "interpolate:factor=2.25",
    "hierarchical": "hierarchical:factor=4,alpha=0.5",
    "sinusoidal": "sinusoidal:factor=2,base=500.0",
    "bucket_scale": "bucket_scale:factor=2",
    "max_distance": "max_distance:factor=3",
    "alibi": "alibi:max_position_embeddings=256",
    "nope": "nope:max_position_embeddings=256",
    "rope": "rope:base=500000.0",
    "learned": "learned:factor=2,base=500.0",
    "self_extend": "self_extend:group_size=2,window=16",
    "rerope": "rerope:window=32,logn_scaling=false",
    "leaky_rerope": "leaky_rerope:window=32,leak=8",
    "string": "string:shifted_offset=48,local_window=16",
    "dca": "dca:chunk_size=48,local_window=8",
}


def test_every_registered_method_has_a_non_default_example():
    assert sorted(NON_DEFAULT) == sorted(METHODS)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_default_knobs_round_trip(method):
    spec = METHODS[method]
    config = PosEncConfig(method, 2.0 if spec.uses_factor else None)
    text = str(config)
    assert text == config.to_text() == (f"{method}:factor=2" if spec.uses_factor else method)
    again = PosEncConfig.parse(text)
    assert again == config and json.dumps(again.to_dict()) == json.dumps(config.to_dict())


@pytest.mark.parametrize("method", sorted(METHODS))
def test_non_default_knobs_round_trip(method):
    text = NON_DEFAULT[method]
    config = PosEncConfig.parse(text)
    assert config.method == method and str(config) == text
    assert PosEncConfig.parse(str(config)) == config
    assert json.dumps(PosEncConfig.parse(str(config)).to_dict()) == json.dumps(config.to_dict())


def test_an_int_and_a_float_knob_stay_apart_through_the_text():
    """16 and 16.0 are two configurations' dicts (two fingerprints): the text keeps them apart."""
    as_int = PosEncConfig("yarn", 2, params={"beta_fast": 16})
    as_float = PosEncConfig("yarn", 2, params={"beta_fast": 16.0})
    assert (str(as_int), str(as_float)) == ("yarn:factor=2,beta_fast=16", "yarn:factor=2,beta_fast=16.0")
    assert PosEncConfig.parse(str(as_float)).to_dict() == as_float.to_dict()
    odd = PosEncConfig("dynamic_ntk", 1.5, 4096, {"layer_types": ["a b", "c,d=e"]})  # text that needs quotes
    assert PosEncConfig.parse(str(odd)) == odd
    assert spec_text("yarn", {"cache": "true", "x": "plain"}) == 'yarn:cache="true",x=plain'


# the dicts the parsers before this one (eval/variants.py's parse_variant) produced: cell fingerprints hang on them
OLD_DICTS = {
    "yarn:factor=4,beta_fast=16":
        '{"method": "yarn", "factor": 4.0, "original_max_position_embeddings": null, "params": {"beta_fast": 16, '
        '"beta_slow": 1.0, "attention_factor": null, "mscale": null, "mscale_all_dim": null, "truncate": true, '
        '"layer_types": null}}',
    "yarn:factor=2.5,beta_fast=16.0,truncate=false,attention_factor=null":
        '{"method": "yarn", "factor": 2.5, "original_max_position_embeddings": null, "params": {"beta_fast": 16.0, '
        '"beta_slow": 1.0, "attention_factor": null, "mscale": null, "mscale_all_dim": null, "truncate": false, '
        '"layer_types": null}}',
    "longrope:factor=2,long_factor=[1.0,1.5],short_factor=[1.0,1.0]":
        '{"method": "longrope", "factor": 2.0, "original_max_position_embeddings": null, "params": {"short_factor": '
        '[1.0, 1.0], "long_factor": [1.0, 1.5], "attention_factor": null, "layer_types": null, "cache": '
        '"consistent"}}',
    "dynamic_ntk:factor=3,cache=consistent":
        '{"method": "dynamic_ntk", "factor": 3.0, "original_max_position_embeddings": null, "params": {"layer_types": '
        'null, "cache": "consistent"}}',
    "self_extend:group_size=2,window=16":
        '{"method": "self_extend", "factor": 1.0, "original_max_position_embeddings": null, "params": {"group_size": '
        '2, "window": 16}}',
    "none": '{"method": "none", "factor": 1.0, "original_max_position_embeddings": null, "params": {}}',
    "string:original_max_position_embeddings=64":
        '{"method": "string", "factor": 1.0, "original_max_position_embeddings": 64, "params": {"shifted_offset": '
        'null, "local_window": null, "attention_factor": 1.0693147180559945}}',
    "YaRN : factor = 4 , beta_slow = 2":
        '{"method": "yarn", "factor": 4.0, "original_max_position_embeddings": null, "params": {"beta_fast": 32.0, '
        '"beta_slow": 2, "attention_factor": null, "mscale": null, "mscale_all_dim": null, "truncate": true, '
        '"layer_types": null}}',
    'pi:factor=2,layer_types=["full_attention"]':
        '{"method": "pi", "factor": 2.0, "original_max_position_embeddings": null, "params": {"layer_types": '
        '["full_attention"]}}',
}


@pytest.mark.parametrize("text", sorted(OLD_DICTS))
def test_the_dict_form_is_byte_identical_to_the_old_parsers(text):
    assert json.dumps(PosEncConfig.parse(text).to_dict()) == OLD_DICTS[text]
    assert json.dumps(parse_variant(f"v={text}").to_dict()) == '{"label": "v", ' + OLD_DICTS[text][1:]
    assert json.dumps(evaluator_config(text).to_dict()) == OLD_DICTS[text]


def _one_text(text, reason, keys=YARN_KEYS):
    return f"bad method configuration {text!r}: {reason} Write {FORM}, e.g. {EXAMPLE}" + (f"; {keys}" if keys else ".")


@pytest.mark.parametrize("text,reason,keys", [
    ("yarn:factor", "expected KEY=VALUE, got 'factor'.", YARN_KEYS),
    ("yarn:=3", "expected KEY=VALUE, got '=3'.", YARN_KEYS),
    ("yarn:factor=2,factor=3", "factor given twice.", YARN_KEYS),
    ("yarn:factor=2,beta_fastt=3", "method 'yarn' does not take parameter(s) ['beta_fastt'].", YARN_KEYS),
    ("yarn", "method 'yarn' needs a factor (a finite number >= 1, e.g. factor=2.0).", YARN_KEYS),
    ("yarn:factor=NaN", "factor must be a number from 1 to 1024, got nan.", YARN_KEYS),
    ("yarn:factor=2,beta_fast=1,beta_slow=2",
     "beta_fast must be greater than beta_slow, got beta_fast=1, beta_slow=2.", YARN_KEYS),
    ("yarn:factor=2,truncate=maybe", "truncate must be True or False, got 'maybe'.", YARN_KEYS),
    ("yarn:factor=2,original_max_position_embeddings=8",
     "original_max_position_embeddings must be an integer >= 16 (the context the model was trained for), got 8.",
     YARN_KEYS),
    ("none:factor=2", "method 'none' takes no factor (got factor=2); leave it unset.",
     "none takes: original_max_position_embeddings."),
    ("", "unknown method ''. Known methods: " + ", ".join(sorted(METHODS)) + ".", None),
])
def test_every_bad_text_is_refused_with_the_one_text(text, reason, keys):
    with pytest.raises(ValueError) as err:
        PosEncConfig.parse(text)
    assert str(err.value) == _one_text(text, reason, keys)


def test_the_one_text_names_an_unknown_method_with_a_hint_and_a_non_text():
    with pytest.raises(ValueError, match=r"^bad method configuration 'yran:factor=2': unknown method 'yran'\. Did you "
                                         r"mean 'yarn'\?"):
        PosEncConfig.parse("yran:factor=2")
    with pytest.raises(ValueError, match=r"^bad method configuration '4': expected a text, got a int\."):
        PosEncConfig.parse(4)
    assert str(config_error("x", "why")) == f"bad method configuration 'x': why. Write {FORM}, e.g. {EXAMPLE}."


@pytest.mark.parametrize("text", ["yarn:factor=4,beta_fast=16", "longrope:factor=2,long_factor=[1.0,1.5]", "none",
                                  "self_extend:group_size=2,window=16", "dynamic-yarn:factor=2,finetuned=true"])
def test_variant_evaluator_and_parse_read_one_text_alike(text):
    config = PosEncConfig.parse(text)
    assert parse_variant(f"v={text}").config == config == evaluator_config(text)


@pytest.mark.parametrize("text", ["yarn:factor=2,beta_fastt=3", "yran", "yarn:factor=2,factor=3", "yarn:factor"])
def test_variant_evaluator_and_parse_refuse_one_text_alike(text):
    with pytest.raises(ValueError) as one:
        PosEncConfig.parse(text)
    with pytest.raises(ValueError) as variant:
        parse_variant(f"v={text}")
    with pytest.raises(ValueError) as evaluator:
        evaluator_config(text)
    assert str(variant.value) == f"--variant v: {one.value}"
    assert str(evaluator.value) == f"--evaluator-method: {one.value}"


def test_the_flags_refuse_with_the_one_text(tiny_checkpoint, capsys):
    text = "yarn:factor=2,beta_fastt=3"
    with pytest.raises(ValueError) as one:
        PosEncConfig.parse(text)
    base = ["eval", "ppl", "--model", tiny_checkpoint, "--lengths", "32", "--corpus", "python-docs"]
    assert f"--variant v: {one.value}" in refused(base + ["--variant", f"v={text}"], capsys)
    assert f"--evaluator-method: {one.value}" in refused(base + ["--methods", "none", "--key-tokens",
                                                                 "--evaluator-method", text], capsys)


def _args(**given):
    base = dict(config=None, method=None, factor=None, method_param=None, original_max_position_embeddings=None)
    return argparse.Namespace(**{**base, **given})


def test_method_param_types_and_checks_as_the_one_syntax():
    assert parse_method_params(["beta_fast=16", "yarn.beta_slow=2.0", "cache=consistent", "dynamic-yarn.finetuned=true",
                                "yarn.original_max_position_embeddings=32"]) == {
        "*": {"beta_fast": 16, "cache": "consistent"},
        "yarn": {"beta_slow": 2.0, "original_max_position_embeddings": 32}, "dynamic_yarn": {"finetuned": True}}
    flags = method_config(_args(method="yarn", factor=4.0, method_param=["beta_fast=16", "yarn.truncate=false"]))
    assert flags == PosEncConfig.parse("yarn:factor=4,beta_fast=16,truncate=false")
    with pytest.raises(ValueError) as one:
        PosEncConfig.parse("yarn:beta_fastt=3")
    with pytest.raises(ValueError) as flag:
        parse_method_params(["yarn.beta_fastt=3"])
    assert str(flag.value) == f"--method-param yarn.beta_fastt=3: {one.value}"
    with pytest.raises(ValueError, match=r"^--method-param yran\.window=3: bad method configuration 'yran:window=3': "
                                         "unknown method 'yran'"):
        parse_method_params(["yran.window=3"])
    with pytest.raises(ValueError, match=r"^--method-param takes KEY=VALUE or METHOD\.KEY=VALUE, got 'beta_fast'$"):
        parse_method_params(["beta_fast"])  # the flag's own form


def test_config_file_and_space_file_read_as_the_text(tmp_path):
    text = "yarn:factor=4,original_max_position_embeddings=64,beta_fast=16"
    path = tmp_path / "c.json"
    path.write_text(PosEncConfig.parse(text).to_json())
    assert method_config(_args(config=str(path))) == PosEncConfig.parse(text)
    path.write_text(json.dumps({"method": "yarn", "factor": 4, "params": {"beta_fast": 16, "beta_fastt": 1}}))
    with pytest.raises(ValueError) as err:
        method_config(_args(config=str(path)))
    assert str(err.value) == _one_text("yarn:factor=4,beta_fast=16,beta_fastt=1", "method 'yarn' does not take "
                                       "parameter(s) ['beta_fastt']; it takes: attention_factor, beta_fast, beta_slow, "
                                       "layer_types, mscale, mscale_all_dim, truncate.")
    block = {"method": "yarn", "factor": 2.0, "original_max_position_embeddings": None, "params": {"beta_slow": 0},
             "family": "rope_decoder", "native": True, "original": {}, "version": "0.1.0", "schema": 2}
    path.write_text(json.dumps(block))  # a tune's best.json: a stored block, checked as one, its fields as the text
    with pytest.raises(ValueError) as err:
        method_config(_args(config=str(path)))
    assert str(err.value) == "this configuration: the 'hf_posenc' block of its config.json: " + _one_text(
        "yarn:factor=2.0,beta_slow=0", "beta_slow must be a finite number > 0 (rotations of a frequency within the "
        "original context), got 0.")
    with pytest.raises(ValueError) as err:  # a block read by the Python API or from a checkpoint keeps its own text
        PosEncConfig.from_dict(block)
    assert "config.json: beta_slow must be a finite number > 0" in str(err.value)
    space = tmp_path / "space.json"
    space.write_text(json.dumps([f"a={text}", {"label": "b", "method": "yarn", "factor": 4,
                                               "original_max_position_embeddings": 64, "params": {"beta_fast": 16}}]))
    assert [v.config for v in load_space(str(space))] == [PosEncConfig.parse(text)] * 2
    space.write_text(json.dumps([{"label": "b", "method": "yarn", "factor": 0.5}]))
    with pytest.raises(ValueError) as err:
        load_space(str(space))
    assert str(err.value) == f"--space {space}, item 0 (b): " + _one_text(
        "yarn:factor=0.5", "factor must be a number from 1 to 1024, got 0.5.")


def test_factor_has_one_default_in_every_command(capsys):
    """--factor not given: 2 for a method that takes one (patch, finetune and eval alike), none for one that takes
    none; the Python API still asks for it."""
    from hf_posenc.cli import build_parser
    from hf_posenc.cli.eval_flags import run_settings
    from hf_posenc.eval.tasks import get_task
    from hf_posenc.methods import DEFAULT_FACTOR

    assert method_config(_args(method="yarn")) == PosEncConfig("yarn", DEFAULT_FACTOR)
    assert method_config(_args(method="self_extend")).factor == 1.0  # takes none: none given
    assert method_config(_args(method="yarn", factor=4.0)).factor == 4.0
    parser = build_parser()
    for task, expected in (("ppl", DEFAULT_FACTOR), ("retrieval", 4.0)):
        args = parser.parse_args(["eval", task])
        assert run_settings(args, get_task(task), "cmd").factor == expected
    with pytest.raises(ValueError, match="needs a factor"):
        PosEncConfig("yarn")


def test_a_config_file_refuses_any_factor_given_beside_it(tmp_path, capsys):
    from helpers import refused

    path = tmp_path / "c.json"
    path.write_text(PosEncConfig.parse("yarn:factor=4").to_json())
    with pytest.raises(ValueError, match="holds the whole configuration: drop --factor"):
        method_config(_args(config=str(path), factor=0.0))  # 0 is a value given too
    err = refused(["explain", "yarn:factor=2", "--factor", "3", "--output", str(tmp_path / "x")], capsys)
    assert "holds its knobs already" in err


@pytest.mark.parametrize("command", ["patch", "finetune"])
def test_method_takes_the_config_syntax_in_patch_and_finetune(command, tmp_path, capsys):
    """--method yarn:factor=4,beta_fast=16 is the same configuration as --method yarn --factor 4 --method-param
    beta_fast=16; the two forms together, or a bad text, are refused with the one text, before anything loads."""
    from hf_posenc.cli import build_parser

    parser = build_parser()
    rest = ["--output", str(tmp_path / "o")] + (["--eval-text-file", "x.txt"] if command == "finetune" else [])
    text = parser.parse_args([command, "--method", "yarn:factor=4,beta_fast=16", *rest])
    flags = parser.parse_args([command, "--method", "yarn", "--factor", "4", "--method-param", "beta_fast=16", *rest])
    assert method_config(text) == method_config(flags) == PosEncConfig.parse("yarn:factor=4,beta_fast=16")
    mixed = parser.parse_args([command, "--method", "yarn:factor=4", "--method-param", "beta_fast=16", *rest])
    with pytest.raises(ValueError, match="--method yarn:factor=4 holds its knobs already: drop --method-param"):
        method_config(mixed)
    with pytest.raises(ValueError) as one:
        PosEncConfig.parse("yarn:factor=4,beta_fastt=3")
    bad = parser.parse_args([command, "--method", "yarn:factor=4,beta_fastt=3", *rest])
    with pytest.raises(ValueError) as got:
        method_config(bad)
    assert str(got.value) == str(one.value)


@pytest.mark.parametrize("method", sorted(NON_DEFAULT))
def test_the_python_api_takes_the_text_form_where_it_takes_a_method(method):
    """``patch(model, "yarn:factor=4")`` and ``finetune(config="yarn:factor=4")``: the one text form, as a flag reads
    it; a text with keywords beside it is refused (which would win is not guessed)."""
    from hf_posenc.config import as_config

    text = NON_DEFAULT[method]
    assert as_config(text) == PosEncConfig.parse(text) and str(as_config(text)) == str(PosEncConfig.parse(text))
    if ":" in text:
        with pytest.raises(ValueError, match="pass either the text form .* or keyword arguments, not both"):
            as_config(text, factor=2.0)
