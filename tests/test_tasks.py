"""The eval-task registry: the built-in tasks are what the CLI, the card and tune iterate; names, reports and
``patch --eval`` arguments are checked. (A task defined in one file, run by ``hf-posenc eval``, resumed, run by
``hf-posenc patch --eval`` and put into the card: tests/test_extending.py.)"""

from __future__ import annotations

import pytest
from test_extending import PREFIX, prefix_task  # noqa: E402,F401  (the eval task defined in one file)

from hf_posenc.eval.tasks import Objective, get_task, parse_evals, register_task, registered, task_of_report


def test_the_builtin_tasks_are_registered_once_and_iterated():
    tasks = registered()
    assert list(tasks)[:4] == ["ppl", "passkey", "retrieval", "harness"]
    assert {t.report for t in tasks.values()} >= {"perplexity", "passkey", "retrieval", "harness"}
    assert task_of_report("perplexity") is tasks["ppl"] and task_of_report("tune") is None
    assert [(t.name, a) for t, a in parse_evals(["ppl", "harness:vt", "passkey", "harness:cwe"])] == [
        ("ppl", []), ("harness", ["ruler_vt", "ruler_cwe"]), ("passkey", [])]
    from hf_posenc.tuning.objective import objectives

    assert objectives() == {"ppl": Objective("ppl_beyond", False), "passkey": Objective("passkey", True),
                            "needle_ppl": Objective("needle_ppl", False)}  # tune's own, after the tasks'


@pytest.mark.parametrize("evals, said", [(["bleu"], "got 'bleu'"), (["ppl:x"], "got 'ppl:x'"),
                                         (["harness"], "got 'harness'"), (["harness:"], "got 'harness:'")])
def test_patch_eval_names_are_checked(evals, said):
    with pytest.raises(ValueError, match="--eval takes ppl, passkey, retrieval, harness:TASK") as err:
        parse_evals(evals)
    assert said in str(err.value)


def test_registration_refuses_a_second_task_of_the_same_name_or_report(prefix_task):  # noqa: F811  (the fixture)
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
    """The card's numbers per task, as the records give them: needles in text are named as such, with their
    documents."""
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


def test_a_task_parameter_may_not_take_a_shared_or_data_flag_name_and_the_lists_stay_in_step():
    """A Params field named like a shared flag (--variant) or, beside documents, like a data flag (--limit) would
    break every command's parser: refused when the record is made (a plugin is then skipped, not fatal)."""
    from dataclasses import dataclass

    from hf_posenc.cli import build_parser
    from hf_posenc.eval.params import documents
    from hf_posenc.eval.settings import FLAG_ONLY, KEYWORDS
    from hf_posenc.eval.tasks import EvalTask

    @dataclass(frozen=True)
    class Variant:
        variant: str = "x"

    @dataclass(frozen=True)
    class Limited:
        docs: object = documents()
        limit: int = 3

    @dataclass(frozen=True)
    class Harnessy:  # a task without documents may have a 'limit' of its own (harness does)
        limit: int = 3

    with pytest.raises(ValueError, match=r"parameter\(s\) \['variant'\] are the run's own"):
        EvalTask(name="v", report="v", summary="s", title="t", params=Variant, run=lambda s, p: {})
    with pytest.raises(ValueError, match=r"parameter\(s\) \['limit'\] are flags of its documents"):
        EvalTask(name="l", report="l", summary="s", title="t", params=Limited, run=lambda s, p: {})
    EvalTask(name="h", report="h", summary="s", title="t", params=Harnessy, run=lambda s, p: {})
    args = build_parser().parse_args(["eval", "ppl"])  # every dest of the shared flags is a keyword or FLAG_ONLY
    own = {f for f in vars(args)} - {f.name for f in __import__("dataclasses").fields(get_task("ppl").params)}
    data = {"text_file", "text_dir", "dataset", "dataset_config", "split", "column", "encoding", "corpus", "limit"}
    assert own - data - set(KEYWORDS) - set(FLAG_ONLY) == set(), own - data - set(KEYWORDS) - set(FLAG_ONLY)


def test_the_python_api_checks_what_the_flags_check_before_anything_loads():
    from hf_posenc.eval.run_passkey import run_passkey
    from hf_posenc.eval.run_ppl import run_perplexity

    nowhere = dict(model="/nonexistent/model", methods=["none"], lengths=[64])
    for knob, value in (("buckets", 0), ("chunk_size", 0), ("stride", 0), ("max_windows", 0), ("truncated_stride", 0)):
        with pytest.raises(ValueError, match=f"--{knob.replace('_', '-')} must be an integer >= 1, got 0"):
            run_perplexity(**nowhere, **{knob: value})
    with pytest.raises(ValueError, match="docs must be Documents .* got str"):
        run_perplexity(**nowhere, docs=["some text"])
    with pytest.raises(ValueError, match="got unknown keyword\\(s\\) modle; it takes lengths, .* and the run's model"):
        run_perplexity(modle="x", lengths=[64])
    with pytest.raises(ValueError, match="--filler is empty"):
        run_passkey(model="/nonexistent/model", lengths=[64], depths=[0.5], filler=" ")


def test_help_shows_each_default_once(capsys):
    from hf_posenc.cli import main

    for argv in (["eval", "ppl", "--help"], ["eval", "harness", "--help"], ["patch", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        shown = " ".join(capsys.readouterr().out.split())
        assert "(default: None)" not in shown
        if argv[1] == "harness":
            assert "(default: niah_single_1,niah_multikey_2,ruler_vt,ruler_cwe)" in shown
        if argv[1] == "ppl":
            assert "one (default: 2)." in shown and "--key-alpha KEY_ALPHA" in shown
