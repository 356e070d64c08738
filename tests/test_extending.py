"""Extending hf_posenc is one file and one test each (docs/contributing.md); the files are in
``tests/extension_plugins/``, written as a plugin would write them, through public registration only:

- a RoPE scaling is one record (``sqrt_pi_scaling.py``: its frequency function and its MethodSpec with the tune
  grid, what the engines compute, its GGUF and freezing facts), run through everything that reads the record: patch,
  save and load, tune's grid, the serving table of the card, hf-posenc methods, hf-posenc eval, the GGUF writer,
  --freeze-at and context parallelism;
- an eval task is one Params dataclass, one runner and one EvalTask record (``prefix_task.py``), run through
  hf-posenc eval (its flags made from the Params fields, resumed from its cells), the Python API, hf-posenc patch
  --eval and the model card;
- an engine is one launcher and one Engine record (``echo_engine.py``), run through serve-config and the card."""

import json

import pytest
from extension_plugins import sqrt_pi_scaling as scaling_plugin
from extension_plugins.echo_engine import ECHO
from extension_plugins.prefix_task import PREFIX
from extension_plugins.sqrt_pi_scaling import GROW, NAME
from helpers import ORIGINAL, ids, logits, refused, tiny_model

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.eval.tasks import register_task, unregister_task
from hf_posenc.methods import _ALIASES, METHODS, EngineSupport
from hf_posenc.methods import rope as rope_records


@pytest.fixture
def sqrt_pi():
    """The plugin's scalings, registered for the test and removed after it (the registry is global)."""
    scaling_plugin.register()
    yield METHODS[NAME]
    scaling_plugin.unregister()
    assert NAME not in METHODS and NAME not in _ALIASES and NAME not in rope_records.SCALINGS


def test_a_new_rope_scaling_is_one_record_that_everything_reads(sqrt_pi, tmp_path, tiny_checkpoint, capsys):
    from hf_posenc.cli import main
    from hf_posenc.serving.support import known_status, vllm_refusal
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
    assert listed["families"] == ["llama", "qwen2", "qwen3", "mistral", "gemma3_text"]  # not the census's families:
    # it never ran this method

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


# -- an eval task in one file ------------------------------------------------------------------------------------
@pytest.fixture
def prefix_task():
    register_task(PREFIX)
    yield PREFIX
    unregister_task(PREFIX.name)


def test_a_task_in_one_file_runs_in_eval_resumes_and_goes_into_patch_and_the_card(prefix_task, tiny_checkpoint,
                                                                                 tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "prefix_nll", "--help"])
    shown = capsys.readouterr().out  # its flags, made from the Params fields, with their defaults
    assert "--lengths LENGTHS" in shown and "prefix lengths in tokens. (default: 16,32)" in shown
    assert "expected comma-separated integers, got 'x'" in refused(["eval", "prefix_nll", "--lengths", "x"], capsys)
    python = PREFIX(lengths=[16], model=tiny_checkpoint, methods=["none"], progress=False)  # the Python API
    assert set(python["results"]["none"]) == {"16"}
    with pytest.raises(ValueError,
                       match="eval task 'prefix_nll' got unknown keyword\\(s\\) length; it takes lengths, text"):
        PREFIX(length=[16], model=tiny_checkpoint)
    out = tmp_path / "eval"
    argv = ["eval", "prefix_nll", "--model", tiny_checkpoint, "--output", str(out), "--no-progress", "--no-plots"]
    assert main(argv) == 0
    report = json.loads((out / "prefix_nll.json").read_text())
    assert set(report["results"]) == {"none", "pi"} and set(report["results"]["none"]) == {"16", "32"}
    assert report["results"]["none"]["16"] != report["results"]["pi"]["16"]  # pi (factor 2) changes the positions
    assert report["setup"]["compute"]["cells"] == 4
    capsys.readouterr()
    assert main(argv) == 0
    assert "resumed 4 of 4 cells" in capsys.readouterr().err
    again = json.loads((out / "prefix_nll.json").read_text())
    assert again["results"] == report["results"]

    saved = tmp_path / "patched"
    assert main(["patch", "--model", tiny_checkpoint, "--method", "pi", "--factor", "2", "--output", str(saved),
                 "--eval", "prefix_nll", "--no-progress"]) == 0
    card = (saved / "README.md").read_text()
    assert "Prefix perplexity (test task)" in card and "prefix perplexity @ 16 tokens" in card
    patched = json.loads((saved / "hf_posenc_eval" / "prefix_nll.json").read_text())
    assert patched["results"]["pi"]["32"] == pytest.approx(report["results"]["pi"]["32"], rel=1e-6)


# -- a RoPE scaling's GGUF and freezing facts, in its record -----------------------------------------------------
def test_a_new_scaling_s_gguf_and_freezing_facts_are_read_from_its_record(sqrt_pi):
    from hf_posenc.config import PosEncConfig
    from hf_posenc.encodings.rope import RopeGeometry
    from hf_posenc.serving.freezing import check_freeze, freeze_config
    from hf_posenc.serving.gguf_file import llama_cpp_metadata, refusal
    from hf_posenc.training.parallel import check_context_parallel

    cfg = PosEncConfig(NAME, 4.0, 64)
    assert refusal(cfg, "llama") is None
    meta = llama_cpp_metadata(cfg, RopeGeometry(10000.0, 16, 64))
    assert meta["type"] == "linear" and meta["factor"] == 2.0 and meta["context"] == 256

    grow = PosEncConfig(GROW, 4.0, 64)
    assert "llama.cpp cannot compute" in refusal(grow, "llama")  # no gguf in its record
    assert freeze_config(grow, 256) == PosEncConfig("pi", 2.0, 64, {})
    with pytest.raises(ValueError, match="changes nothing up to the original context"):
        check_freeze(grow, 64)
    with pytest.raises(ValueError, match="its factor follows the length seen"):
        check_context_parallel(GROW, 2, 128, 2)


# -- an engine in one file ---------------------------------------------------------------------------------------
def test_a_new_engine_is_one_record_that_serve_config_and_the_card_read(tmp_path, tiny_checkpoint, capsys):
    from hf_posenc.engines.registry import ENGINES, Engine, register_engine, unregister_engine
    from hf_posenc.serving.launch_settings import serve_config
    from hf_posenc.serving.support import known_status

    register_engine(ECHO)
    try:
        with pytest.raises(ValueError, match="clashes with the registered 'echo'"):
            register_engine(Engine("echo", "Echo again"))
        saved = tmp_path / "patched"
        hf_posenc.patch(tiny_model("llama"), "pi", factor=2.0).save_pretrained(saved)
        (echo,) = serve_config(str(saved), ["echo"])
        assert echo.computes == "same" and echo.command == ["echo-serve", str(saved)]
        block = json.loads((saved / "config.json").read_text())["hf_posenc"]
        assert [r["engine"] for r in known_status(block)][-1] == "Echo"
        assert main(["serve-config", str(saved), "--engine", "echo"]) == 0
        assert "echo-serve" in capsys.readouterr().out
    finally:
        unregister_engine("echo")
    assert "echo" not in ENGINES
