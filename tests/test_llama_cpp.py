"""llama.cpp as an engine (issue 43): serve-check --engine llama.cpp on SmolLM2 checkpoints converted by llama.cpp's
own converter, and what is refused or reported without starting it.

The tests that start llama.cpp need llama-cpp-python and a llama.cpp source tree for the converter (``bash
scripts/setup.sh --llama-cpp`` installs both); they are skipped, with that reason, without them. To see the
positions past the original context without scoring 8,192 tokens twice on a CPU, the checkpoints are patched with
their original context stated as 512 tokens: the scaling's math past it is the same as past SmolLM2's own 8,192.
"""

from __future__ import annotations

import importlib.util

import pytest

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.engines import llama_cpp_engine
from hf_posenc.serve_check import serve_check
from conftest import refused


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
    from conftest import load_real

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
    report = serve_check(smollm2["dca"], engine="llama.cpp", lengths=LENGTHS, progress=False)
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
    import hf_posenc.serve_check as serve_check_module

    monkeypatch.setattr(serve_check_module, "llama_cpp_version", lambda: "0.0")  # installed or not: the converter
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
    report = serve_check(smollm2["dynamic_ntk"], engine="llama.cpp", lengths=LENGTHS, progress=False)
    inside, past = report["results"]["256"], report["results"]["1000"]
    assert inside["verdict"] == "same", inside
    assert past["verdict"] == "not computable" and "dynamic" in past["reason"], past


@needs_llama_cpp
def test_a_dca_checkpoint_forced_into_llama_cpp_is_served_wrong_past_the_original_context(smollm2):
    """llama.cpp never refuses a long prompt: what --confirm-refusal finds is that it computes one, wrongly."""
    report = serve_check(smollm2["dca"], engine="llama.cpp", lengths=LENGTHS, confirm_refusal=True, progress=False)
    assert report["results"]["1000"]["verdict"] == "served wrong"
    assert report["results"]["256"]["verdict"] == "not computable"
