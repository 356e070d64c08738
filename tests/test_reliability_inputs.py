"""Reliability of the inputs: held-out text compared by content, the digest cache keyed so that a
rewritten file is hashed again, truncated weights, dataset columns and paths, and eval-task plugins that fail."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import time

import pytest
from helpers import refused, tiny_model

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.eval import tasks
from hf_posenc.io.documents import Document, builtin_corpus

STOP = "stop: the model load was reached"


@pytest.fixture
def stop_at_load(monkeypatch):
    """The model load raises a clean error: a run that gets there passed every input check."""
    import hf_posenc.checkpoints.loading as loading

    def stop(*a, **k):
        raise ValueError(STOP)

    monkeypatch.setattr(loading, "from_pretrained", stop)


def _words(doc: int, start: int, n: int) -> str:
    return " ".join(builtin_corpus()[doc].text.split()[start : start + n])


def _finetune(model, train: list, held: list, out, *extra) -> list[str]:
    argv = ["finetune", "--model", str(model), "--method", "yarn", "--factor", "2", "--output", str(out),
            "--no-progress", *extra]
    for path in train:
        argv += ["--text-file", str(path)]
    for path in held:
        argv += ["--eval-text-file", str(path)]
    return argv


# -- 6. held-out overlap by content, not by file name ------------------------------------------------------------
def test_the_training_text_under_another_name_is_refused_as_held_out(tiny_checkpoint, tmp_path, capsys, stop_at_load):
    text = _words(0, 0, 3000)
    (tmp_path / "train.txt").write_text(text)
    (tmp_path / "copy.txt").write_text("\n\n" + "  ".join(text.upper().split()) + "\n")  # other case and spacing
    err = refused(_finetune(tiny_checkpoint, [tmp_path / "train.txt"], [tmp_path / "copy.txt"], tmp_path / "o"),
                  capsys)
    assert "'copy.txt'" in err and "'train.txt'" in err and "100%" in err and "also in the training data" in err
    assert STOP not in err and not (tmp_path / "o").exists()


def test_another_text_of_the_same_file_name_is_accepted_as_held_out(tiny_checkpoint, tmp_path, capsys, stop_at_load):
    for folder, doc in (("a", 0), ("b", 1)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "book.txt").write_text(_words(doc, 0, 3000))
    err = refused(_finetune(tiny_checkpoint, [tmp_path / "a" / "book.txt"], [tmp_path / "b" / "book.txt"],
                            tmp_path / "o"), capsys)
    assert STOP in err


def test_a_passage_of_training_text_in_a_held_out_document_is_refused_with_its_share(tiny_checkpoint, tmp_path,
                                                                                     capsys, stop_at_load):
    (tmp_path / "train.txt").write_text(_words(0, 0, 5000))
    (tmp_path / "held.txt").write_text(_words(1, 0, 1500) + "\n" + _words(0, 2000, 1000))  # 40% copied
    err = refused(_finetune(tiny_checkpoint, [tmp_path / "train.txt"], [tmp_path / "held.txt"], tmp_path / "o"),
                  capsys)
    assert "'held.txt'" in err and "'train.txt'" in err
    share = int(err.split("'held.txt'")[1].split("%")[0].split()[-1])
    assert 35 <= share <= 45, err


def test_a_short_quotation_shared_with_training_is_not_an_overlap(tiny_checkpoint, tmp_path, capsys, stop_at_load):
    (tmp_path / "train.txt").write_text(_words(0, 0, 5000))
    (tmp_path / "held.txt").write_text(_words(1, 0, 3000) + "\n" + _words(0, 100, 40))  # one sentence quoted
    err = refused(_finetune(tiny_checkpoint, [tmp_path / "train.txt"], [tmp_path / "held.txt"], tmp_path / "o"),
                  capsys)
    assert STOP in err


def test_the_python_api_refuses_held_out_text_that_is_training_text(tiny_checkpoint, tmp_path, stop_at_load):
    from hf_posenc.training.finetune import finetune

    train = [Document("a", _words(2, 0, 2000)), Document("b", _words(0, 0, 2000))]
    with pytest.raises(ValueError, match=r"held-out document 'h'.*'b'"):
        finetune(model=tiny_checkpoint, config=hf_posenc.PosEncConfig("yarn", 2.0), train_docs=train,
                 eval_docs=[Document("h", _words(0, 500, 1000))], output=str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("keywords,message", [
    ({"train_docs": "a text"}, "train_docs must be a list of Documents .*got str"),
    ({"eval_docs": None}, "eval_docs must be a list of Documents .*got NoneType"),
    ({"eval_docs": ["a text"]}, "docs must be Documents .*got str"),
    ({"config": "yarn:factor=0.5"}, "factor"),
])
def test_the_python_api_refuses_what_is_not_documents_or_a_config_before_the_load(keywords, message, tiny_checkpoint,
                                                                                  tmp_path, stop_at_load):
    from hf_posenc.training.finetune import finetune

    given = {"model": tiny_checkpoint, "config": "yarn:factor=2", "train_docs": [Document("a", _words(2, 0, 200))],
             "eval_docs": [Document("h", _words(1, 0, 200))], "output": str(tmp_path / "o"), **keywords}
    with pytest.raises(ValueError, match=message):
        finetune(**given)
    assert not (tmp_path / "o").exists()


def test_the_python_api_takes_the_config_in_its_text_form(tiny_checkpoint, tmp_path, stop_at_load):
    from hf_posenc.training.finetune import finetune

    with pytest.raises(ValueError, match=STOP):  # every check passed: stopped where the model would load
        finetune(model=tiny_checkpoint, config="yarn:factor=2", train_docs=[Document("a", _words(2, 0, 200))],
                 eval_docs=[Document("h", _words(1, 0, 200))], output=str(tmp_path / "o"))


# -- 7. the digest cache: a rewritten file is hashed again, even with its old size and mtime ---------------------
@pytest.fixture
def digests(tmp_path, monkeypatch):
    from hf_posenc.io import digests

    monkeypatch.setenv("HF_POSENC_CACHE", str(tmp_path / "cache"))
    return digests


def _counting(digests, monkeypatch) -> list:
    read = []
    real = digests.hash_file
    monkeypatch.setattr(digests, "hash_file", lambda p: read.append(p) or real(p))
    return read


def test_a_file_rewritten_with_its_old_size_and_mtime_is_hashed_again(digests, tmp_path, monkeypatch):
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 1000)
    old = f.stat()
    time.sleep(0.05)  # past the file system's clock tick, so that the change is seen
    monkeypatch.setattr(digests, "RACY_NS", 0)  # this test looks at the keying alone
    first = digests.file_digests([str(f)])
    read = _counting(digests, monkeypatch)
    assert digests.file_digests([str(f)]) == first and read == []  # unchanged: the cache is used
    time.sleep(0.05)
    f.write_bytes(b"b" * 1000)  # as cp -p does: same size, then the old times put back
    os.utime(f, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (old.st_size, old.st_mtime_ns)
    assert digests.file_digests([str(f)]) == [hashlib.sha256(b"b" * 1000).hexdigest()] and read == [str(f)]


def test_a_file_replaced_by_another_with_its_old_size_and_mtime_is_hashed_again(digests, tmp_path, monkeypatch):
    f, new = tmp_path / "w.bin", tmp_path / "new.bin"
    f.write_bytes(b"a" * 1000)
    old = f.stat()
    monkeypatch.setattr(digests, "RACY_NS", 0)
    first = digests.file_digests([str(f)])
    new.write_bytes(b"c" * 1000)  # as rsync -a does: another file renamed over it, the old mtime kept
    os.utime(new, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(new, f)
    read = _counting(digests, monkeypatch)
    assert digests.file_digests([str(f)]) != first and read == [str(f)]


def test_a_file_changed_within_a_clock_tick_of_its_hashing_is_hashed_again(digests, tmp_path, monkeypatch):
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 1000)
    old = f.stat()
    first = digests.file_digests([str(f)])
    f.write_bytes(b"b" * 1000)  # at once: its ctime may still read as that of the first write
    os.utime(f, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert digests.file_digests([str(f)]) != first


# -- 11. truncated weights --------------------------------------------------------------------------------------
@pytest.fixture
def truncated(own_checkpoint):
    weights = own_checkpoint / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    return own_checkpoint


def test_a_truncated_weight_file_is_named_by_the_cli(truncated, tmp_path, capsys):
    err = refused(["eval", "ppl", "--model", str(truncated), "--methods", "none", "--lengths", "32", "--max-windows",
                   "1", "--corpus", "python-docs", "--output", str(tmp_path / "o"), "--no-plots", "--no-progress"],
                  capsys)
    assert str(truncated / "model.safetensors") in err and "truncated or corrupt" in err


def test_a_truncated_weight_file_is_named_by_from_pretrained(truncated):
    with pytest.raises(ValueError, match=r"model\.safetensors.*truncated or corrupt"):
        hf_posenc.from_pretrained(str(truncated))


# -- 12. --dataset: a column that is not text, a folder that is not there ----------------------------------------
@pytest.fixture(scope="module")
def saved_dataset(tmp_path_factory):
    import datasets

    folder = tmp_path_factory.mktemp("ds") / "saved"
    datasets.Dataset.from_dict({"body": [_words(0, 0, 400), _words(1, 0, 400)], "n": [1, 2],
                                "meta": [{"a": 1}, {"a": 2}], "title": ["x", "y"]}).save_to_disk(str(folder))
    return folder


def _eval(model, out, *extra) -> list[str]:
    return ["eval", "ppl", "--model", str(model), "--methods", "none", "--lengths", "32", "--max-windows", "1",
            "--output", str(out), "--no-plots", "--no-progress", *extra]


@pytest.mark.parametrize("column,kind", [("n", "int64"), ("meta", "dict")])
@pytest.mark.parametrize("command", ["eval", "finetune"])
def test_a_dataset_column_that_is_not_text_is_refused_before_loading(command, column, kind, saved_dataset,
                                                                     tiny_checkpoint, tmp_path, capsys, stop_at_load):
    data = ["--dataset", str(saved_dataset), "--column", column]
    if command == "eval":
        argv = _eval(tiny_checkpoint, tmp_path / "o", *data)
    else:
        (tmp_path / "held.txt").write_text(_words(2, 0, 500))
        argv = _finetune(tiny_checkpoint, [], [tmp_path / "held.txt"], tmp_path / "o", *data)
    err = refused(argv, capsys)
    assert f"column {column!r}" in err and kind in err and "'body', 'title'" in err and STOP not in err


@pytest.mark.parametrize("command", ["eval", "finetune"])
@pytest.mark.parametrize("where", ["missing", "not_a_dataset"])
def test_a_dataset_folder_that_is_not_there_is_refused_by_path(command, where, tiny_checkpoint, tmp_path, capsys,
                                                               stop_at_load):
    path = tmp_path / "data" / "saved"
    if where == "not_a_dataset":
        path.mkdir(parents=True)
        (path / "notes.txt").write_text("hello")
    (tmp_path / "held.txt").write_text(_words(2, 0, 500))
    if command == "eval":
        argv = _eval(tiny_checkpoint, tmp_path / "o", "--dataset", str(path))
    else:
        argv = _finetune(tiny_checkpoint, [], [tmp_path / "held.txt"], tmp_path / "o", "--dataset", str(path))
    err = refused(argv, capsys)
    assert repr(str(path)) in err and STOP not in err


# -- 13. eval-task plugins that fail: skipped with a warning naming them ----------------------------------------
_TASK = ("from dataclasses import dataclass, field\n"
         "from hf_posenc.eval.tasks import EvalTask, register_task\n"
         "@dataclass(frozen=True)\nclass Params:\n    lengths: list = field(default_factory=list)\n")
PLUGINS = {
    "raises_plugin": "raise ImportError('no module named torch_nightly_extra')\n",
    "duplicate_plugin": _TASK + ("register_task(EvalTask(name='ppl', report='other_ppl', summary='s', title='t', "
                                 "params=Params, run=lambda s, p: {}))\n"),
    "malformed_plugin": _TASK + ("register_task(EvalTask(name='broken', report='broken', summary='s', title='t', "
                                 "params=Params, run=None))\n"),
    "bad_flags_plugin": _TASK + ("@dataclass(frozen=True)\nclass Clashing:\n    model: str = 'x'\n"
                                 "register_task(EvalTask(name='clash', report='clash', summary='s', title='t', "
                                 "params=Clashing, run=lambda s, p: {}))\n"),
    "good_plugin": _TASK + ("register_task(EvalTask(name='fine', report='fine', summary='a plugin task that works', "
                            "title='t', params=Params, run=lambda s, p: {}))\n"),
}


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Every module of PLUGINS installed as an entry point of the eval-task group; the registry loads them anew."""
    tasks.registered()  # the built-in tasks (and any installed plugin's), before the fakes
    for module, source in PLUGINS.items():
        (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    points = [importlib.metadata.EntryPoint(m.replace("_plugin", ""), m, tasks.ENTRY_POINTS) for m in PLUGINS]
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **k: points if k.get("group") == tasks.ENTRY_POINTS else real(**k))
    monkeypatch.setattr(tasks, "_TASKS", dict(tasks._TASKS))
    monkeypatch.setattr(tasks, "_loaded", False)  # a registry of its own for this test, loaded anew
    yield
    for module in PLUGINS:
        import sys

        sys.modules.pop(module, None)


def _skipped(recorded) -> str:
    return "\n".join(str(w.message) for w in recorded if "eval-task plugin" in str(w.message))


def test_failing_plugins_are_skipped_with_a_warning_naming_each(plugins, capsys):
    with pytest.warns(UserWarning) as recorded:
        assert main(["methods"]) == 0
    said = _skipped(recorded)
    for name, why in (("raises", "no module named torch_nightly_extra"), ("duplicate", "'ppl' is already registered"),
                      ("malformed", "run"), ("bad_flags", "['model'] are the run's own")):
        assert f"'{name}' ({name}_plugin)" in said and why in said, said
    assert "'good'" not in said
    assert set(tasks.registered()) >= {"ppl", "passkey", "fine"}
    assert not {"broken", "clash"} & set(tasks.registered())
    assert tasks.get_task("ppl").report == "perplexity"  # the built-in one, not the duplicate


def test_help_works_with_failing_plugins(plugins, capsys):
    with pytest.warns(UserWarning):
        with pytest.raises(SystemExit) as stop:
            main(["eval", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "fine" in out and "ppl" in out


def test_a_task_without_a_runner_or_params_is_refused_when_made():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Params:
        lengths: tuple = (16,)

    with pytest.raises(ValueError, match=r"eval task 'x': run must be callable, got None"):
        tasks.EvalTask(name="x", report="x", summary="s", title="t", params=Params, run=None)
    with pytest.raises(ValueError, match=r"eval task 'x': params must be a dataclass, got \{'lengths': 16\}"):
        tasks.EvalTask(name="x", report="x", summary="s", title="t", params={"lengths": 16}, run=lambda s, p: {})


# -- a model folder that is not one: refused by what is wrong with it, before the tokenizer and the weights -------
@pytest.fixture
def broken_folder(tmp_path, bert_tokenizer):
    folder = tmp_path / "model"
    tiny_model("llama", vocab_size=bert_tokenizer.vocab_size).save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    return folder


def test_a_config_that_is_not_json_is_named(broken_folder, tmp_path, capsys):
    (broken_folder / "config.json").write_text('{"model_type": "llama",')
    err = refused(_eval(broken_folder, tmp_path / "o", "--corpus", "python-docs"), capsys)
    assert f"{broken_folder / 'config.json'} is not valid JSON" in err and "--tokenizer" not in err


@pytest.mark.parametrize("keep", [[], ["model.safetensors", "tokenizer.json"]])
def test_a_folder_without_config_json_is_named(keep, broken_folder, tmp_path, capsys):
    for f in broken_folder.iterdir():
        if f.name not in keep:
            f.unlink()
    err = refused(_eval(broken_folder, tmp_path / "o", "--corpus", "python-docs"), capsys)
    assert f"model folder '{broken_folder}' has no config.json" in err
    assert (", ".join(keep) if keep else "it is empty") in err


def test_a_folder_without_tokenizer_files_says_what_it_holds(broken_folder, tmp_path, capsys):
    for f in broken_folder.glob("tokenizer*"):
        f.unlink()
    err = refused(_eval(broken_folder, tmp_path / "o", "--corpus", "python-docs"), capsys)
    assert "no tokenizer could be loaded" in err
    assert "holds config.json, generation_config.json, model.safetensors" in err


def test_a_config_value_transformers_refuses_is_named(broken_folder, tmp_path, capsys):
    config = broken_folder / "config.json"
    config.write_text(config.read_text().replace('"hidden_size": 64', '"hidden_size": "big"'))
    err = refused(_eval(broken_folder, tmp_path / "o", "--corpus", "python-docs"), capsys)
    assert f"{config} is not a configuration transformers can read" in err and "hidden_size" in err


def test_weights_of_other_shapes_than_the_config_gives_are_refused(broken_folder, tmp_path, capsys):
    config = broken_folder / "config.json"
    config.write_text(config.read_text().replace('"hidden_size": 64', '"hidden_size": 128'))
    err = refused(_eval(broken_folder, tmp_path / "o", "--corpus", "python-docs"), capsys)
    assert f"the weights of {broken_folder} do not have the shapes its config.json gives" in err


def test_a_weight_file_given_as_the_model_is_named(broken_folder, tmp_path, capsys):
    weights = broken_folder / "model.safetensors"
    err = refused(_eval(weights, tmp_path / "o", "--corpus", "python-docs"), capsys)
    assert f"model '{weights}' is a file; --model takes the folder" in err


@pytest.mark.parametrize(("command", "name"), [
    (["eval", "ppl", "--lengths", "64", "--max-windows", "1"], "perplexity.md"),
    (["eval", "ppl", "--lengths", "64", "--max-windows", "1"], "loss_by_position_64.png"),
    (["tune", "--target-length", "128"], "best.json"),
    (["tune", "--target-length", "128"], "tune_loss_by_position.png")])
def test_a_folder_holding_a_report_an_evaluation_would_replace_is_refused_before_the_load(
        command, name, tmp_path, capsys, stop_at_load):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / name).write_text("mine")
    err = refused([*command, "--corpus", "python-docs", "--no-progress", "--output", str(theirs)], capsys)
    assert f"already holds {name}, which no hf-posenc evaluation wrote there" in err and STOP not in err
    assert sorted(p.name for p in theirs.iterdir()) == [name] and (theirs / name).read_text() == "mine"
    (theirs / "cells.jsonl").write_text("")  # an earlier run's folder: its reports are rewritten as it resumes
    assert STOP in refused([*command, "--corpus", "python-docs", "--no-progress", "--output", str(theirs)], capsys)


def test_a_tune_rerun_without_a_winner_removes_the_earlier_best_json(tmp_path):
    from hf_posenc.tuning.report import write_best

    cfg = hf_posenc.PosEncConfig("pi", 16.0)
    report = {"results": {"best": "p16", "configs": {"p16": cfg.to_dict()}}}
    assert write_best(report, str(tmp_path)) == str(tmp_path / "best.json")
    assert hf_posenc.PosEncConfig.from_json((tmp_path / "best.json").read_text()) == cfg
    report["results"]["best"] = None  # the same output run again (--overwrite): every candidate disqualified
    assert write_best(report, str(tmp_path)) is None and not (tmp_path / "best.json").exists()


@pytest.mark.parametrize("seed", ["99999999999999999999999", "-1", "4294967296", "1.5"])
@pytest.mark.parametrize("command", [["eval", "passkey"], ["tune"], ["patch", "--method", "pi"], ["finetune"]])
def test_a_seed_no_generator_takes_is_refused_naming_the_flag(command, seed, tmp_path, capsys):
    err = refused([*command, "--seed", seed, "--output", str(tmp_path / "o")], capsys)
    assert "argument --seed: expected a whole number from 0 to 4294967295" in err and "Overflow" not in err
    assert not (tmp_path / "o").exists()
