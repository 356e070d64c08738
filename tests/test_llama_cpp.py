"""llama.cpp as an engine: serve-check --engine llama.cpp on SmolLM2 checkpoints converted by llama.cpp's
own converter, and what is refused or reported without starting it.

The tests that start llama.cpp need llama-cpp-python and a llama.cpp source tree for the converter (``bash
scripts/setup.sh --llama-cpp`` installs both); they are skipped, with that reason, without them. To see the
positions past the original context without scoring 8,192 tokens twice on a CPU, the checkpoints are patched with
their original context stated as 512 tokens: the scaling's math past it is the same as past SmolLM2's own 8,192.
"""

from __future__ import annotations

import importlib.util

import pytest
from helpers import refused

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.engines import llama_cpp_engine
from hf_posenc.serving.check import CheckSettings, serve_check


def _installed() -> bool:
    try:
        llama_cpp_engine.converter()
    except ValueError:
        return False
    return importlib.util.find_spec("llama_cpp") is not None


needs_llama_cpp = pytest.mark.skipif(not _installed(), reason="no llama.cpp: run 'bash scripts/setup.sh --llama-cpp' "
                                                              "(llama-cpp-python and its converter)")
L = 512  # the original context the test checkpoints state
LENGTHS = [256, 1000]  # inside it, and past it


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2-135M saved once per method, patched with factor 2 over an original context of 512 tokens."""
    from helpers import load_real

    model, tok = load_real("smollm2-135m")
    root, folders = tmp_path_factory.mktemp("llama-cpp"), {}
    for method in ("yarn", "pi", "dynamic_ntk", "dca"):
        knobs = {"factor": 2.0} if method != "dca" else {}
        hf_posenc.patch(model, method, original_max_position_embeddings=L, **knobs)
        folders[method] = str(root / method)
        model.save_pretrained(folders[method])
        tok.save_pretrained(folders[method])
        hf_posenc.unpatch(model)
    return folders


def test_a_method_no_engine_computes_is_not_computable_without_starting_llama_cpp(smollm2, monkeypatch):
    monkeypatch.setenv(llama_cpp_engine.SOURCE_ENV, "/nowhere")  # not needed: nothing is started
    report = serve_check(smollm2["dca"], "llama.cpp", CheckSettings(LENGTHS), progress=False)
    assert report["setup"]["engine_started"] is False
    assert {r["verdict"] for r in report["results"].values()} == {"not computable"}


@pytest.mark.parametrize("extra,message", [
    (["--allow-long"], "--allow-long set up vLLM; --engine llama.cpp takes none of them"),
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size set up vLLM"),
])
def test_vllm_only_flags_are_refused_with_llama_cpp(extra, message, smollm2, capsys):
    err = refused(["serve-check", smollm2["yarn"], "--engine", "llama.cpp", "--lengths", "256", *extra], capsys)
    assert message in err


def test_a_missing_llama_cpp_is_said_before_any_compute(smollm2, monkeypatch, capsys):
    monkeypatch.setenv(llama_cpp_engine.SOURCE_ENV, "/nowhere")
    monkeypatch.setattr(llama_cpp_engine, "llama_cpp_version", lambda: "0.0")  # installed or not: the converter
    err = refused(["serve-check", smollm2["yarn"], "--engine", "llama.cpp", "--lengths", "256"], capsys)
    assert "no llama.cpp converter at /nowhere/convert_hf_to_gguf.py" in err and "setup.sh --llama-cpp" in err


@needs_llama_cpp
@pytest.mark.parametrize("method", ["yarn", "pi"])
def test_llama_cpp_computes_the_native_scalings_as_hf_posenc_inside_and_past_the_original_context(method, smollm2,
                                                                                                  tmp_path, capsys):
    assert main(["serve-check", smollm2[method], "--engine", "llama.cpp", "--lengths", ",".join(map(str, LENGTHS)),
                 "--no-progress", "--output", str(tmp_path)]) == 0
    import json

    report = json.loads((tmp_path / "serve_check.json").read_text())
    assert report["setup"]["engine_started"] is True and report["setup"]["converted"] == "f32"
    for n in LENGTHS:
        r = report["results"][str(n)]
        assert r["verdict"] == "same" and r["relative_diff"] < 1e-4, (n, r)
    assert "converted to GGUF f32 by llama.cpp's converter" in capsys.readouterr().out


@needs_llama_cpp
def test_dynamic_ntk_past_the_original_context_is_not_computable_on_llama_cpp_and_the_same_inside(smollm2):
    report = serve_check(smollm2["dynamic_ntk"], "llama.cpp", CheckSettings(LENGTHS), progress=False)
    inside, past = report["results"]["256"], report["results"]["1000"]
    assert inside["verdict"] == "same", inside
    assert past["verdict"] == "not computable" and "dynamic" in past["reason"], past


@needs_llama_cpp
def test_a_dca_checkpoint_forced_into_llama_cpp_is_served_wrong_past_the_original_context(smollm2):
    """llama.cpp never refuses a long prompt: what --confirm-refusal finds is that it computes one, wrongly."""
    report = serve_check(smollm2["dca"], "llama.cpp", CheckSettings(LENGTHS, confirm_refusal=True), progress=False)
    assert report["results"]["1000"]["verdict"] == "served wrong"
    assert report["results"]["256"]["verdict"] == "not computable"


# GGUF in: the file llama.cpp serves, quantized as it is, against hf_posenc's de-quantized load of it


@pytest.fixture(scope="module")
def q4_ggufs(tmp_path_factory):
    """SmolLM2's Q4_1 GGUF patched in place (``patch --gguf``) with yarn x2 over a stated context of 512, and the
    same file whose metadata says pi x2 while its record says yarn (what a lost or wrong setting looks like)."""
    import os

    from hf_posenc.checkpoints.models import resolve_source
    from hf_posenc.serving.gguf_file import OWN_KEY, _keys, _reader, _scaling_keys, _value, _write, patch_gguf

    src = resolve_source("smollm2-135m")
    source = os.path.join(src.path, src.kwargs["gguf_file"])
    root = tmp_path_factory.mktemp("q4")
    yarn, pi = str(root / "yarn.gguf"), str(root / "pi.gguf")
    patch_gguf(source, yarn, {"method": "yarn", "factor": 2.0, "original_max_position_embeddings": L})
    written = patch_gguf(source, pi, {"method": "pi", "factor": 2.0, "original_max_position_embeddings": L})
    wrong = str(root / "wrong.gguf")
    _write(_reader(pi), wrong, "llama", written["metadata"], _scaling_keys(_keys("llama")), None,
           _value(_reader(yarn), OWN_KEY))
    return {"source": source, "yarn": yarn, "wrong": wrong}


@needs_llama_cpp
def test_a_q4_gguf_patched_in_place_is_the_same_within_the_stated_quantization_tolerance(q4_ggufs, tmp_path, capsys):
    import json

    assert main(["serve-check", q4_ggufs["yarn"], "--engine", "llama.cpp", "--lengths", ",".join(map(str, LENGTHS)),
                 "--no-progress", "--output", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "serve_check.json").read_text())
    s = report["setup"]
    assert s["method"] == "yarn" and s["original_context"] == L and s["converted"] is None
    assert s["weight_types"]["Q4_1"] > 100 and s["rtol"] == 5e-3 and "8 bits" in s["rtol_basis"]
    for n in LENGTHS:
        r = report["results"][str(n)]
        assert r["verdict"] == "same" and 1e-5 < r["relative_diff"] < 3e-3, (n, r)  # rounding, but little of it
    out = capsys.readouterr().out
    assert "the GGUF as it is" in out and "Q4_1 tensors quantized" in out and "within 0.005 relative" in out
    # and the tolerance resolves the method: the unpatched file's NLL is further from yarn's than it
    unpatched = serve_check(q4_ggufs["source"], "llama.cpp", CheckSettings(LENGTHS), progress=False)["results"]
    for n in LENGTHS:
        a, b = report["results"][str(n)]["hf_posenc_nll"], unpatched[str(n)]["hf_posenc_nll"]
        assert abs(a - b) / b > s["rtol"], (n, a, b)


@needs_llama_cpp
def test_a_frozen_longrope_gguf_is_served_the_same_through_rope_freqs_and_attn_factor(q4_ggufs, tmp_path):
    """A longrope with YaRN x2's per-dimension factors and temperature (over a stated 512), frozen past L and written
    into the Q4_1 GGUF as rope_freqs and attn_factor: llama.cpp computes what hf_posenc computes from its record."""
    from hf_posenc.encodings import rope as R
    from hf_posenc.serving.gguf_file import _keys, _reader, _value, patch_gguf

    reader = _reader(q4_ggufs["source"])
    keys = _keys("llama")
    geom = R.RopeGeometry(float(_value(reader, keys["base"])), int(_value(reader, keys["dim"]) or 64), L)
    yarn, temperature = R.rope_yarn(geom, 2.0, {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True})
    factors = (R.default_inv_freq(geom.base, geom.dim).double() / yarn.double()).tolist()
    frozen = str(tmp_path / "longrope.gguf")
    knobs = {"short_factor": [1.0] * len(factors), "long_factor": factors, "attention_factor": float(temperature)}
    patch_gguf(q4_ggufs["source"], frozen, {"method": "longrope", "factor": 2.0, "original_max_position_embeddings": L,
                                            "params": knobs}, freeze_at=max(LENGTHS))
    report = serve_check(frozen, "llama.cpp", CheckSettings(LENGTHS), progress=False)
    assert report["setup"]["method"] == "longrope"
    for n in LENGTHS:
        r = report["results"][str(n)]
        assert r["verdict"] == "same" and r["relative_diff"] < 3e-3, (n, r)


@needs_llama_cpp
def test_a_gguf_whose_metadata_says_another_method_than_its_record_differs_beyond_the_tolerance(q4_ggufs):
    report = serve_check(q4_ggufs["wrong"], "llama.cpp", CheckSettings(LENGTHS), progress=False)
    for n in LENGTHS:
        r = report["results"][str(n)]
        assert r["verdict"] == "differs" and r["relative_diff"] > 0.05, (n, r)


def test_a_gguf_is_checked_by_llama_cpp_only_and_a_foreign_scaling_is_refused(q4_ggufs, tmp_path, capsys):
    err = refused(["serve-check", q4_ggufs["yarn"], "--engine", "vllm", "--lengths", "256"], capsys)
    assert "is a GGUF file: serve-check scores a GGUF with --engine llama.cpp" in err
    from hf_posenc.serving.gguf_file import _keys, _reader, _scaling_keys, _write

    foreign = str(tmp_path / "foreign.gguf")  # a yarn scaling in the metadata, no hf_posenc record
    keys = _keys("llama")
    _write(_reader(q4_ggufs["source"]), foreign, "llama", {keys["type"]: "yarn", keys["factor"]: 4.0},
           _scaling_keys(keys), None, None)
    err = refused(["serve-check", foreign, "--engine", "llama.cpp", "--lengths", "256"], capsys)
    assert "has a yarn RoPE scaling (factor 4) that hf_posenc did not write" in err
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"not a gguf at all")
    err = refused(["serve-check", str(not_gguf), "--engine", "llama.cpp", "--lengths", "256"], capsys)
    assert "is a file but not a GGUF one (it does not start with the 'GGUF' magic)" in err
