"""vLLM as an engine: serve-check verdicts, the evaluations on vLLM equal to transformers', refusals.

The tests marked ``vllm`` start a real vLLM engine (the CPU build, installed by ``scripts/setup.sh --vllm`` into
``.venv-vllm``; ``HF_POSENC_VLLM_PYTHON`` names another); they are skipped, with that reason, where it is
missing. The rest need no engine: what is refused, or reported, without starting one.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import tiny_config
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.eval.run_passkey import run_passkey
from hf_posenc.eval.run_ppl import run_perplexity
from hf_posenc.io.documents import Document
from hf_posenc.serving.check import CheckSettings, EngineSettings, serve_check
from hf_posenc.serving.support import known_status, measured_rows

REPO_VENV = os.path.join(os.path.dirname(__file__), "..", ".venv-vllm", "bin", "python")
L = 256  # the tiny checkpoints' original context


def vllm_python() -> str | None:
    path = os.environ.get("HF_POSENC_VLLM_PYTHON") or os.path.abspath(REPO_VENV)
    return path if os.path.isfile(path) else None


needs_vllm = pytest.mark.skipif(vllm_python() is None, reason="no vLLM: run 'bash scripts/setup.sh --vllm' (or set "
                                                               "HF_POSENC_VLLM_PYTHON)")


def save_tiny(folder, tokenizer, method: str | None = None, context: int = L, **knobs) -> str:
    """A tiny random LLaMA that vLLM's CPU kernels take (head dim 64), patched by ``method``, saved with a tokenizer."""
    torch.manual_seed(0)
    cfg = tiny_config("llama", vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=context,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    if method:
        hf_posenc.patch(model, method, **knobs)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def prose() -> list[Document]:
    from hf_posenc.io.documents import builtin_corpus

    return builtin_corpus()[:1]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, bert_tokenizer):
    root = tmp_path_factory.mktemp("served")
    return {"yarn": save_tiny(root / "yarn", bert_tokenizer, "yarn", factor=2.0),
            "dca": save_tiny(root / "dca", bert_tokenizer, "dca"),
            "plain": save_tiny(root / "plain", bert_tokenizer)}


# ---- without an engine ----------------------------------------------------------------------------------------

def test_not_computable_reported_without_starting_the_engine(folders, tmp_path):
    """A DCA checkpoint: every length 'not computable' with the reason; no engine (its Python does not even exist)."""
    report = serve_check(folders["dca"], EngineSettings(python="/nowhere/python"), CheckSettings([100, 400]),
                         output=str(tmp_path))
    assert report["setup"]["engine_started"] is False
    assert {r["verdict"] for r in report["results"].values()} == {"not computable"}
    assert "no engine implements `dca`" in report["results"]["400"]["reason"]
    saved = json.loads((tmp_path / "serve_check.json").read_text())
    assert saved["results"] == report["results"] and "not computable" in (tmp_path / "serve_check.md").read_text()


def test_engine_vllm_refuses_variants_it_does_not_compute_by_name(tiny_checkpoint):
    with pytest.raises(ValueError,
                       match=r"vLLM does not compute dca \(no vLLM implementation of `dca`\).*--engine auto"):
        run_perplexity(model=tiny_checkpoint, methods=["none", "dca"], lengths=[32], docs=prose(), engine="vllm",
                       engine_python="/nowhere/python")
    with pytest.raises(ValueError, match=r"dynamic_ntk \(vLLM computes dynamic NTK once.*#5093"):
        run_perplexity(model=tiny_checkpoint, methods=["dynamic_ntk"], factor=2.0, lengths=[32], docs=prose(),
                       engine="vllm")


def test_missing_vllm_is_said_before_the_load(tiny_checkpoint, tmp_path):
    with pytest.raises(ValueError, match=r"'/nowhere/python' is not an executable file; install vLLM"):
        run_perplexity(model=tiny_checkpoint, methods=["yarn"], factor=2.0, lengths=[32], docs=prose(), engine="vllm",
                       engine_python="/nowhere/python")
    with pytest.raises(ValueError, match=r"--engine must be one of \['transformers', 'vllm', 'auto'\], got 'sglang'"):
        run_perplexity(model=tiny_checkpoint, methods=["yarn"], factor=2.0, lengths=[32], docs=prose(), engine="sglang")


def test_serve_check_refuses_bad_input(folders, tmp_path, capsys):
    with pytest.raises(ValueError, match="no config.json"):
        serve_check(str(tmp_path))
    with pytest.raises(ValueError, match=r"--rtol must be between 0 and 1, got 2"):
        serve_check(folders["plain"], check=CheckSettings(rtol=2))
    with pytest.raises(ValueError, match=r"--engine must be one of \['vllm', 'llama.cpp'\], got 'tgi'"):
        serve_check(folders["plain"], engine="tgi")
    with pytest.raises(SystemExit):
        main(["serve-check", folders["plain"], "--engine-arg", "not a keyword"])
    assert "expected KEY=VALUE with KEY a vllm.LLM keyword" in capsys.readouterr().err


def test_card_rows_from_a_serve_check():
    block = {"method": "yarn", "native": True, "family": "rope_decoder"}
    check = {"setup": {"engine": "vllm", "engine_version": "0.32.0", "rtol": 1e-3, "engine_started": True},
             "results": {"128": {"verdict": "same", "relative_diff": 2e-6},
                         "512": {"verdict": "same", "relative_diff": 4e-5}}}
    rows = {r["engine"]: r for r in measured_rows(known_status(block), check)}
    assert rows["vLLM"]["status"] == "same as hf_posenc at 128, 512 tokens"
    assert "measured by hf-posenc serve-check: vllm 0.32.0, mean NLL within 4.0e-05" in rows["vLLM"]["basis"]
    assert rows["SGLang"] == {r["engine"]: r for r in known_status(block)}["SGLang"]
    check["results"]["512"] = {"verdict": "differs", "relative_diff": 0.3}
    assert measured_rows(known_status(block), check)[0]["status"] == "128: same; 512: differs"


@pytest.mark.parametrize("method,native", [("yarn", True), ("dca", False), ("longrope", True)])
def test_ollamas_card_row_is_llama_cpps_it_runs(method, native):
    block = {"method": method, "native": native, "family": "rope_decoder"}
    rows = {r["engine"]: r for r in known_status(block)}
    assert rows["Ollama"]["status"] == rows["llama.cpp"]["status"]
    assert rows["Ollama"]["basis"].startswith("Ollama runs GGUFs with llama.cpp's llama-server")
    assert rows["Ollama"]["basis"].endswith("llama.cpp's: " + rows["llama.cpp"]["basis"])
    check = {"setup": {"engine": "llama.cpp", "engine_version": "0.3.36", "rtol": 1e-3, "engine_started": True},
             "results": {"128": {"verdict": "differs", "relative_diff": 0.2}}}
    measured = {r["engine"]: r for r in measured_rows(known_status(block), check)}
    assert measured["llama.cpp"]["status"] == measured["Ollama"]["status"] == "128: differs"  # a measurement reaches
    # the engine that runs it; the others keep their rows
    assert measured["vLLM"] == rows["vLLM"] and measured["TGI"] == rows["TGI"]


def test_compare_verdicts():
    from hf_posenc.serving.check import compare

    ref = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)
    same = compare(ref, ref + 1e-4, rtol=1e-3)
    assert same["verdict"] == "same" and same["max_token_diff"] == pytest.approx(1e-4) and "reason" not in same
    assert compare(ref, ref * 1.01, rtol=1e-3)["verdict"] == "differs"
    broken = compare(ref, torch.tensor([2.0, float("nan"), 4.0], dtype=torch.float64), rtol=1e-3)
    assert broken["verdict"] == "differs" and broken["reason"] == ("the engine's log-probability of 1 of the 3 tokens "
                                                                    "is not a finite number")


# ---- with vLLM ---------------------------------------------------------------------------------------------------

@needs_vllm
@pytest.mark.vllm
def test_serve_check_same_inside_and_past_the_original_context(folders, tmp_path, capsys):
    """YaRN x2 is native: vLLM derives 2L from config.json and computes it as hf_posenc does, inside and past L."""
    code = main(["serve-check", folders["yarn"], "--engine-python", vllm_python(), "--lengths", "100,400",
                 "--output", str(tmp_path), "--no-progress", "--corpus", "python-docs", "--limit", "1"])
    assert code == 0
    report = json.loads((tmp_path / "serve_check.json").read_text())
    assert report["setup"]["engine_max_model_len"] == 2 * L
    for n in ("100", "400"):
        r = report["results"][n]
        assert r["verdict"] == "same" and r["relative_diff"] < 1e-4 and r["max_token_diff"] < 1e-3, r
    assert "| 400 | same |" in capsys.readouterr().out


@needs_vllm
@pytest.mark.vllm
def test_engine_refuses_a_non_computable_checkpoint_past_the_original_context(folders):
    report = serve_check(folders["dca"], EngineSettings(python=vllm_python()),
                         CheckSettings([100, 400], confirm_refusal=True), docs=prose(), progress=False)
    assert report["setup"]["engine_max_model_len"] == L  # config.json states the original context
    assert report["results"]["100"]["verdict"] == "not computable"
    refused = report["results"]["400"]
    assert refused["verdict"] == "refused" and "256" in refused["reason"] and "400" in refused["reason"], refused


@needs_vllm
@pytest.mark.vllm
def test_eval_ppl_on_vllm_equals_transformers(folders, tmp_path):
    """Windows inside and past L, and the truncated baseline, on vLLM: the transformers engine's numbers."""
    common = dict(model=folders["plain"], methods=["none", "yarn"], factor=2.0, lengths=[200, 400], docs=prose(),
                  max_windows=2, truncated_stride=64, progress=False)
    ref = run_perplexity(**common)
    got = run_perplexity(**common, engine="vllm", engine_python=vllm_python(), output=str(tmp_path))
    assert got["setup"]["engine"]["on_vllm"] == ["none", "yarn"]
    assert set(got["results"]) == set(ref["results"]) == {"none", "yarn", f"none-truncated-{L}-stride-64"}
    for label, per_len in ref["results"].items():
        for n, r in per_len.items():
            assert got["results"][label][n]["ppl"] == pytest.approx(r["ppl"], rel=1e-3), (label, n)
            assert got["results"][label][n]["windows"] == r["windows"] == 2, (label, n)
    cells = (tmp_path / "cells.jsonl").read_text().splitlines()
    assert json.loads(cells[0])["fingerprint"]["engine"]["name"] == "vllm"


@needs_vllm
@pytest.mark.vllm
def test_passkey_on_vllm_decodes_as_transformers(folders):
    """Greedy decoding of the same prompts: vLLM's continuations are transformers' own, token for token."""
    common = dict(model=folders["plain"], methods=["none"], lengths=[120, 300], depths=[0.5], trials=2,
                  scoring="greedy", progress=False)
    ref = run_passkey(**common)
    got = run_passkey(**common, engine="vllm", engine_python=vllm_python())
    want, have = ref["results"]["none"]["samples"], got["results"]["none"]["samples"]
    assert [s["output"] for s in have] == [s["output"] for s in want] and all(s["output"] for s in have)


def test_patch_serve_check_of_a_method_no_engine_computes(folders, tmp_path, capsys):
    """patch --serve-check: for DCA the verdict is given without an engine and goes into the card and its reports."""
    out = tmp_path / "dca"
    assert main(["patch", "--model", folders["plain"], "--method", "dca", "--output", str(out), "--serve-check", "vllm",
                 "--engine-python", "/nowhere/python", "--serve-check-lengths", "100,400", "--no-progress"]) == 0
    card = (out / "README.md").read_text()
    assert ("| vLLM | 100: not computable; 400: not computable | hf-posenc serve-check: no engine implements `dca`"
            in card)
    assert f"### Served by an engine (hf-posenc serve-check)\n\nServe check of {out} (method `dca`" in card
    assert ".partial" not in card  # the folder it was checked in before it was moved into place
    check = json.loads((out / "hf_posenc_eval" / "serve_check.json").read_text())
    assert check["setup"]["folder"] == str(out) and check["setup"]["engine_started"] is False


@needs_vllm
@pytest.mark.vllm
def test_patch_serve_check_puts_the_measured_verdicts_into_the_card(folders, tmp_path):
    out = tmp_path / "yarn"
    assert main(["patch", "--model", folders["plain"], "--method", "yarn", "--factor", "2", "--output", str(out),
                 "--serve-check", "vllm", "--engine-python", vllm_python(), "--serve-check-lengths", "100,400",
                 "--no-progress"]) == 0
    card = (out / "README.md").read_text()
    assert "| vLLM | same as hf_posenc at 100, 400 tokens | measured by hf-posenc serve-check: vllm 0.32" in card
    assert "| SGLang | reads the `rope_parameters` transformers reads | not measured |" in card


@needs_vllm
@pytest.mark.vllm
def test_engine_lm_answers_as_the_model_does(folders):
    """The bridge itself: NLL, argmax of the last positions, greedy continuation and a refusal, against transformers."""
    from hf_posenc.engines.vllm_engine import EngineLM, EngineRefused, VllmEngine
    from hf_posenc.eval.scoring import last_logits, token_nll

    model = hf_posenc.from_pretrained(folders["yarn"], dtype=torch.float32).eval()
    ids = torch.randint(1000, 20000, (2, 300), generator=torch.Generator().manual_seed(0))
    with VllmEngine(folders["yarn"], python=vllm_python()) as engine:
        served = EngineLM(engine, model.config, model.generation_config)
        assert engine.max_model_len == 2 * L
        torch.testing.assert_close(token_nll(served, ids, start=5), token_nll(model, ids, start=5), atol=1e-3, rtol=0)
        assert torch.equal(served.argmax_last(ids, 4), last_logits(model, ids, 4).argmax(-1))
        want = model.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), max_new_tokens=6, do_sample=False)
        assert served.greedy(ids[:1], 6, stop=[]) == [want[0, 300:].tolist()]
        with pytest.raises(EngineRefused, match="maximum context length is 512 tokens"):
            served.token_nll(torch.randint(1000, 2000, (1, 600)))


@needs_vllm
@pytest.mark.vllm
def test_harness_on_vllm_answers_as_transformers(tmp_path):
    """RULER's needle task through lm-eval: the answers vLLM generates are transformers' own, and so the scores."""
    from hf_posenc.checkpoints.runtime import load_tokenizer
    from hf_posenc.eval.run_harness import run_harness

    folder = save_tiny(tmp_path / "smol", load_tokenizer("smollm2-135m"), context=1024)
    common = dict(model=folder, methods=["none"], tasks=["niah_single_1"], lengths=[512], limit=2, max_gen_tokens=12,
                  progress=False)
    ref, got = run_harness(**common), run_harness(**common, engine="vllm", engine_python=vllm_python())
    want, have = (r["results"]["none"]["outputs"]["niah_single_1"]["512"] for r in (ref, got))
    assert [a["output"] for a in have] == [a["output"] for a in want] and len(have) == 2
    assert got["results"]["none"]["scores"] == ref["results"]["none"]["scores"]


@needs_vllm
@pytest.mark.vllm
def test_data_parallel_engines_share_the_cells_and_give_the_single_engine_numbers(folders, tmp_path):
    """--data-parallel-size 2: the command relaunches itself under torchrun, each process with an engine of its own
    (the launcher's variables kept from it); the report is the transformers engine's within 1e-3, written once."""
    argv = ["eval", "ppl", "--model", folders["plain"], "--methods", "none", "--lengths", "100,200", "--max-windows",
            "2", "--corpus", "python-docs", "--limit", "1", "--no-progress", "--no-plots", "--no-truncated-baseline"]
    assert main(argv + ["--output", str(tmp_path / "one")]) == 0
    assert main(argv + ["--engine", "vllm", "--engine-python", vllm_python(), "--data-parallel-size", "2",
                        "--output", str(tmp_path / "two")]) == 0
    one, two = (json.loads((tmp_path / d / "perplexity.json").read_text()) for d in ("one", "two"))
    for n in ("100", "200"):
        assert two["results"]["none"][n]["ppl"] == pytest.approx(one["results"]["none"][n]["ppl"], rel=1e-3)
    assert two["setup"]["processes"] == 2 and two["setup"]["engine"]["name"] == "vllm"


@needs_vllm
@pytest.mark.vllm
def test_allow_long_starts_the_engine_past_the_stated_context(folders):
    """--allow-long: vLLM made to take 400 tokens of a plain 256-token checkpoint (what it computes past its rotary
    table is undefined: it varies from run to run, so only the comparison is asserted to be made there)."""
    report = serve_check(folders["plain"], EngineSettings(python=vllm_python(), allow_long=True),
                         CheckSettings([100, 400]), docs=prose(), progress=False)
    assert report["setup"]["engine_max_model_len"] == 401 and "forced past config.json" in report["table"]
    assert report["results"]["100"]["verdict"] == "same"
    assert report["results"]["400"]["verdict"] in ("same", "differs") and "relative_diff" in report["results"]["400"]


LONG_FACTOR = [1.0] * 8 + [1.5] * 8 + [2.0] * 16  # one per rotary pair of head dim 64: a searched-like longrope


@pytest.fixture(scope="module")
def longrope_folder(tmp_path_factory, bert_tokenizer):
    """A longrope over L with its own temperature (attention_factor 1.0, where vLLM would derive 1.06)."""
    return save_tiny(tmp_path_factory.mktemp("longrope"), bert_tokenizer, "longrope", factor=2.0,
                     short_factor=[1.0] * 32, long_factor=LONG_FACTOR, attention_factor=1.0)


def test_a_longrope_is_saved_with_the_temperature_vllm_reads_and_serve_config_says_which_inputs_it_matches(
        longrope_folder, tmp_path):
    from hf_posenc.serving.launch_settings import serve_config

    rope = json.loads(open(os.path.join(longrope_folder, "config.json")).read())["rope_parameters"]
    assert rope["short_mscale"] == rope["long_mscale"] == rope["attention_factor"] == 1.0
    (short,) = serve_config(longrope_folder, ["vllm"], max_length=L)
    assert short.computes == "same" and short.python["max_model_len"] == L
    (long,) = serve_config(longrope_folder, ["vllm"])
    assert long.computes == "past_original" and long.python["max_model_len"] == 2 * L
    assert f"the same as hf_posenc for inputs longer than {L} tokens" in long.reason
    bare = tmp_path / "bare"  # the same config without the mscale keys: vLLM would derive another temperature
    bare.mkdir()
    config = json.loads(open(os.path.join(longrope_folder, "config.json")).read())
    for key in ("short_mscale", "long_mscale"):
        del config["rope_parameters"][key]
    (bare / "config.json").write_text(json.dumps(config))
    (cannot,) = serve_config(str(bare), ["vllm"])
    assert cannot.computes == "cannot" and "temperature 1.0" in cannot.reason and "attention_factor" in cannot.reason


def test_serve_check_reports_what_serve_config_says_an_engine_cannot_compute_without_starting_it(
        longrope_folder, tmp_path):
    """A longrope with two lists on llama.cpp (a GGUF holds one), and one without the mscale keys on vLLM (it would
    derive another temperature): 'not computable', serve-config's reason, no engine started (neither exists here);
    --confirm-refusal still goes on to start it (and so needs it)."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in os.listdir(longrope_folder):
        if name != "config.json":
            os.symlink(os.path.join(longrope_folder, name), bare / name)
    config = json.loads(open(os.path.join(longrope_folder, "config.json")).read())
    for key in ("short_mscale", "long_mscale"):
        del config["rope_parameters"][key]
    (bare / "config.json").write_text(json.dumps(config))
    cases = [(longrope_folder, EngineSettings("llama.cpp"), "--freeze-at"),
             (str(bare), EngineSettings(python="/nowhere/python"), "attention_factor")]
    for i, (folder, engine, named) in enumerate(cases):
        report = serve_check(folder, engine, CheckSettings([100, 400]), output=str(tmp_path / f"report{i}"))
        assert report["setup"]["engine_started"] is False
        for r in report["results"].values():
            assert r["verdict"] == "not computable" and "cannot" in r["reason"] and named in r["reason"], r
    with pytest.raises(ValueError, match="nowhere"):
        serve_check(str(bare), EngineSettings(python="/nowhere/python"), CheckSettings([100], confirm_refusal=True))


@needs_vllm
@pytest.mark.vllm
def test_serve_check_of_a_longrope_with_its_own_temperature(longrope_folder, tmp_path):
    """vLLM takes the long factors for every input when --max-model-len is past L (the same past L, not below), the
    short ones when it is L (the same below L)."""
    past = serve_check(longrope_folder, EngineSettings(python=vllm_python()), CheckSettings([100, 400]),
                       docs=prose(), progress=False)
    assert past["setup"]["engine_max_model_len"] == 2 * L
    assert past["results"]["400"]["verdict"] == "same", past["results"]["400"]
    short = serve_check(longrope_folder, EngineSettings(python=vllm_python(), args={"max_model_len": L}),
                        CheckSettings([100]), docs=prose(), progress=False)
    assert short["results"]["100"]["verdict"] == "same", short["results"]["100"]
    assert f"maximum model length {L}, as --engine-arg max_model_len gave it" in short["table"]
    # at 100 tokens the engine launched past L computes the long factors (random weights barely feel them: the
    # mean NLL moves by ~3e-6, still within serve-check's 1e-3), the one launched at L the short ones hf_posenc takes
    long_at_100, short_at_100 = past["results"]["100"], short["results"]["100"]
    assert long_at_100["max_token_diff"] > 30 * short_at_100["max_token_diff"], (long_at_100, short_at_100)


def test_the_engine_gets_an_hour_per_model_step_unless_the_user_set_it(monkeypatch):
    """vLLM's own 300 s per model step ends a long CPU prefill (SmolLM2 at 24,576 tokens on 2 cores); a value the user
    set is kept, and a launcher's rank variables are not passed on."""
    from hf_posenc.engines.vllm_engine import engine_env

    monkeypatch.delenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", raising=False)
    monkeypatch.setenv("RANK", "3")
    env = engine_env()
    assert env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "3600" and "RANK" not in env
    monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "20")
    assert engine_env(["1"]) == {**engine_env(), "CUDA_VISIBLE_DEVICES": "1"}
    assert engine_env()["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "20"


def test_a_config_serve_config_cannot_read_is_left_to_the_engine_not_a_traceback(tmp_path):
    """A composite config whose text part leaves its head count out (a default): serve-config cannot judge it, so
    serve-check goes on to the engine (here: none installed, said by name) instead of failing inside the pre-check."""
    folder = tmp_path / "llava"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": {
        "model_type": "llama", "hidden_size": 2048, "max_position_embeddings": 4096}}))
    from hf_posenc.serving.check import _engine_cannot, read_block

    plain, block = read_block(str(folder))
    assert _engine_cannot(str(folder), "vllm", plain, block) is None
    with pytest.raises(ValueError, match="/nowhere/python. is not an executable file"):
        serve_check(str(folder), EngineSettings(python="/nowhere/python"), CheckSettings([100]))


def test_the_cpu_kv_cache_counts_each_layer_at_its_own_width(tmp_path):
    """Gemma 4's full-attention layers are twice as wide as its sliding ones (``per_layer_config``): the KV cache the
    CPU engine is given counts them at their own width, not the top-level ``head_dim``."""
    from transformers import AutoConfig

    from hf_posenc.engines.vllm_worker import _cpu_kv_bytes

    cfg = AutoConfig.for_model("gemma4_text", hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=32, global_head_dim=64, num_global_key_value_heads=2,
                               attention_k_eq_v=True, layer_types=["sliding_attention"] * 3 + ["full_attention"],
                               max_position_embeddings=4096)
    cfg.save_pretrained(tmp_path)
    per_token = 2 * (3 * 1 * 32 + 1 * 2 * 64)  # keys and values of three sliding layers and one full one
    length = 1 << 20  # long enough that the 256 MiB floor does not hide the count
    assert _cpu_kv_bytes(str(tmp_path), length, "float32") == 2 * per_token * 4 * length + (64 << 20)
