"""Checkpoints every consumer reads the same: config.json's RoPE also in transformers 4's keys (rope_theta,
rope_scaling), proved by transformers 4.57 itself.

The tests marked ``needs_transformers4`` load the saved folders with transformers 4.57 in a subprocess of its own
environment (``scripts/setup.sh --transformers4`` builds ``.venv-transformers4``; ``HF_POSENC_TRANSFORMERS4_PYTHON``
names another) and compare its logits with hf_posenc's; they are skipped, with that reason, where it is missing.
The rest check transformers 5's reading of the same folders, the refusals and ``hf-posenc upgrade-config``.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest
import torch
from helpers import ORIGINAL, ids, logits, refused, tiny_model
from test_layered_rope import gemma
from transformers import AutoConfig, AutoModelForCausalLM

import hf_posenc
from hf_posenc.checkpoints.legacy_rope import legacy_keys
from hf_posenc.cli import main
from hf_posenc.publishing.config_upgrade import upgrade_config
from hf_posenc.serving.launch_settings import serve_config

REPO_VENV = os.path.join(os.path.dirname(__file__), "..", ".venv-transformers4", "bin", "python")
LONG = 150  # past the original context of 64, where the methods differ
THETAS = {"qwen2": 1e6, "llama": 5e5, "mistral": 1e4}
METHODS = {"none": {}, "pi": {"factor": 2.0}, "ntk": {"factor": 2.0}, "yarn": {"factor": 4.0},
           "llama3": {"factor": 8.0}, "longrope": {"factor": 2.0}, "dynamic_ntk": {"factor": 2.0}}


def transformers4_python() -> str | None:
    path = os.environ.get("HF_POSENC_TRANSFORMERS4_PYTHON") or os.path.abspath(REPO_VENV)
    return path if os.path.isfile(path) else None


needs_transformers4 = pytest.mark.skipif(
    transformers4_python() is None,
    reason="no transformers 4: run 'bash scripts/setup.sh --transformers4' (or set HF_POSENC_TRANSFORMERS4_PYTHON)")


def patched(family: str, method: str):
    model = tiny_model(family, rope_parameters={"rope_type": "default", "rope_theta": THETAS[family]})
    return hf_posenc.patch(model, method, **METHODS[method])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{(family, method): (folder, hf_posenc's logits on LONG tokens)}, each saved by hf_posenc.save_pretrained."""
    root, out = tmp_path_factory.mktemp("transformers4"), {}
    for family in THETAS:
        for method in METHODS:
            model = patched(family, method)
            folder = str(root / f"{family}-{method}")
            hf_posenc.save_pretrained(model, folder)
            out[family, method] = folder, logits(model, ids(LONG))
    return out


def _v4_diffs(folders: dict[str, torch.Tensor], tmp_path, length: int = LONG) -> dict[str, float]:
    """Max abs diff of transformers 4.57's logits (its own process and environment) on ``length`` tokens to the
    expected ones."""
    torch.save(folders, tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import json, torch, transformers
        from transformers import AutoModelForCausalLM
        assert transformers.__version__.startswith("4.57"), transformers.__version__
        expected = torch.load({str(tmp_path / 'expected.pt')!r})
        x = torch.randint(0, 96, (1, {length}), generator=torch.Generator().manual_seed(1))
        out = {{}}
        for path, ref in expected.items():
            m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            with torch.no_grad():
                out[path] = (m(x).logits.float() - ref).abs().max().item()
        print("DIFFS" + json.dumps(out))
        """)
    res = subprocess.run([transformers4_python(), "-c", script], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": ""}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.split("DIFFS")[1])


@needs_transformers4
def test_transformers4_computes_every_saved_method_as_hf_posenc(saved, tmp_path):
    diffs = _v4_diffs({folder: ref for folder, ref in saved.values()}, tmp_path)
    table = {f"{f}/{m}": diffs[folder] for (f, m), (folder, _) in saved.items()}
    print("transformers 4.57 vs hf_posenc, max abs diff:", json.dumps(table, indent=1))
    assert all(d <= 1e-5 for d in table.values()), table


@needs_transformers4
def test_without_the_keys_transformers4_computes_another_model(saved, tmp_path):
    """The problem the keys solve: config.json with rope_parameters alone, read by transformers 4.57."""
    folder, ref = saved["qwen2", "yarn"]
    config = json.loads(open(os.path.join(folder, "config.json")).read())
    for key in ("rope_theta", "rope_scaling"):
        del config[key]
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            os.symlink(os.path.join(folder, name), bare / name)
    (bare / "config.json").write_text(json.dumps(config))
    assert _v4_diffs({str(bare): ref}, tmp_path)[str(bare)] > 1e-3  # hf_posenc's own numbers differ by ~1e-7


def test_transformers5_reads_the_folder_as_before(saved):
    """The transformers-4 keys never win over rope_parameters: transformers 5 builds the same config and logits."""
    for (family, method), (folder, ref) in saved.items():
        written = json.loads(open(os.path.join(folder, "config.json")).read())
        loaded = AutoConfig.from_pretrained(folder)
        assert {k: v for k, v in loaded.rope_parameters.items() if k != "type"} == written["rope_parameters"]
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        assert (logits(model, ids(LONG)) - ref).abs().max().item() <= 1e-6, (family, method)
        again = hf_posenc.from_pretrained(folder, dtype=torch.float32).eval()
        assert (logits(again, ids(LONG)) - ref).abs().max().item() <= 1e-6, (family, method)


def test_the_keys_written_per_method(saved):
    for family, theta in THETAS.items():
        config = json.loads(open(os.path.join(saved[family, "yarn"][0], "config.json")).read())
        assert config["rope_theta"] == theta
        scaling = config["rope_scaling"]
        assert scaling["type"] == scaling["rope_type"] == "yarn" and scaling["factor"] == 4.0
        assert scaling["original_max_position_embeddings"] == ORIGINAL and "rope_theta" not in scaling
    none = json.loads(open(os.path.join(saved["llama", "none"][0], "config.json")).read())
    assert none["rope_scaling"] is None and none["rope_theta"] == 5e5
    longrope = json.loads(open(os.path.join(saved["llama", "longrope"][0], "config.json")).read())
    assert longrope["original_max_position_embeddings"] == ORIGINAL  # where transformers 4 switches factors
    card = open(os.path.join(saved["llama", "yarn"][0], "README.md")).read()
    assert "| read right by transformers 4 | yes:" in card


def test_a_rope_transformers4_computes_otherwise_is_refused_when_asked_and_left_out_otherwise(tmp_path):
    model = hf_posenc.patch(gemma(), "yarn", factor=2.0, layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(ValueError, match=r"transformers4=True for `yarn`.*RoPE per layer type with sliding_attention "
                                         r"RoPE .*computes plain RoPE over rope_local_base_freq there"):
        hf_posenc.save_pretrained(model, str(tmp_path / "asked"), transformers4=True)
    assert not (tmp_path / "asked").exists()  # refused before anything is written
    folder = hf_posenc.save_pretrained(model, str(tmp_path / "plain"))
    config = json.loads(open(os.path.join(folder, "config.json")).read())
    assert "rope_scaling" not in config and "rope_theta" not in config
    assert "RoPE per layer type with sliding_attention" in config["hf_posenc"]["transformers4"]["reason"]
    card = open(os.path.join(folder, "README.md")).read()
    assert "| read right by transformers 4 | no:" in card and "loaders on transformers 5 read it right" in card
    assert hf_posenc.get_config(hf_posenc.from_pretrained(folder)) == hf_posenc.get_config(model)


def test_legacy_keys_refuse_what_transformers4_reads_otherwise():
    base = {"max_position_embeddings": 128}
    assert "computes default, linear" in legacy_keys({**base, "rope_parameters": {"rope_type": "proportional",
                                                                                  "rope_theta": 1e4}}).reason
    longrope = {"rope_type": "longrope", "rope_theta": 1e4, "factor": 4.0, "short_factor": [1.0],
                "long_factor": [4.0], "original_max_position_embeddings": 64}
    assert "derives its attention factor from that ratio" in legacy_keys({**base, "rope_parameters": longrope}).reason
    assert legacy_keys({**base, "rope_parameters": {**longrope, "attention_factor": 1.2}}).written
    assert "without low_freq_factor" in legacy_keys({**base, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}}).reason
    assert legacy_keys({"model_type": "bert"}).keys == {} and legacy_keys({"model_type": "bert"}).reason is None
    composite = legacy_keys({"text_config": {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}})
    assert composite.keys == {"text_config.": {"rope_theta": 1e6, "rope_scaling": None}}


def test_tgi_reads_the_keys(saved):
    verdicts = {m: serve_config(saved["llama", m][0], ["tgi"])[0] for m in METHODS}
    for method in ("none", "ntk", "yarn", "llama3", "dynamic_ntk"):
        assert verdicts[method].computes == "not measured", (method, verdicts[method].reason)
        assert "--rope-scaling" not in verdicts[method].command
    assert verdicts["pi"].computes == "cannot" and "applies no factor" in verdicts["pi"].reason
    assert verdicts["longrope"].computes == "cannot" and "short factors" in verdicts["longrope"].reason
    assert all("not launched here" in v.checked for v in verdicts.values())


# ---- hf-posenc upgrade-config ---------------------------------------------------------------------------------

def _plain_save(tmp_path, family="qwen2", method="yarn"):
    """A folder another tool saved with transformers 5: rope_parameters alone."""
    model = patched(family, method)
    folder = tmp_path / f"plain-{family}-{method}"
    type(model).save_pretrained(model, folder)  # transformers' own save, as any other tool does
    config = json.loads((folder / "config.json").read_text())
    assert "rope_scaling" not in config and "rope_theta" not in config
    return model, folder


def test_upgrade_config_into_a_new_folder_and_in_place(tmp_path, capsys):
    model, folder = _plain_save(tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert main(["upgrade-config", str(folder), "--output", str(tmp_path / "up")]) == 0
    assert f"{tmp_path / 'up'}: config.json now carries rope_scaling, rope_theta" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before  # the source untouched
    config = json.loads((tmp_path / "up" / "config.json").read_text())
    assert config["rope_theta"] == 1e6 and config["rope_scaling"]["type"] == "yarn"
    assert main(["upgrade-config", str(folder), "--output", str(tmp_path / "up")]) == 0  # its own output: replaced
    assert main(["upgrade-config", str(folder), "--in-place"]) == 0
    out = capsys.readouterr().out
    assert "now carries rope_scaling, rope_theta beside rope_parameters" in out
    assert json.loads((folder / "config.json").read_text()) == config
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.name != "config.json"} == \
        {k: v for k, v in before.items() if k != "config.json"}
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no lock or temporary file left
    for path in (folder, tmp_path / "up"):
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        assert (logits(loaded, ids(LONG)) - logits(model, ids(LONG))).abs().max().item() <= 1e-6


@needs_transformers4
def test_an_upgraded_folder_loads_right_in_transformers4(tmp_path):
    expected = {}
    for family in THETAS:
        model, folder = _plain_save(tmp_path, family, "llama3")
        upgrade_folder = str(tmp_path / f"up-{family}")
        hf_posenc_upgrade(str(folder), upgrade_folder)
        expected[upgrade_folder] = logits(model, ids(LONG))
    diffs = _v4_diffs(expected, tmp_path)
    assert max(diffs.values()) <= 1e-5, diffs


def hf_posenc_upgrade(folder: str, output: str) -> None:
    assert upgrade_config(folder, output=output).keys


def test_upgrade_config_refuses_bad_input_by_name(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert "is missing: give the checkpoint folder" in refused(["upgrade-config", str(missing), "--in-place"], capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "has no config.json" in refused(["upgrade-config", str(empty), "--in-place"], capsys)
    (empty / "config.json").write_text("[1, 2")
    assert "could not be read as JSON" in refused(["upgrade-config", str(empty), "--in-place"], capsys)
    assert "one of the arguments --in-place --output is required" in refused(["upgrade-config", str(empty)], capsys)
    assert "not allowed with argument" in refused(["upgrade-config", str(empty), "--in-place", "--output",
                                                   str(tmp_path / "x")], capsys)
    assert "--in-place --output is required" in refused(["upgrade-config", str(empty), "--in-pl"], capsys)  # no
    # abbreviation taken
    gemma_folder = tmp_path / "gemma"
    model = hf_posenc.patch(gemma(), "yarn", factor=2.0, layer_types=["full_attention", "sliding_attention"])
    type(model).save_pretrained(model, gemma_folder)
    text = (gemma_folder / "config.json").read_text()
    message = refused(["upgrade-config", str(gemma_folder), "--in-place"], capsys)
    assert "RoPE per layer type with sliding_attention RoPE" in message and "transformers 4.57" in message
    assert (gemma_folder / "config.json").read_text() == text  # nothing written
    _, folder = _plain_save(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert "did not write" in refused(["upgrade-config", str(folder), "--output", str(tmp_path / "taken")], capsys)


def test_upgrade_config_on_a_model_without_rope_adds_nothing(tmp_path, capsys):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 512}))
    assert main(["upgrade-config", str(folder), "--in-place"]) == 0
    assert "nothing to add" in capsys.readouterr().out


def test_a_plain_rope_with_other_keys_keeps_them_in_rope_scaling():
    found = legacy_keys({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24],
                                             "partial_rotary_factor": 0.5}})
    assert found.keys[""] == {"rope_theta": 1e6, "partial_rotary_factor": 0.5,
                              "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default",
                                               "type": "default"}}


def _gemma_cases(tmp_path) -> dict[str, tuple[str, torch.Tensor, int]]:
    """Gemma 3 saved by hf_posenc: YaRN x2 on its global layers, and YaRN x2 composed on a checkpoint whose global
    layers ship linear x8 (a per-type longrope): {name: (folder, hf_posenc's logits, tokens)}."""
    from test_compose import CONTEXT, gemma3

    out = {}
    for name, model, n in (("yarn", gemma(), LONG), ("composed", gemma3(), CONTEXT + 100)):
        hf_posenc.patch(model, "yarn", factor=2.0)
        folder = hf_posenc.save_pretrained(model, str(tmp_path / name))
        x = torch.randint(0, 96, (1, n), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            out[name] = folder, model(x).logits.float(), n
    return out


def test_gemma3s_rope_per_layer_type_is_written_as_transformers4_spells_it(tmp_path):
    from test_compose import GLOBAL_THETA, LOCAL_THETA
    from test_layered_rope import FULL, SLIDING

    cases = _gemma_cases(tmp_path)
    for name, (folder, ref, n) in cases.items():
        config = json.loads(open(os.path.join(folder, "config.json")).read())
        rp = config["rope_parameters"]
        assert config["rope_theta"] == rp["full_attention"]["rope_theta"] == (FULL if name == "yarn" else GLOBAL_THETA)
        assert config["rope_local_base_freq"] == (SLIDING if name == "yarn" else LOCAL_THETA)
        scaling = config["rope_scaling"]
        assert scaling["rope_type"] == rp["full_attention"]["rope_type"] == ("yarn" if name == "yarn" else "longrope")
        assert "| read right by transformers 4 | yes:" in open(os.path.join(folder, "README.md")).read()
        plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()  # transformers 5 as before
        x = torch.randint(0, 96, (1, n), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert (plain(x).logits.float() - ref).abs().max().item() <= 1e-5, name


@needs_transformers4
def test_transformers4_computes_gemma3_saved_by_hf_posenc_alike(tmp_path):
    for name, (folder, ref, n) in _gemma_cases(tmp_path).items():
        diffs = _v4_diffs({folder: ref}, tmp_path, length=n)
        assert diffs[folder] <= 1e-5, (name, diffs)


def _phi3(rope: dict, context: int):
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("phi3", vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                               original_max_position_embeddings=ORIGINAL, rope_parameters=rope, pad_token_id=0)
    return AutoModelForCausalLM.from_config(cfg).eval()


def test_phi3s_rope_scaling_is_written_with_the_three_keys_its_transformers4_config_takes(tmp_path):
    """transformers 4.57's Phi3Config refuses a rope_scaling of other keys than type, short_factor and long_factor, and
    derives the attention factor from max_position_embeddings / original_max_position_embeddings: a longrope whose
    factor is that ratio is written so; a composition whose attention factor is another is refused by name."""
    plain = hf_posenc.patch(_phi3({"rope_type": "default", "rope_theta": 1e4}, ORIGINAL), "longrope", factor=2.0)
    hf_posenc.save_pretrained(plain, tmp_path / "longrope")
    config = json.loads((tmp_path / "longrope" / "config.json").read_text())
    assert sorted(config["rope_scaling"]) == ["long_factor", "short_factor", "type"]
    assert config["rope_scaling"]["type"] == "longrope" and config["original_max_position_embeddings"] == ORIGINAL
    factors = [1.0 + 0.1 * i for i in range(8)]
    own = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8, "long_factor": factors}
    composed = hf_posenc.patch(_phi3(own, 4 * ORIGINAL), "yarn", factor=2.0)  # its temperature x (0.1 ln 2 + 1)
    found = legacy_keys(json.loads(composed.config.to_json_string()))
    assert found.reason is not None and not found.keys
    assert "takes a rope_scaling of type, short_factor, long_factor alone and derives the attention factor" in \
        found.reason
    if transformers4_python() is not None:
        want = logits(plain, ids(LONG))
        assert _v4_diffs({str(tmp_path / "longrope"): want}, tmp_path)[str(tmp_path / "longrope")] <= 1e-5
