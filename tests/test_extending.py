"""Adding a RoPE scaling is one record (README, "Adding a method"): this test writes one -- its frequency function
and its MethodSpec with the tune grid and what the engines compute -- and runs it through everything that reads the
record: patch, save and load, tune's grid, the serving table of the card, hf-posenc methods and hf-posenc eval."""

import json
import math

import pytest

import hf_posenc
from hf_posenc.encodings.rope import default_inv_freq
from hf_posenc.methods import _ALIASES, METHODS, EngineSupport, MethodSpec, factor_grid
from hf_posenc.methods import rope as rope_records
from conftest import ORIGINAL, ids, logits, tiny_model

NAME = "sqrt_pi"


def rope_sqrt_pi(geom, factor, params, seq_len=None, device=None):
    """Position interpolation by the square root of the factor (every theta_i / sqrt(s)), in float32."""
    return default_inv_freq(geom.base, geom.dim, device) / math.sqrt(factor), 1.0


@pytest.fixture
def sqrt_pi():
    """The new scaling, registered for the test and removed after it (the registry is global)."""
    spec = MethodSpec(NAME, "rope", "PI by the square root of the factor (a test's scaling).",
                      tune_grid=factor_grid,
                      engines={"vLLM": EngineSupport("within_original", "a test's claim", caveat="a test's caveat")})
    rope_records._add(spec, rope_records.RopeScaling(
        rope_sqrt_pi, native=lambda s, L, p, g: {"rope_type": "linear", "factor": math.sqrt(s)}))
    yield METHODS[NAME]
    for table in (METHODS, rope_records.SCALINGS):
        table.pop(NAME, None)
    _ALIASES.pop(NAME, None)
    rope_records.DYNAMIC.discard(NAME)


def test_a_new_rope_scaling_is_one_record_that_everything_reads(sqrt_pi, tmp_path, tiny_checkpoint, capsys):
    from hf_posenc.cli import main
    from hf_posenc.serving import known_status, vllm_refusal
    from hf_posenc.tuning.space import factors, method_grid

    x = ids(3 * ORIGINAL)
    patched = hf_posenc.patch(tiny_model("llama"), NAME, factor=4.0)
    reference = hf_posenc.patch(tiny_model("llama"), "pi", factor=2.0)  # sqrt(4): transformers' own linear type
    assert (logits(patched, x) - logits(reference, x)).abs().max().item() <= 1e-5

    patched.save_pretrained(tmp_path / "saved")
    again = hf_posenc.from_pretrained(str(tmp_path / "saved")).eval()
    assert hf_posenc.get_config(again).method == NAME
    assert (logits(again, x) - logits(patched, x)).abs().max().item() <= 1e-5
    block = json.loads((tmp_path / "saved" / "config.json").read_text())["hf_posenc"]

    assert method_grid(NAME, 64, 256) == [{"factor": f} for f in factors(64, 256)]  # tune reads the record's grid
    rows = {r["engine"]: r for r in known_status(block)}  # the card's serving table reads its engines
    assert rows["vLLM"] == {"engine": "vLLM", "status": "same up to the original context; differs past it",
                            "basis": "a test's claim"}
    assert rows["llama.cpp"]["basis"] == "not measured" and vllm_refusal(NAME) == "a test's caveat"

    assert main(["methods", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)[NAME]
    assert listed["tuned"] is True and listed["engines"] == {"vLLM": "within_original"}

    out = tmp_path / "eval"
    assert main(["eval", "ppl", "--model", tiny_checkpoint, "--methods", f"none,{NAME}", "--factor", "2", "--lengths",
                 "128", "--corpus", "python-docs", "--limit", "1", "--no-progress", "--output", str(out)]) == 0
    report = json.loads((out / "perplexity.json").read_text())
    assert any(label.startswith(NAME) for label in report["results"]), list(report["results"])


def test_a_method_without_a_grid_is_not_tuned_and_the_error_lists_those_with_one():
    from hf_posenc.tuning.space import check_methods

    with pytest.raises(ValueError, match=r"tune has no grid for method 'alibi'; grids exist for dca, dynamic_ntk"):
        check_methods(["alibi"])
    assert {n for n, s in METHODS.items() if s.tune_grid} >= {"pi", "ntk", "yarn", "self_extend", "dca", "string"}
    with pytest.raises(ValueError, match="EngineSupport.computes must be one of"):
        EngineSupport("maybe", "")
