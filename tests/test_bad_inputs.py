"""Bad input: every refused input is refused by name, by every command, and a token given to a flag no command has
is never printed. (Tokens in recorded commands, cards and reports: test_secrets.py; uploads to a misbehaving Hub:
test_publish.py.)"""

import json

import pytest
import torch
from helpers import refused, tiny_model

import hf_posenc
from hf_posenc.cli import main

SHAPED = "hf_" + "Q7x" * 12  # shaped like a Hub token, known to nobody
FLAGGED = "plainsecret-42"  # a value after --token: no shape, still a secret


@pytest.mark.parametrize("argv,message", [
    (["eval", "ppl", "--max-windows", "-1"], "argument --max-windows: expected an integer >= 1, got '-1'"),
    (["eval", "ppl", "--max-windows", "0"], "argument --max-windows: expected an integer >= 1, got '0'"),
    (["eval", "ppl", "--max-windows", "-1e3"], "argument --max-windows: expected an integer >= 1, got '-1e3'"),
    (["eval", "ppl", "--stride", "0"], "argument --stride: expected an integer >= 1, got '0'"),
    (["eval", "ppl", "--limit", "0"], "argument --limit: expected an integer >= 1, got '0'"),
    (["eval", "ppl", "--buckets", "0"], "argument --buckets: expected an integer >= 1, got '0'"),
    (["eval", "ppl", "--chunk-size", "0"], "argument --chunk-size: expected an integer >= 1, got '0'"),
    (["eval", "ppl", "--lengths", ""],
     "argument --lengths: expected one or more comma-separated integers >= 1, got ''"),
    (["eval", "passkey", "--lengths", ""], "argument --lengths: expected one or more comma-separated integers >= 1"),
    (["eval", "ppl", "--lengths", "64,128,64"],
     "argument --lengths: expected distinct values, got '64,128,64' (64 more than once)"),
    (["serve-check", "m", "--lengths", "8,8"], "argument --lengths: expected distinct values, got '8,8'"),
    (["eval", "passkey", "--depths", ""], "argument --depths: expected one or more comma-separated numbers, got ''"),
    (["eval", "passkey", "--depths", "0.5,1.5"],
     "argument --depths: depths are fractions of the filler between 0 and 1"),
    (["eval", "ppl", "--methods", ""], "argument --methods: expected one or more comma-separated names, got ''"),
    (["eval", "ppl", "--methods", "yarn,none,yarn"],
     "argument --methods: yarn listed more than once in 'yarn,none,yarn'"),
    (["eval", "passkey", "--trials", "0"], "argument --trials: expected an integer >= 1, got '0'"),
    (["finetune", "--method", "alibi", "--output", "x", "--eval-text-file", "y", "--steps", "0"],
     "argument --steps: expected an integer >= 1, got '0'"),
])
def test_cli_refuses_bad_numbers_and_lists_by_name(argv, message, capsys):
    assert message in refused(argv, capsys)


@pytest.mark.parametrize("value", ["-1e-4", "-2E+1", "-.5"])
def test_a_negative_number_in_any_form_reaches_the_flags_own_check(value, tmp_path, capsys):
    """argparse took "-1e-4" for a flag ("expected one argument"); it is the flag's value, refused by its check."""
    text = tmp_path / "a.txt"
    text.write_text("a few words of text")
    err = refused(["finetune", "--method", "yarn", "--text-file", str(text), "--eval-text-file", str(text),
                   "--learning-rate", value, "--output", str(tmp_path / "o")], capsys)
    assert f"--learning-rate must be a number > 0, got {float(value)!r}" in err
    assert not (tmp_path / "o").exists()


def test_eval_refuses_a_knob_no_method_takes(tiny_checkpoint, tmp_path, capsys):
    err = refused(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn", "--method-param",
                    "beta_fastt=16", "--lengths", "32", "--corpus", "python-docs", "--output", str(tmp_path / "o")],
                   capsys)
    assert "--method-param beta_fastt: no method of this run takes it (methods ['none', 'yarn'] take: " in err
    assert not (tmp_path / "o").exists()


def test_patch_refuses_outputs_it_must_not_write_before_any_compute(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import hf_posenc.checkpoints.runtime as runtime

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(runtime, "load_model_and_tokenizer", no_load)
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me")
    base = ["patch", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2"]
    assert f"--output '{a_file}' is an existing file" in refused(base + ["--output", str(a_file)], capsys)
    assert "is the folder of the model being patched" in refused(base + ["--output", tiny_checkpoint], capsys)
    err = refused(base + ["--output", str(tmp_path / "o"), "--private"], capsys)
    assert "--private and --revision apply to an upload: add --push-to-hub" in err
    assert a_file.read_text() == "keep me" and not (tmp_path / "o").exists()


def test_a_failing_patch_leaves_the_output_as_it_was(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    import hf_posenc.publishing.hub as hub

    out = tmp_path / "out"
    assert main(["patch", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--output", str(out),
                 "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    real = hub.save_tokenizer

    def broken(*args, **kwargs):  # the weights are written by now: a failure half-way through the save
        real(*args, **kwargs)
        raise ValueError("disk full (simulated)")

    monkeypatch.setattr(hub, "save_tokenizer", broken)
    assert "disk full (simulated)" in refused(["patch", "--model", tiny_checkpoint, "--method", "pi", "--factor",
                                                "2", "--output", str(out), "--no-progress"], capsys)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # the yarn save, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no partial folder left beside it


# -- refused before any compute ------------------------------------------------------------------
@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a model is loaded: the refusal must come first."""
    import hf_posenc.checkpoints.loading as loading

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr(loading, "from_pretrained", refuse)


def test_patch_config_file_refuses_the_flags_it_replaces(tmp_path, capsys, no_model_load):
    config = tmp_path / "best.json"
    config.write_text(hf_posenc.PosEncConfig("yarn", 2.0).to_json())
    argv = ["patch", "--config", str(config), "--original-max-position-embeddings", "4096", "--output",
            str(tmp_path / "out")]
    assert "holds the whole configuration: drop --original-max-position-embeddings" in refused(argv, capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra,message", [
    (["--factor", "1e300"], "factor must be a number from 1 to 1024, got 1e+300"),
    (["--factor", "1e308"], "factor must be a number from 1 to 1024, got 1e+308"),
    (["--methods", "none,yarn", "--stride", "8"], "--stride 8 applies to --mode sliding"),
    (["--device", "cuda:7"], "device 'cuda:7': this machine has"),
    (["--device", "gpu"], "device 'gpu' is not a torch device"),
])
def test_eval_ppl_refuses_before_loading(extra, message, tiny_checkpoint, tmp_path, capsys, no_model_load):
    argv = ["eval", "ppl", "--model", tiny_checkpoint, "--lengths", "32", "--corpus", "python-docs",
            "--no-progress", *extra]
    assert message in refused(argv, capsys)


def test_a_bad_needle_and_an_output_that_is_a_file_are_refused_before_loading(tiny_checkpoint, tmp_path, capsys,
                                                                             no_model_load):
    base = ["eval", "passkey", "--model", tiny_checkpoint, "--lengths", "64", "--no-progress"]
    err = refused(base + ["--needle", "The key is {key}, not {other}."], capsys)
    assert "the needle template may hold only the field {key}" in err and "'other'" in err
    a_file = tmp_path / "taken.txt"
    a_file.write_text("keep")
    assert f"--output '{a_file}' is an existing file" in refused(base + ["--output", str(a_file)], capsys)
    assert a_file.read_text() == "keep"


def test_text_that_is_not_utf8_is_refused_by_name_and_read_with_encoding(tiny_checkpoint, tmp_path, capsys):
    from hf_posenc.io.documents import read_text_file

    latin = tmp_path / "latin.txt"
    latin.write_bytes("Caf\u00e9 cr\u00e8me, na\u00efve fa\u00e7ade. ".encode("latin-1") * 40)
    err = refused(["eval", "ppl", "--model", tiny_checkpoint, "--text-file", str(latin), "--lengths", "32"], capsys)
    assert f"{latin} is not utf-8 text (byte 0xe9 at offset 3); pass its encoding with --encoding" in err
    assert read_text_file(str(latin), "latin-1").text.startswith("Caf\u00e9 cr\u00e8me")
    assert "unknown text encoding 'klingon'" in refused(["eval", "ppl", "--encoding", "klingon"], capsys)
    out = tmp_path / "o"
    assert main(["eval", "ppl", "--model", tiny_checkpoint, "--text-file", str(latin), "--encoding", "latin-1",
                 "--methods", "none", "--lengths", "32", "--max-windows", "1", "--output", str(out), "--no-plots",
                 "--no-progress"]) == 0
    assert json.loads((out / "perplexity.json").read_text())["setup"]["documents"] == ["latin.txt"]


def test_an_unknown_model_alias_gets_a_suggestion_not_a_hub_error(monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = refused(["eval", "ppl", "--model", "smolm2-135m", "--lengths", "32", "--corpus", "python-docs"], capsys)
    assert "cannot load model 'smolm2-135m': it is not a local folder, a .gguf file or an alias" in err
    assert "Did you mean the alias 'smollm2-135m'?" in err


def test_a_method_that_does_not_fit_is_refused_before_any_method_runs(tiny_checkpoint, monkeypatch, capsys):
    import hf_posenc.eval.run_ppl as run_ppl

    ran = []
    real = run_ppl.window_cell
    monkeypatch.setattr(run_ppl, "window_cell", lambda *a, **k: ran.append(a[2]) or real(*a, **k))
    err = refused(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn,hierarchical", "--lengths",
                    "32", "--max-windows", "1", "--corpus", "python-docs", "--no-progress"], capsys)
    assert "hierarchical" in err and ran == []  # none and yarn were not evaluated and thrown away


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # (transformers 5 would build an empty Qwen2 tokenizer)
def test_a_checkpoint_without_a_tokenizer_patches_and_saves(family, tmp_path, bert_tokenizer, capsys):
    bare = tmp_path / "bare"
    tiny_model(family, vocab_size=bert_tokenizer.vocab_size).save_pretrained(bare)
    out = tmp_path / "out"
    assert main(["patch", "--model", str(bare), "--method", "yarn", "--factor", "2", "--output", str(out),
                 "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert ("note: the model has no tokenizer, so none was saved; evaluations of this checkpoint need --tokenizer"
            in said)
    assert (out / "model.safetensors").exists() and not (out / "tokenizer_config.json").exists()
    assert hf_posenc.get_config(hf_posenc.from_pretrained(str(out))).method == "yarn"
    argv = ["eval", "ppl", "--model", str(out), "--methods", "none", "--lengths", "32", "--max-windows", "1",
            "--corpus", "python-docs", "--no-progress", "--no-plots"]
    assert "no tokenizer could be loaded from the model folder" in refused(argv, capsys)
    tok = tmp_path / "tok"
    bert_tokenizer.save_pretrained(tok)
    assert main(argv + ["--tokenizer", str(tok)]) == 0


def test_finetune_refuses_an_output_file_before_loading(tiny_checkpoint, tmp_path, capsys, no_model_load):
    a_file = tmp_path / "taken"
    a_file.write_text("keep")
    (tmp_path / "train.txt").write_text("words " * 500)
    (tmp_path / "held.txt").write_text("other words " * 500)
    err = refused(["finetune", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--output",
                    str(a_file), "--text-file", str(tmp_path / "train.txt"), "--eval-text-file",
                    str(tmp_path / "held.txt"), "--no-progress"], capsys)
    assert f"--output '{a_file}' is an existing file" in err
    assert a_file.read_text() == "keep"



# -- every command: flags are never abbreviated, and a token never shows --------------------------------------
COMMANDS = {
    "eval ppl": ["eval", "ppl", "--lengths", "32"],
    "eval passkey": ["eval", "passkey", "--lengths", "64"],
    "eval retrieval": ["eval", "retrieval", "--lengths", "64"],
    "eval harness": ["eval", "harness", "--tasks", "niah_single_1", "--lengths", "1024"],
    "tune": ["tune", "--target-length", "128", "--output", "o"],
    "patch": ["patch", "--method", "yarn", "--factor", "2", "--output", "o"],
    "finetune": ["finetune", "--method", "yarn", "--factor", "2", "--output", "o", "--eval-text-file", "h.txt"],
    "upload": ["upload", "folder", "me/x"],
    "methods": ["methods"],
    "serve-check": ["serve-check", "folder"],
    "upgrade-config": ["upgrade-config", "folder", "--in-place"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flag", ["--token", "--tok", "--hf-token"])
def test_every_command_refuses_a_token_flag_and_never_prints_it(command, flag, tiny_checkpoint, capsys,
                                                                no_model_load, monkeypatch):
    import hf_posenc.cli as cli

    for _name, module in cli.COMMANDS.items():  # the command never runs: argparse refuses first
        monkeypatch.setattr(module, "run", lambda *a, **k: pytest.fail("the command ran"))
    for secret in (SHAPED, FLAGGED):
        err = refused(COMMANDS[command] + [flag, secret], capsys)
        assert f"unrecognized arguments: {flag} ***" in err and secret not in err


@pytest.mark.parametrize("argv,prefix", [
    (["eval", "ppl", "--tokeni", "x"], "--tokeni"),  # a prefix of --tokenizer
    (["eval", "ppl", "--max-w", "2"], "--max-w"),
    (["patch", "--meth", "yarn", "--output", "o"], "--meth"),
    (["tune", "--target-length", "128", "--output", "o", "--budget", "5"], "--budget"),
    (["serve-check", "folder", "--confirm"], "--confirm"),  # a prefix of --confirm-refusal
    (["eval", "ppl", "--engine-p", "python3"], "--engine-p"),  # of --engine-python
    (["upgrade-config", "folder", "--in-place", "--out", "o"], "--out"),  # of --output
])
def test_a_prefix_of_a_flag_is_not_that_flag(argv, prefix, capsys):
    assert f"unrecognized arguments: {prefix}" in refused(argv, capsys)


@pytest.mark.parametrize("argv,message", [
    (["eval", "ppl", "--factor", "nan"], "factor must be a number from 1 to 1024, got nan"),
    (["eval", "ppl", "--factor", "inf"], "factor must be a number from 1 to 1024, got inf"),
    (["eval", "ppl", "--variant", "y=yarn:factor=2,attention_factor=1e30"], "attention_factor must be a number from 0"),
    (["eval", "ppl", "--variant", "lk=leaky_rerope:leak=1e308"], "leak must be a number > 1 and <= 1e+06"),
    (["eval", "passkey", "--variant", "s=string:attention_factor=1e300"], "attention_factor must be a number from 0"),
    (["eval", "ppl", "--variant", "d=dca:max_position_embeddings=1"],
     "max_position_embeddings must be an integer >= 16"),
    (["eval", "ppl", "--variant", "y=yarn:factor=NaN"], "factor must be a number from 1 to 1024"),
    (["patch", "--method", "yarn", "--factor", "inf", "--output", "o"], "factor must be a number from 1 to 1024"),
    (["patch", "--method", "rerope", "--method-param", "max_position_embeddings=1", "--output", "o"],
     "max_position_embeddings must be an integer >= 16"),
    (["tune", "--target-length", "128", "--output", "o", "--method-param", "yarn.attention_factor=1e30"],
     "attention_factor must be a number from 0"),
])
def test_non_finite_and_overflowing_knobs_are_refused_before_loading(argv, message, tiny_checkpoint, capsys,
                                                                     no_model_load, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = refused(argv[:2] + ["--model", tiny_checkpoint] + argv[2:] if argv[0] == "eval" else
                   argv[:1] + ["--model", tiny_checkpoint] + argv[1:], capsys)
    assert message in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv", [
    ["eval", "ppl", "--lengths", "32", "--corpus", "python-docs"],
    ["eval", "passkey", "--lengths", "64"],
    ["tune", "--target-length", "128"],
    ["patch", "--method", "yarn", "--factor", "2"],
    ["finetune", "--method", "yarn", "--factor", "2", "--eval-text-file", "h.txt", "--text-file", "t.txt"],
])
@pytest.mark.parametrize("output", ["/proc/hf_posenc_x", "/proc/self/hf_posenc_x/y"])
def test_an_output_that_cannot_be_written_is_refused_before_loading(argv, output, tiny_checkpoint, capsys,
                                                                    no_model_load, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "h.txt").write_text("held out " * 200)
    (tmp_path / "t.txt").write_text("train " * 200)
    at = 2 if argv[0] == "eval" else 1
    err = refused(argv[:at] + ["--model", tiny_checkpoint] + argv[at:] + ["--output", output], capsys)
    assert f"--output '{output}'" in err and "is not writable" in err


@pytest.mark.parametrize("content,message", [
    ('[{"label": "y", "method": "yarn", "factor": 2, "params": [1, 2]}]',
     "params must be an object of the method's knobs"),
    ('{"yarn": {"factor": 2}}', "'yarn' must map each knob to a non-empty list of values"),
    ('[{"label": "y", "method": "yarn", "factor": 1e309}]', "factor must be a number from 1 to 1024"),
    ('[{"label": "l", "method": "leaky_rerope", "params": {"leak": 1e308}}]', "leak must be a number > 1"),
    ("[1, 2", "not JSON"),
    ('"yarn"', "expected a JSON list of candidates"),
])
def test_a_malformed_space_file_is_refused_before_loading(content, message, tiny_checkpoint, tmp_path, capsys,
                                                          no_model_load):
    space = tmp_path / "space.json"
    space.write_text(content)
    err = refused(["tune", "--model", tiny_checkpoint, "--target-length", "128", "--space", str(space), "--output",
                    str(tmp_path / "o")], capsys)
    assert message in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("architectures,message", [
    (["logging"], "transformers' 'logging' is not a model class"),
    ("LlamaForCausalLM", "expected a list of model class names"),
])
def test_a_config_naming_no_model_class_isrefused(architectures, message, tiny_checkpoint, tmp_path, capsys):
    import shutil

    folder = tmp_path / "edited"
    shutil.copytree(tiny_checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = architectures
    (folder / "config.json").write_text(json.dumps(config))
    err = refused(["eval", "ppl", "--model", str(folder), "--lengths", "32", "--corpus", "python-docs"], capsys)
    assert message in err


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_next_token_scoring_refuses_models_that_are_not_causal_lms(family, bert_tokenizer, tiny_checkpoint, tmp_path,
                                                                    capsys):
    """A masked-LM head sees the token it would predict and T5 reads with its encoder: neither has a perplexity
    of the next token. `eval ppl` refuses them by name before reading any document and writes nothing."""
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    from hf_posenc.eval.perplexity import evaluate_perplexity

    small = dict(vocab_size=bert_tokenizer.vocab_size, num_heads=2, num_attention_heads=2, num_layers=1,
                 num_hidden_layers=1, d_model=32, hidden_size=32, d_ff=64, intermediate_size=64, d_kv=16)
    maker = AutoModelForMaskedLM if family == "bert" else AutoModelForSeq2SeqLM
    starts = {"decoder_start_token_id": 0, "pad_token_id": 0} if family == "t5" else {}  # as T5's own configs
    model = maker.from_config(AutoConfig.for_model(family, **small, **starts)).eval()
    with pytest.raises(ValueError, match="needs a decoder-only causal LM"):
        evaluate_perplexity(model, [torch.arange(100)], [32], progress=False)
    model.save_pretrained(tmp_path / family)
    bert_tokenizer.save_pretrained(tmp_path / family)
    out = tmp_path / "out"
    err = refused(["eval", "ppl", "--model", str(tmp_path / family), "--lengths", "32", "--corpus", "python-docs",
                   "--no-progress", "--output", str(out)], capsys)
    kind = "is not a causal language model" if family == "bert" else "is an encoder-decoder"
    assert kind in err and f"model_type '{family}'" in err and "eval retrieval" in err
    assert not out.exists() or not any(out.iterdir())
    passkey = ["eval", "passkey", "--model", str(tmp_path / family), "--lengths", "96", "--depths", "0.5",
               "--trials", "1", "--methods", "none", "--no-progress", "--output", str(out)]
    if family == "bert":  # a passkey needs an answer: BERT has none; T5 answers from its decoder
        assert "is not a causal language model" in refused(passkey, capsys)
        assert not out.exists() or not any(out.iterdir())
        judge = ["eval", "ppl", "--model", tiny_checkpoint, "--lengths", "128", "--corpus", "python-docs",
                 "--key-tokens", "--evaluator", str(tmp_path / family), "--no-progress", "--output", str(out)]
        assert "is not a causal language model" in refused(judge, capsys)  # as a key-token judge neither
        tune = ["tune", "--model", str(tmp_path / family), "--target-length", "128", "--corpus", "python-docs",
                "--no-progress", "--output", str(out)]
        assert "is not a causal language model" in refused(tune, capsys)
        assert not out.exists() or not any(out.iterdir())
    else:
        assert main(passkey) == 0 and (out / "passkey.json").is_file()
        from hf_posenc.eval.run_passkey import run_passkey

        model.config.decoder_start_token_id = model.generation_config.decoder_start_token_id = None
        with pytest.raises(ValueError, match="sets no decoder_start_token_id"):
            __import__("helpers").on_loaded(run_passkey, model, bert_tokenizer, lengths=[96], depths=[0.5], trials=1)


def test_a_method_the_family_does_not_take_is_refused_before_any_cell(tiny_checkpoint, tmp_path, capsys):
    """The unpatched model's cells come first: a later method the family cannot take is refused before them, so no
    cells file is left behind."""
    out = tmp_path / "out"
    err = refused(["eval", "passkey", "--model", tiny_checkpoint, "--methods", "none,bucket_scale", "--lengths", "96",
                   "--depths", "0.5", "--trials", "1", "--no-progress", "--output", str(out)], capsys)
    assert "method 'bucket_scale' (relative_bucket) does not apply to model_type='llama'" in err
    assert not out.exists()


def test_an_error_of_a_command_with_many_flags_is_one_usage_line_and_the_error(capsys):
    """The usage of finetune is 30+ lines: above an error it is one line pointing to --help; a short one is kept."""
    err = refused(["finetune", "--steps", "-3"], capsys)
    assert err.splitlines() == ["usage: hf-posenc finetune [options] (every option: hf-posenc finetune --help)",
                                "hf-posenc finetune: error: argument --steps: expected an integer >= 1, got '-3' "
                                "(leave the flag out for the default)"]
    err = refused(["bogus"], capsys)
    assert err.startswith("usage: hf-posenc [-h]") and "{methods,eval," in err  # the command list, in full


@pytest.mark.parametrize("argv", [["serve-config", "{adapter}"],
                                  ["serve-check", "{adapter}", "--output", "{out}"],
                                  ["explain", "yarn", "--model", "{adapter}", "--output", "{out}"]],
                         ids=lambda argv: argv[0])
def test_a_lora_adapter_folder_is_refused_as_one_with_the_line_that_merges_it(argv, tmp_path, capsys):
    """A folder of hf-posenc finetune --lora-r (the adapter, its patched base in base/), given where a whole model is
    read: the command run names it as an adapter folder and prints the merge line, before anything is computed or
    written."""
    adapter, out = tmp_path / "adapter", tmp_path / "out"
    (adapter / "base").mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "x"}))
    err = refused([word.format(adapter=adapter, out=out) for word in argv], capsys)
    assert f"model folder '{adapter}' holds a LoRA adapter" in err
    assert f"required by hf-posenc {argv[0]}" in err and "serve-check" not in err.replace(f"hf-posenc {argv[0]}", "")
    assert f"hf_posenc.training.lora.save_lora(hf_posenc.from_pretrained('{adapter}'), 'merged', merged=True" in err
    assert not out.exists()


def test_a_folder_holds_a_tokenizer_by_any_of_its_file_names(tmp_path):
    """Names transformers and remote code read a vocabulary from; a weights-only folder has none."""
    from hf_posenc.checkpoints.runtime import _tokenizer_files

    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "spm.model", "sentencepiece.bpe.model",
                 "tekken.json", "cl100k.tiktoken", "bpe.codes", "spiece.model"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / name).write_text("x")
        assert _tokenizer_files(str(folder)) == [name]
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (bare / name).write_text("{}")
    assert _tokenizer_files(str(bare)) == []
