"""The eval-task registry: a task defined in one place (here, in this file) is run by ``hf-posenc eval``, resumed from
its cells, run by ``hf-posenc patch --eval`` and put into the model card (section and model-index), without any
other file naming it; and the built-in tasks are what the CLI, the card and tune iterate."""

from __future__ import annotations

import json
import math

import pytest

from hf_posenc.cli import main
from hf_posenc.eval.cells import NUMBER
from hf_posenc.eval.common import Run
from hf_posenc.eval.report import markdown_table
from hf_posenc.eval.scoring import token_nll
from hf_posenc.eval.tasks import (EvalTask, Objective, get_task, parse_evals, per_length_entries, register_task,
                                  registered, task_of_report, unregister_task)

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def run_prefix_nll(*, lengths: list[int], text: str = TEXT, **run) -> dict:
    """The toy task: per length, the mean NLL of the first ``length`` tokens of ``text``, one cell per length."""
    with Run(**run) as job:
        _, tok, _ = job.load()
        ids = tok(text, return_tensors="pt").input_ids[0]
        if max(lengths) > len(ids):
            raise ValueError(f"--lengths: the text has {len(ids)} tokens, got {max(lengths)}")
        keys = [[n] for n in lengths]

        def compute(variant, key):
            model = job.model_for(variant, max(lengths))
            return {"nll": token_nll(model, ids[None, : key[0]])[0].mean().item()}

        done = job.cells("prefix_nll", {"text": text}, {v.label: keys for v in job.variants}, compute,
                         fields={"nll": NUMBER})
        results = {label: {str(k[0]): math.exp(c["nll"]) for k, c in zip(keys, cells)} for label, cells in done.items()}
        return job.report("prefix_nll", {"lengths": lengths}, results, prefix_table, None)


def prefix_table(report) -> str:
    lengths = report["setup"]["lengths"]
    rows = [[label, *(r[str(n)] for n in lengths)] for label, r in report["results"].items()]
    return "Prefix perplexity.\n\n" + markdown_table(["method", *(f"{n} tokens" for n in lengths)], rows)


def prefix_flags(p) -> None:
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[16, 32],
                   help="prefix lengths in tokens.")


PREFIX = EvalTask(
    name="prefix_nll", report="prefix_nll", summary="perplexity of the text's first tokens (a test task).",
    title="Prefix perplexity (test task)", run=run_prefix_nll, flags=prefix_flags,
    keywords=lambda args: dict(lengths=args.lengths), default_methods=("none", "pi"),
    model_index=per_length_entries(dict(task_type="text-generation", task_name="Prefix perplexity",
                                        dataset_type="text", dataset_name="fox", metric_type="perplexity"),
                                   "prefix perplexity @ {n} tokens", lambda res, n: res.get(n)),
    patch_keywords=lambda e: dict(lengths=[16, 32]))


@pytest.fixture
def prefix_task():
    register_task(PREFIX)
    yield PREFIX
    unregister_task(PREFIX.name)


def test_a_task_in_one_file_runs_in_eval_resumes_and_goes_into_patch_and_the_card(prefix_task, tiny_checkpoint,
                                                                                 tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "prefix_nll", "--help"])
    assert "prefix lengths in tokens" in capsys.readouterr().out
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


def test_the_builtin_tasks_are_registered_once_and_iterated():
    tasks = registered()
    assert list(tasks)[:4] == ["ppl", "passkey", "retrieval", "harness"]
    assert {t.report for t in tasks.values()} >= {"perplexity", "passkey", "retrieval", "harness"}
    assert task_of_report("perplexity") is tasks["ppl"] and task_of_report("tune") is None
    assert [(t.name, a) for t, a in parse_evals(["ppl", "harness:vt", "passkey", "harness:cwe"])] == [
        ("ppl", []), ("harness", ["ruler_vt", "ruler_cwe"]), ("passkey", [])]
    from hf_posenc.tuning.objective import objectives

    assert objectives() == {"ppl": Objective("ppl_beyond", False), "passkey": Objective("passkey", True)}


@pytest.mark.parametrize("evals, said", [(["bleu"], "got 'bleu'"), (["ppl:x"], "got 'ppl:x'"),
                                         (["harness"], "got 'harness'"), (["harness:"], "got 'harness:'")])
def test_patch_eval_names_are_checked(evals, said):
    with pytest.raises(ValueError, match="--eval takes ppl, passkey, retrieval, harness:TASK") as err:
        parse_evals(evals)
    assert said in str(err.value)


def test_registration_refuses_a_second_task_of_the_same_name_or_report(prefix_task):
    from dataclasses import replace

    with pytest.raises(ValueError, match="already registered"):
        register_task(replace(PREFIX, summary="another"))
    with pytest.raises(ValueError, match="writes reports of task 'prefix_nll', as 'prefix_nll' does"):
        register_task(replace(PREFIX, name="other"))
    with pytest.raises(ValueError, match="a word"):
        replace(PREFIX, name="no spaces")
    with pytest.raises(ValueError, match="unknown eval task 'nope'"):
        get_task("nope")


def test_model_index_entries_come_from_each_task_record():
    """The card's numbers per task, as the records give them: needles in text are named as such, with their documents."""
    passkey, ppl = get_task("passkey"), get_task("ppl")
    res = {"by_length": {"4096": 0.8, "8192": 0.4}}
    text = {"setup": {"lengths": [4096, 8192], "haystack": "text", "documents": ["pg84.txt"]}}
    filler = {"setup": {"lengths": [4096, 8192]}}
    (fields, name, value, n), _ = passkey.model_index(text, res)
    assert (fields["task_name"], fields["dataset_type"], fields["dataset_name"], name, value, n) == (
        "Needle in text", "needle-in-text", "pg84.txt", "needle-in-text accuracy @ 4096 tokens", 0.8, "4096")
    fields, name, _, _ = passkey.model_index(filler, res)[1]
    assert (fields["task_name"], fields["dataset_name"], name) == ("Passkey retrieval", "synthetic passkey retrieval",
                                                                  "passkey accuracy @ 8192 tokens")
    report = {"setup": {"lengths": [2048, 4096], "documents": ["a.txt", "b.txt", "c.txt", "d.txt"]}}
    entries = ppl.model_index(report, {"2048": {"ppl": 9.5}})  # a length without a number gives no entry
    assert [(e[0]["dataset_name"], e[1], e[2]) for e in entries] == [("a.txt, b.txt, c.txt and 1 more",
                                                                     "perplexity @ 2048 tokens", 9.5)]
