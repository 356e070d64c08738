"""``--original-context N`` (``original_context=N``): the context L an evaluation measures past and truncates to,
given instead of read from the model. For a checkpoint fine-tuned at its scaled context (SmolLM2 with YaRN x2 trained
at 16,384) the model's own L is the scaling's pretraining one (8,192, what finetune and older numbers measure past);
given its trained context, eval measures what a further extension adds past *that*, beside the checkpoint as it is
truncated there (its own scaling kept, not the weights without it)."""

from __future__ import annotations

import json

import pytest
from helpers import ORIGINAL, tiny_model

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.eval.run_passkey import run_passkey
from hf_posenc.eval.run_ppl import run_perplexity
from hf_posenc.io.documents import Document

CONTEXT = 2 * ORIGINAL  # what the saved YaRN x2 checkpoint advertises (the context it was "trained" at)
LENGTH = CONTEXT + 32
TEXT = " ".join(f"line {i} of a document that is long enough for several windows." for i in range(200))


@pytest.fixture
def checkpoint(tmp_path, bert_tokenizer):
    model = hf_posenc.patch(tiny_model("llama", vocab_size=bert_tokenizer.vocab_size), "yarn", factor=2.0)
    model.save_pretrained(tmp_path / "ckpt")
    bert_tokenizer.save_pretrained(tmp_path / "ckpt")
    return str(tmp_path / "ckpt"), str(hf_posenc.get_config(model))


def ppl(folder: str, out, *extra: str) -> dict:
    assert main(["eval", "ppl", "--model", folder, "--lengths", str(LENGTH), "--corpus", "python-docs", "--limit", "1",
                 "--max-windows", "1", "--no-progress", "--no-plots", "--output", str(out), *extra]) == 0
    return json.loads((out / "perplexity.json").read_text())


def test_eval_ppl_measures_past_the_given_context_beside_the_checkpoint_truncated_there(checkpoint, tmp_path, capsys):
    folder, own = checkpoint
    report = ppl(folder, tmp_path / "given", "--original-context", str(CONTEXT), "--methods", "none",
                 "--variant", "composed=yarn:factor=1.5", "--variant", f"checkpoint={own}")
    setup, results = report["setup"], report["results"]
    assert setup["original_context"] == CONTEXT and setup["original_context_given"] is True
    assert setup["model_original_context"] == ORIGINAL  # what the model says, kept beside
    base = setup["truncated_baseline"]
    assert base["label"] == f"checkpoint-truncated-{CONTEXT}-stride-{CONTEXT // 4}" and base["context"] == CONTEXT
    assert base["config"]["method"] == "yarn" and base["config"]["factor"] == 2.0  # the checkpoint as it is
    for label in ("none", "composed", "checkpoint", base["label"]):
        assert results[label][str(LENGTH)]["past_original"]["from"] == CONTEXT
    gain = results["composed"][str(LENGTH)]["context_gain"]
    assert gain == pytest.approx(results[base["label"]][str(LENGTH)]["past_original"]["ppl"]
                                 / results["composed"][str(LENGTH)]["past_original"]["ppl"])
    assert "the checkpoint as it is (its own yarn scaling)" in (tmp_path / "given" / "perplexity.md").read_text()
    assert json.loads((tmp_path / "given" / "cells.jsonl").read_text().splitlines()[0])["fingerprint"][
        "original_context"] == CONTEXT
    # the same run without the flag measures past the model's own L, beside the unpatched model truncated there
    plain = ppl(folder, tmp_path / "own", "--methods", "none", "--variant", f"checkpoint={own}")
    assert plain["setup"]["original_context"] == ORIGINAL and "original_context_given" not in plain["setup"]
    assert plain["setup"]["truncated_baseline"]["label"].startswith(f"none-truncated-{ORIGINAL}-")
    assert plain["results"]["checkpoint"][str(LENGTH)]["ppl"] == pytest.approx(
        results["checkpoint"][str(LENGTH)]["ppl"])  # the whole-window number does not depend on L
    # cells measured past one L are not resumed by a run measuring past another
    capsys.readouterr()
    assert main(["eval", "ppl", "--model", folder, "--lengths", str(LENGTH), "--corpus", "python-docs", "--limit", "1",
                 "--max-windows", "1", "--no-progress", "--no-plots", "--output", str(tmp_path / "given"),
                 "--methods", "none", "--variant", "composed=yarn:factor=1.5", "--variant", f"checkpoint={own}"]) != 0
    assert "cells of another setup (original_context: 128 -> '<absent>')" in capsys.readouterr().err


def test_on_a_model_without_a_saved_scaling_the_baseline_stays_the_unpatched_model(tiny_checkpoint, tmp_path):
    report = run_perplexity(model=tiny_checkpoint, methods=["none", "yarn"], factor=2.0, lengths=[40],
                            original_context=32, docs=[Document("lines", TEXT)], max_windows=1, progress=False,
                            plots=False)
    setup = report["setup"]
    assert setup["original_context"] == 32 and setup["model_original_context"] == ORIGINAL
    assert setup["truncated_baseline"]["label"] == "none-truncated-32-stride-8"
    assert report["results"]["yarn"]["40"]["past_original"]["from"] == 32


def test_eval_passkey_counts_beyond_the_given_context(tiny_checkpoint):
    report = run_passkey(model=tiny_checkpoint, methods=["none"], lengths=[96], depths=[0.1, 0.9], trials=1,
                         original_context=48, progress=False, plots=False)
    assert report["setup"]["original_context"] == 48
    assert "original context 48" in report["table"] and "96: beyond L" in report["table"]


@pytest.mark.parametrize("value", [0, -3, True, 2.5, "16k"])
def test_a_bad_original_context_is_refused_by_name_before_the_model_loads(value):
    with pytest.raises(ValueError, match=r"original_context \(--original-context\).*positive whole number.*got"):
        run_perplexity(model="/no/such/model", original_context=value, lengths=[40])


def test_the_flag_is_documented_and_checked_on_the_command_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "ppl", "--original-context", "0"])
    assert exit_info.value.code == 2 and "--original-context" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "passkey", "--help"])
    assert "--original-context TOKENS" in capsys.readouterr().out
