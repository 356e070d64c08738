"""save_pretrained -> plain transformers / hf_posenc.from_pretrained give back the same logits."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import ORIGINAL, ids, logits, tiny_model
from transformers import AutoModelForCausalLM

import hf_posenc

NATIVE = {
    "pi": dict(factor=2.0),
    "ntk": dict(factor=2.0),
    "dynamic_ntk": dict(factor=2.0),
    "yarn": dict(factor=4.0, beta_fast=16.0),
    "llama3": dict(factor=8.0),
    "longrope": dict(factor=2.0),
}
ALL = {**NATIVE, "dynamic_yarn": dict(factor=4.0), "none": {}}
LONG = 150  # past the original context of 64, where the methods differ


def save_patched(tmp_path, family, method, kwargs):
    model = tiny_model(family)
    hf_posenc.patch(model, method, **kwargs)
    out = tmp_path / f"{family}-{method}"
    model.save_pretrained(out)
    return model, out


@pytest.mark.parametrize("method", sorted(ALL))
def test_hf_posenc_reload_reproduces(tmp_path, family, method):
    model, out = save_patched(tmp_path, family, method, ALL[method])
    block = json.loads((out / "config.json").read_text())["hf_posenc"]
    assert block["method"] == method and block["version"] == hf_posenc.__version__
    assert block["params"] == hf_posenc.get_config(model).params
    if method != "none":
        assert block["original"]["max_position_embeddings"] == ORIGINAL
    loaded = hf_posenc.from_pretrained(str(out), dtype=torch.float32).eval()
    assert hf_posenc.get_config(loaded) == hf_posenc.get_config(model)
    for n in (40, LONG):
        x = ids(n)
        assert (logits(loaded, x) - logits(model, x)).abs().max().item() <= 1e-6
    # unpatching the reloaded model gives the original checkpoint back
    hf_posenc.unpatch(loaded)
    x = ids(LONG)
    assert (logits(loaded, x) - logits(tiny_model(family), x)).abs().max().item() <= 1e-6
    assert loaded.config.max_position_embeddings == ORIGINAL and not hasattr(loaded.config, "hf_posenc")


def test_plain_transformers_reloads_native_methods(tmp_path):
    """Saved checkpoints load in plain transformers, in a process that never imports hf_posenc."""
    expected = {}
    for family in ("llama", "qwen2", "qwen3", "mistral"):
        for method, kwargs in NATIVE.items():
            model, out = save_patched(tmp_path, family, method, kwargs)
            expected[str(out)] = logits(model, ids(LONG))
    torch.save(expected, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import sys, torch
        from transformers import AutoModelForCausalLM
        expected = torch.load({str(tmp_path / 'expected.pt')!r})
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, 96, (1, {LONG}), generator=g)
        worst = 0.0
        for path, ref in expected.items():
            m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            with torch.no_grad():
                worst = max(worst, (m(x).logits.float() - ref).abs().max().item())
        assert "hf_posenc" not in sys.modules
        print("WORST", worst)
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    worst = float(res.stdout.split("WORST")[1])
    assert worst <= 1e-5, worst


def test_ntk_is_saved_as_rewritten_theta(tmp_path):
    model, out = save_patched(tmp_path, "llama", "ntk", dict(factor=2.0))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "default"
    assert cfg["rope_parameters"]["rope_theta"] == pytest.approx(50_000.0 * 2.0 ** (16 / 14))
    assert cfg["max_position_embeddings"] == 2 * ORIGINAL
    assert cfg["hf_posenc"]["original"]["rope_parameters"]["rope_theta"] == 50_000.0


def test_reload_does_not_compound(tmp_path):
    """The stored block is re-applied from the original config, not on top of the saved (scaled) one."""
    model, out = save_patched(tmp_path, "llama", "ntk", dict(factor=2.0))
    loaded = hf_posenc.from_pretrained(str(out))
    assert loaded.config.rope_parameters["rope_theta"] == pytest.approx(model.config.rope_parameters["rope_theta"])
    resaved = tmp_path / "again"
    loaded.save_pretrained(resaved)
    again = hf_posenc.from_pretrained(str(resaved))
    x = ids(LONG)
    assert (logits(again, x) - logits(model, x)).abs().max().item() <= 1e-6


def test_from_pretrained_applies_posenc_at_load(tmp_path):
    base = tiny_model("qwen2")
    base.save_pretrained(tmp_path / "base")
    loaded = hf_posenc.from_pretrained(str(tmp_path / "base"), posenc={"method": "pi", "factor": 2.0})
    assert hf_posenc.get_config(loaded).method == "pi"
    direct = hf_posenc.patch(tiny_model("qwen2"), "pi", factor=2.0)
    x = ids(LONG)
    assert (logits(loaded, x) - logits(direct, x)).abs().max().item() <= 1e-6
    # a given posenc goes on top of a stored RoPE scaling (what the saved checkpoint is), as on the folder loaded by
    # plain transformers (tests/test_saved_scaling.py); a stored attention-level method is replaced
    direct.save_pretrained(tmp_path / "pi")
    swapped = hf_posenc.from_pretrained(str(tmp_path / "pi"), posenc=hf_posenc.PosEncConfig("yarn", 2.0))
    on_plain = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tmp_path / "pi", dtype=torch.float32).eval(),
                               "yarn", factor=2.0)
    assert swapped.config.max_position_embeddings == 4 * ORIGINAL
    assert (logits(swapped, x) - logits(on_plain, x)).abs().max().item() <= 1e-6
    hf_posenc.patch(tiny_model("qwen2"), "self_extend", group_size=4, window=16).save_pretrained(tmp_path / "se")
    swapped = hf_posenc.from_pretrained(str(tmp_path / "se"), posenc=hf_posenc.PosEncConfig("yarn", 2.0))
    yarn = hf_posenc.patch(tiny_model("qwen2"), "yarn", factor=2.0)
    assert (logits(swapped, x) - logits(yarn, x)).abs().max().item() <= 1e-6


def test_plain_load_of_dynamic_matches_after_growth(tmp_path):
    model, out = save_patched(tmp_path, "mistral", "dynamic_ntk", dict(factor=2.0))
    plain = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert plain.model.rotary_emb.rope_type == "dynamic"
    for n in (150, 40, 200):  # grow, shrink below the original, grow again: both keep the same state
        x = ids(n)
        assert (logits(plain, x) - logits(model, x)).abs().max().item() <= 1e-5, n


@pytest.mark.parametrize("method,kwargs,extended", [
    ("dca", {}, 4 * ORIGINAL), ("rerope", {}, 4 * ORIGINAL), ("self_extend", {"group_size": 4, "window": 16}, None),
    ("dynamic_yarn", {"factor": 2.0}, 2 * ORIGINAL),
])
def test_a_checkpoint_plain_loaders_cannot_compute_advertises_the_original_context(method, kwargs, extended,
                                                                                    tmp_path):
    """A plain loader (transformers, vLLM) builds the unpatched model from such a folder: its plain fields say the
    original context, so an engine refuses longer inputs instead of serving plain RoPE past it. hf_posenc restores
    the extended context; the live model keeps it across the save."""
    import copy

    model = tiny_model("llama")
    model.config._attn_implementation = "sdpa"
    hf_posenc.patch(model, method, **kwargs)
    live = model.config.max_position_embeddings
    assert live > ORIGINAL and (extended is None or live == extended)
    model.save_pretrained(tmp_path / "a")
    copy.deepcopy(model).save_pretrained(tmp_path / "b")  # the copy saves itself, the same way
    for folder in ("a", "b"):
        saved = json.loads((tmp_path / folder / "config.json").read_text())
        assert saved["max_position_embeddings"] == ORIGINAL and saved["rope_parameters"]["rope_type"] == "default"
        assert saved["hf_posenc"]["native"] is False
    assert model.config.max_position_embeddings == live
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "a").config.max_position_embeddings == ORIGINAL
    again = hf_posenc.from_pretrained(str(tmp_path / "a")).eval()
    assert again.config.max_position_embeddings == live
    x = ids(3 * ORIGINAL)
    assert torch.equal(logits(again, x), logits(model, x))


def test_a_checkpoint_of_an_earlier_release_with_the_extended_context_in_its_plain_fields_loads(tmp_path):
    model = tiny_model("llama")
    model.config._attn_implementation = "sdpa"
    hf_posenc.patch(model, "dca")
    type(model).save_pretrained(model, tmp_path / "old")  # as earlier releases wrote it: the live config
    assert json.loads((tmp_path / "old" / "config.json").read_text())["max_position_embeddings"] == 4 * ORIGINAL
    again = hf_posenc.from_pretrained(str(tmp_path / "old")).eval()
    assert hf_posenc.get_config(again) == hf_posenc.get_config(model)
    x = ids(3 * ORIGINAL)
    assert torch.equal(logits(again, x), logits(model, x))
