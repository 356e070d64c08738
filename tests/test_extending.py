"""Extending hf_posenc is one file and one test each (docs/contributing.md):

- a RoPE scaling is one record: this file writes one -- its frequency function and its MethodSpec with the tune grid
  and what the engines compute -- and runs it through everything that reads the record: patch, save and load, tune's
  grid, the serving table of the card, hf-posenc methods and hf-posenc eval;
- an eval task is one Params dataclass, one runner and one EvalTask record: this file writes one (prefix perplexity)
  and runs it through hf-posenc eval (its flags made from the Params fields, resumed from its cells), the Python
  API, hf-posenc patch --eval and the model card."""

import json
import math
from dataclasses import dataclass

import pytest
from helpers import ORIGINAL, ids, logits, refused, tiny_model

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.encodings.rope import default_inv_freq
from hf_posenc.eval.cells import NUMBER
from hf_posenc.eval.common import Run
from hf_posenc.eval.params import ints, param
from hf_posenc.eval.scoring import token_nll
from hf_posenc.eval.tasks import Defaults, EvalTask, PatchUse, per_length_entries, register_task, unregister_task
from hf_posenc.io.reports import markdown_table
from hf_posenc.methods import _ALIASES, METHODS, EngineSupport, MethodSpec, factor_grid, unregister_method
from hf_posenc.methods import rope as rope_records

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
    rope_records.register_scaling(spec, rope_records.RopeScaling(
        rope_sqrt_pi, native=lambda s, L, p, g: {"rope_type": "linear", "factor": math.sqrt(s)}))
    yield METHODS[NAME]
    unregister_method(NAME)
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
TEXT = "the quick brown fox jumps over the lazy dog. " * 40


@dataclass(frozen=True)
class PrefixParams:
    lengths: list[int] = param([16, 32], "prefix lengths in tokens.", read=ints)
    text: str = param(TEXT, "the text whose first tokens are scored.")


def run_prefix_nll(settings, params: PrefixParams) -> dict:
    """The toy task: per length, the mean NLL of the first ``length`` tokens of ``text``, one cell per length."""
    lengths = params.lengths
    with Run(settings) as job:
        _, tok, _ = job.load()
        ids = tok(params.text, return_tensors="pt").input_ids[0]
        if max(lengths) > len(ids):
            raise ValueError(f"--lengths: the text has {len(ids)} tokens, got {max(lengths)}")
        keys = [[n] for n in lengths]

        def compute(variant, key):
            model = job.model_for(variant, max(lengths))
            return {"nll": token_nll(model, ids[None, : key[0]])[0].mean().item()}

        done = job.cells("prefix_nll", {"text": params.text}, {v.label: keys for v in job.variants}, compute,
                         fields={"nll": NUMBER})
        results = {label: {str(k[0]): math.exp(c["nll"]) for k, c in zip(keys, cells)} for label, cells in done.items()}
        return job.report("prefix_nll", {"lengths": lengths}, results, prefix_table, None)


def prefix_table(report) -> str:
    lengths = report["setup"]["lengths"]
    rows = [[label, *(r[str(n)] for n in lengths)] for label, r in report["results"].items()]
    return "Prefix perplexity.\n\n" + markdown_table(["method", *(f"{n} tokens" for n in lengths)], rows)


PREFIX = EvalTask(
    name="prefix_nll", report="prefix_nll", summary="perplexity of the text's first tokens (a test task).",
    title="Prefix perplexity (test task)", params=PrefixParams, run=run_prefix_nll,
    defaults=Defaults(methods=("none", "pi")),
    model_index=per_length_entries(dict(task_type="text-generation", task_name="Prefix perplexity",
                                        dataset_type="text", dataset_name="fox", metric_type="perplexity"),
                                   "prefix perplexity @ {n} tokens", lambda res, n: res.get(n)),
    patch=PatchUse(lambda e: PrefixParams(lengths=[16, 32])))


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
@pytest.fixture
def sqrt_pi_facts():
    """sqrt_pi with its GGUF fact (llama.cpp's linear type by sqrt(factor)), and a length-dependent sibling whose
    record says how it freezes (PI by sqrt(length / L) at a length past L)."""
    spec = MethodSpec(NAME, "rope", "PI by the square root of the factor (a test's scaling).")
    rope_records.register_scaling(spec, rope_records.RopeScaling(
        rope_sqrt_pi, gguf=lambda s, L, p, g: ({"type": "linear", "factor": math.sqrt(s)}, None)))
    grow = MethodSpec(NAME + "_grow", "rope", "sqrt_pi by the length seen (a test's scaling).")
    rope_records.register_scaling(grow, rope_records.RopeScaling(
        rope_sqrt_pi, dynamic="grow", follows_length="its factor follows the length seen",
        freeze=lambda s, L, p, at: (math.sqrt(at / L), {}), freezes_to="pi", unchanged_within_original=lambda p: True))
    yield
    for name in (NAME, NAME + "_grow"):
        unregister_method(name)


def test_a_new_scaling_s_gguf_and_freezing_facts_are_read_from_its_record(sqrt_pi_facts):
    from hf_posenc.config import PosEncConfig
    from hf_posenc.encodings.rope import RopeGeometry
    from hf_posenc.serving.freezing import check_freeze, freeze_config
    from hf_posenc.serving.gguf_file import llama_cpp_metadata, refusal
    from hf_posenc.training.parallel import check_context_parallel

    cfg = PosEncConfig(NAME, 4.0, 64)
    assert refusal(cfg, "llama") is None
    meta = llama_cpp_metadata(cfg, RopeGeometry(10000.0, 16, 64))
    assert meta["type"] == "linear" and meta["factor"] == 2.0 and meta["context"] == 256

    grow = PosEncConfig(NAME + "_grow", 4.0, 64)
    assert "llama.cpp cannot compute" in refusal(grow, "llama")  # no gguf in its record
    assert freeze_config(grow, 256) == PosEncConfig("pi", 2.0, 64, {})
    with pytest.raises(ValueError, match="changes nothing up to the original context"):
        check_freeze(grow, 64)
    with pytest.raises(ValueError, match="its factor follows the length seen"):
        check_context_parallel(NAME + "_grow", 2, 128, 2)


# -- an engine in one file ---------------------------------------------------------------------------------------
def test_a_new_engine_is_one_record_that_serve_config_and_the_card_read(tmp_path, tiny_checkpoint, capsys):
    from hf_posenc.engines.launch import Launch
    from hf_posenc.engines.registry import ENGINES, Engine, register_engine, unregister_engine
    from hf_posenc.serving.launch_settings import serve_config
    from hf_posenc.serving.support import known_status

    def launch(served, length):
        return Launch("Echo", "same", f"echo serves {served.method} up to {length or served.context} tokens",
                      command=["echo-serve", served.path])

    register_engine(Engine("echo", "Echo", launch=launch))
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
