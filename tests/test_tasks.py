"""The eval-task registry: the built-in tasks are what the CLI, the card and tune iterate; names, reports and
``patch --eval`` arguments are checked. (A task defined in one file, run by ``hf-posenc eval``, resumed, run by
``hf-posenc patch --eval`` and put into the card: tests/test_extending.py.)"""

from __future__ import annotations

import pytest

from hf_posenc.eval.tasks import Objective, get_task, parse_evals, register_task, registered, task_of_report
from test_extending import PREFIX, prefix_task  # noqa: E402,F401  (the eval task defined in one file)


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
