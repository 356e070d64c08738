"""lm-evaluation-harness on patched models: RULER tasks per length, resumable, shared between processes, and
into the model card's model-index."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from helpers import load_real, only_names_a_fresh_folder_is_checked_for, refused, tiny_config
from test_eval_scale import _launch
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.eval import harness
from hf_posenc.eval.run_harness import harness_table
from hf_posenc.publishing.card import eval_results

TASK = ["--tasks", "niah_single_1", "--lengths", "512", "--limit", "2", "--max-gen-tokens", "12"]


@pytest.fixture(scope="module")
def smol_tokenizer():
    from hf_posenc.checkpoints.runtime import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def tiny_smol(tmp_path_factory, smol_tokenizer):
    """A tiny random llama with SmolLM2's tokenizer and a 1024-token context: fast enough to generate on CPU."""
    out = tmp_path_factory.mktemp("tiny-smol")
    torch.manual_seed(0)
    cfg = tiny_config("llama", vocab_size=len(smol_tokenizer), max_position_embeddings=1024,
                      bos_token_id=smol_tokenizer.bos_token_id, eos_token_id=smol_tokenizer.eos_token_id)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    smol_tokenizer.save_pretrained(out)
    return str(out)


def test_effective_length_is_the_longest_length_before_the_first_failure():
    assert harness.effective_length({4096: 0.95, 8192: 0.9, 16384: 0.5}) == 8192
    assert harness.effective_length({4096: 0.95, 8192: 0.5, 16384: 0.9}) == 4096  # a pass after a failure: no
    assert harness.effective_length({4096: 0.8}) is None
    assert harness.effective_length({4096: 0.8}, threshold=0.5) == 4096
    assert harness.effective_length({8192: 0.856, 4096: 0.9}) == 8192  # the threshold itself passes; order free


def _cell(scores, metric):
    return {"scores": scores, "metrics": {t: metric for t in scores}, "samples": {t: 3 for t in scores},
            "outputs": {t: [] for t in scores}}


def test_aggregate_averages_tasks_per_length_and_the_table_and_card_show_them():
    cells = [("niah_single_1", 512, _cell({"niah_single_1": 1.0}, "512")), ("vt", 512, _cell({"vt": 0.8}, "512")),
             ("niah_single_1", 1024, _cell({"niah_single_1": 0.5}, "1024")), ("vt", 1024, _cell({"vt": 0.2}, "1024"))]
    res = harness.aggregate_harness([512, 1024], cells)
    assert res["mean"] == {"512": pytest.approx(0.9), "1024": pytest.approx(0.35)}
    assert res["effective_length"] == 512 and res["scores"]["vt"] == {"512": 0.8, "1024": 0.2}
    report = {"task": "harness", "results": {"yarn": res}, "setup": {
        "lengths": [512, 1024], "limit": 3, "lm_eval": "0.4.13", "model": "m", "original_context": 512,
        "threshold": 0.856}}
    table = harness_table(report)
    assert "| yarn | vt | 80.0 | 20.0 |  |" in table and "| yarn | **mean** | 90.0 | 35.0 | 512 |" in table
    entries = {(e.task_name, e.metric_config): e.metric_value for e in eval_results([report], "yarn")}
    assert entries == {("lm-eval niah_single_1", "512"): 1.0, ("lm-eval niah_single_1", "1024"): 0.5,
                       ("lm-eval vt", "512"): 0.8, ("lm-eval vt", "1024"): 0.2}


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "niah_singel_1"], "lm-eval has no task, group or tag 'niah_singel_1'. Did you mean niah_single_1"),
    (["--lengths", "128"], "harness lengths must be >= 256 tokens"),
    (["--threshold", "1.5"], "--threshold is a mean score in (0, 1], got 1.5"),
    (["--tasks", "vt", "--lengths", "512"], "ruler_vt builds its prompts for lengths of 1024 tokens and more"),
])
def test_bad_harness_input_is_refused_before_the_model_loads(extra, message, capsys, tmp_path):
    err = refused(["eval", "harness", "--model", str(tmp_path / "never-loaded"), *extra], capsys)
    assert message in err and "Traceback" not in err


def test_a_missing_lm_eval_names_the_extra_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what an install without the extra looks like
    err = refused(["eval", "harness", "--model", str(tmp_path)], capsys)
    assert "pip install 'hf_posenc[harness]'" in err
    err = refused(["patch", "--method", "yarn", "--factor", "2", "--eval", "harness:vt",
                   "--output", str(tmp_path / "o")], capsys)
    assert "pip install 'hf_posenc[harness]'" in err and not (tmp_path / "o").exists()


def test_a_tokenizer_without_an_end_token_isrefused(tiny_checkpoint, capsys):
    err = refused(["eval", "harness", "--model", tiny_checkpoint, *TASK], capsys)  # a BERT tokenizer
    assert "has none (an encoder's?)" in err and "Traceback" not in err


def test_patch_refuses_an_empty_or_unknown_harness_task(capsys, tmp_path):
    err = refused(["patch", "--method", "yarn", "--factor", "2", "--eval", "harness:",
                   "--output", str(tmp_path / "o")], capsys)
    assert "harness:TASK" in err and "got 'harness:'" in err
    err = refused(["patch", "--method", "yarn", "--factor", "2", "--eval", "harness:nosuch_task",
                   "--output", str(tmp_path / "o")], capsys)
    assert "lm-eval has no task, group or tag 'nosuch_task'" in err


def _stable(report):
    return {label: {k: r[k] for k in ("scores", "mean", "samples", "outputs", "effective_length")}
            for label, r in report["results"].items()}


def test_eval_harness_runs_ruler_per_variant_and_resumes(tiny_smol, tmp_path, capsys, monkeypatch):
    from hf_posenc.eval import run_harness

    seen, cell = [], run_harness.harness_cell
    monkeypatch.setattr(run_harness, "harness_cell", lambda lm, *a, **k: seen.append(
        hf_posenc.get_config(lm).method if hf_posenc.get_config(lm) else None) or cell(lm, *a, **k))
    out = tmp_path / "run"
    argv = ["eval", "harness", "--model", tiny_smol, "--methods", "none", "--variant", "se=self_extend:group_size=2,"
            "window=128", "--no-progress", "--output", str(out), *TASK]
    assert main(argv) == 0
    first = json.loads((out / "harness.json").read_text())
    assert set(first["results"]) == {"none", "se"} and (out / "harness_vs_length.png").exists()
    only_names_a_fresh_folder_is_checked_for(out)
    for r in first["results"].values():
        assert r["samples"]["niah_single_1"]["512"] == 2
        assert 0.0 <= r["scores"]["niah_single_1"]["512"] <= 1.0
        answers = r["outputs"]["niah_single_1"]["512"]
        assert len(answers) == 2 and all(len(a["target"]) == 1 and a["target"][0].isdigit() for a in answers)
        # the score is the share of expected numbers found in the model's answer (RULER's string_match_all)
        found = [float(a["target"][0] in a["output"]) for a in answers]
        assert r["scores"]["niah_single_1"]["512"] == pytest.approx(sum(found) / 2)
    assert seen == ["none", "self_extend"]  # lm-eval was handed each variant's patched model
    capsys.readouterr()
    assert main(argv) == 0
    assert "resumed 2 of 2 cells" in capsys.readouterr().err and len(seen) == 2  # nothing computed again
    assert _stable(json.loads((out / "harness.json").read_text())) == _stable(first)


def test_two_processes_share_the_harness_cells_and_agree_with_one(tiny_smol, tmp_path):
    argv = ["eval", "harness", "--model", tiny_smol, "--methods", "none,yarn", "--factor", "2", "--no-progress",
            "--no-plots", *TASK]
    assert main(argv + ["--output", str(tmp_path / "one")]) == 0
    res = _launch(["torch.distributed.run", "--nproc_per_node", "2"], argv + ["--output", str(tmp_path / "two")])
    assert res.returncode == 0, res.stderr[-3000:]
    one = json.loads((tmp_path / "one" / "harness.json").read_text())
    two = json.loads((tmp_path / "two" / "harness.json").read_text())
    assert two["setup"]["processes"] == 2 and _stable(two) == _stable(one)
    cells = [json.loads(x) for x in (tmp_path / "two" / "cells.jsonl").read_text().splitlines()[1:]]
    assert sorted(c["variant"] for c in cells) == ["none", "yarn"]  # each cell once


@pytest.mark.real_model
def test_smollm2_finds_the_ruler_needle_and_a_random_model_does_not(smol_tokenizer, tiny_smol):
    model, tok = load_real("smollm2-135m")
    patched = hf_posenc.patch(model, "dca")  # a method plain transformers cannot run
    got = harness.evaluate(patched, tok, ["niah_single_1"], [512], limit=2, max_gen_tokens=12)
    assert got["scores"]["niah_single_1"]["512"] == 1.0 and got["effective_length"] == 512
    random_lm = AutoModelForCausalLM.from_pretrained(tiny_smol).eval()
    got = harness.evaluate(random_lm, smol_tokenizer, ["niah_single_1"], [512], limit=2, max_gen_tokens=12)
    assert got["scores"]["niah_single_1"]["512"] == 0.0 and got["effective_length"] is None


@pytest.mark.real_model
def test_patch_puts_harness_scores_into_the_model_index(tmp_path, capsys):
    out = tmp_path / "patched"
    assert main(["patch", "--method", "yarn", "--factor", "2", "--eval", "harness:niah_single_1", "--harness-lengths",
                 "512", "--harness-limit", "2", "--max-gen-tokens", "12", "--no-progress", "--output", str(out)]) == 0
    card = (out / "README.md").read_text()
    assert "name: lm-eval niah_single_1" in card and "name: niah_single_1 @ 512 tokens" in card
    assert "## lm-evaluation-harness (RULER)" in card
    report = json.loads((out / "hf_posenc_eval" / "harness.json").read_text())
    assert report["results"]["yarn"]["scores"]["niah_single_1"]["512"] == 1.0
