"""Resumable fine-tuning (hf_posenc.training.resume): a run killed after a checkpoint goes on with --resume to the
very losses and weights of the run nobody interrupted; another run's checkpoints, or the same run's without
--resume, are refused before any compute; the typed training settings refuse bad values by name."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import book_path, refused

from hf_posenc.cli import main
from hf_posenc.training.resume import RUN_FILE
from hf_posenc.training.settings import CheckpointSettings, TrainSettings

STEPS = 60


def _argv(model: str, out, *extra: str) -> list[str]:
    return ["finetune", "--model", model, "--method", "yarn", "--factor", "2", "--text-file", book_path("pg1513.txt"),
            "--eval-text-file", book_path("pg84.txt"), "--seq-len", "64", "--steps", str(STEPS), "--batch-size", "2",
            "--learning-rate", "3e-3", "--warmup-steps", "3", "--eval-windows", "2", "--seed", "3", "--no-progress",
            "--output", str(out), *extra]


def _report(out) -> dict:
    return json.loads((out / "hf_posenc_eval" / "finetune.json").read_text())


@pytest.fixture
def no_model_load(monkeypatch):
    import hf_posenc.checkpoints.loading as loading

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr(loading, "from_pretrained", refuse)


def _reads(state) -> bool:
    """Whether the Trainer finished writing a checkpoint's state file (it exists before its last byte is written:
    a kill in between leaves a checkpoint cut short, which is no checkpoint)."""
    try:
        json.loads(state.read_text())
    except (OSError, ValueError):
        return False
    return True


def _killed_after_a_checkpoint(argv: list[str], checkpoints) -> None:
    """Start ``hf-posenc ARGV`` in a process of its own and SIGTERM it once its first checkpoint is whole."""
    child = subprocess.Popen([sys.executable, "-m", "hf_posenc.cli", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    first = checkpoints / "checkpoint-2" / "trainer_state.json"
    deadline = time.time() + 300
    while not _reads(first) and child.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert _reads(first), child.communicate()
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 143 and "Traceback" not in err, err


@pytest.fixture
def trainer_warnings():
    """What transformers' Trainer logs during the test (its own logger does not propagate to pytest's)."""
    import logging

    got: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: got.append(record.getMessage())
    logging.getLogger("transformers.trainer").addHandler(handler)
    yield got
    logging.getLogger("transformers.trainer").removeHandler(handler)


@pytest.fixture
def tied_checkpoint(tmp_path_factory, bert_tokenizer):
    """A tiny LLaMA whose LM head is its embedding (as SmolLM2's): a checkpoint holds the weight once."""
    from helpers import tiny_config
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("tiny-tied")
    torch.manual_seed(0)
    cfg = tiny_config("llama", vocab_size=bert_tokenizer.vocab_size, tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    bert_tokenizer.save_pretrained(out)
    return str(out)


@pytest.mark.parametrize("lora,tied", [(False, False), (True, False), (False, True)], ids=["full", "lora", "tied"])
def test_a_killed_run_resumes_to_the_losses_and_weights_of_an_uninterrupted_one(lora, tied, request, tmp_path,
                                                                                  capsys, trainer_warnings):
    model = request.getfixturevalue("tied_checkpoint" if tied else "tiny_checkpoint")
    extra = ["--lora-r", "4", "--lora-merge"] if lora else []
    assert main(_argv(model, tmp_path / "whole", *extra)) == 0
    whole = _report(tmp_path / "whole")

    out, checkpoints = tmp_path / "cut", tmp_path / "cut.checkpoints"
    argv = _argv(model, out, *extra, "--checkpoint-every", "2")
    _killed_after_a_checkpoint(argv, checkpoints)
    assert not out.exists() and (checkpoints / RUN_FILE).exists()  # nothing half-written; the checkpoints stay
    capsys.readouterr()

    err = refused(argv, capsys)  # the same run again, without --resume: not trained over
    assert "holds the checkpoints of an earlier run" in err and "--resume" in err
    changed = [a if a != "3e-3" else "1e-3" for a in argv]
    err = refused([*changed, "--resume"], capsys)  # other settings
    assert "belong to a run with other settings" in err and "training.learning_rate: 0.003 then, 0.001 now" in err

    trainer_warnings.clear()
    assert main([*argv, "--resume"]) == 0
    assert not [m for m in trainer_warnings if "missing keys" in m], trainer_warnings  # a tied LM head is not 'missing'
    resumed = _report(out)
    assert resumed["setup"]["resumed_from_step"] >= 2
    assert [x["step"] for x in resumed["losses"]] == list(range(1, STEPS + 1))
    for a, b in zip(whole["losses"], resumed["losses"]):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5), (a, b)
    assert resumed["heldout_before"] == whole["heldout_before"]  # measured once, before the first step
    assert resumed["heldout_after"]["ppl"] == pytest.approx(whole["heldout_after"]["ppl"], rel=1e-5)
    assert not checkpoints.exists()  # the model is saved: its checkpoints are gone
    assert not any(p.name.startswith(".cut") for p in tmp_path.iterdir())  # no lock, no staged folder left
    err = refused([*argv, "--resume"], capsys)  # finished: nothing to resume, and the output is not trained over
    assert "already holds the finished run" in err and (out / "hf_posenc_eval" / "finetune.json").exists()


def test_resume_with_no_checkpoint_trains_from_the_start_and_says_so(tiny_checkpoint, tmp_path, capsys):
    out, mine = tmp_path / "ft", tmp_path / "my-checkpoints"
    mine.mkdir()  # a folder the user made: emptied of what the run wrote, and kept
    assert main([*_argv(tiny_checkpoint, out), "--steps", "4", "--resume", "--checkpoint-every", "2",
                 "--checkpoint-dir", str(mine)]) == 0
    said = capsys.readouterr().out
    assert "no checkpoint of an earlier run" in said and "training starts at step 0" in said
    assert _report(out)["setup"]["resumed_from_step"] == 0 and mine.is_dir() and not list(mine.iterdir())


@pytest.mark.parametrize("extra,message", [
    (["--checkpoint-every", "-1"], "--checkpoint-every must be a whole number >= 0, got -1"),
    (["--checkpoint-dir", "x"], "--checkpoint-dir is where --checkpoint-every saves and --resume reads"),
    (["--checkpoint-every", "2", "--checkpoint-dir", "{out}/inner"], "lie one inside the other"),
    (["--checkpoint-every", "2", "--checkpoint-dir", "{tmp}/mine"], "holds files that no hf-posenc finetune wrote"),
    (["--checkpoint-every", "2", "--checkpoint-dir", "{tmp}"], "lie one inside the other"),  # rmtree would take ft
    (["--checkpoint-every", "2", "--checkpoint-dir", "{tmp}/mine/notes.txt"], "is a file, not a folder"),
])
def test_bad_checkpoint_settings_are_refused_before_the_model_loads(extra, message, tiny_checkpoint, tmp_path,
                                                                    capsys, no_model_load):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    out = tmp_path / "ft"
    extra = [x.format(out=out, tmp=tmp_path) for x in extra]
    err = refused(_argv(tiny_checkpoint, out, *extra), capsys)
    assert message in err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep" and not out.exists()


@pytest.mark.parametrize("bad,message", [
    ({"steps": 0}, "--steps must be a whole number >= 1, got 0"),
    ({"seq_len": 1}, "--seq-len must be a whole number >= 2, got 1"),
    ({"batch_size": 2.5}, "--batch-size must be a whole number >= 1, got 2.5"),
    ({"learning_rate": 0.0}, "--learning-rate must be a number > 0, got 0.0"),
    ({"learning_rate": float("nan")}, "--learning-rate must be a number > 0, got nan"),
    ({"weight_decay": -0.1}, "--weight-decay must be a number >= 0, got -0.1"),
    ({"warmup_steps": -1}, "--warmup-steps must be a whole number >= 0, got -1"),
    ({"packing": "docs"}, "--packing must be one of document, stream, stream-restart, got 'docs'"),
    ({"dtype": "fp8"}, "--dtype must be one of float32, bfloat16, float16, got 'fp8'"),
    ({"mixed_precision": "half"}, "--mixed-precision must be one of no, bf16, fp16, got 'half'"),
    ({"gradient_checkpointing": "yes"}, "gradient_checkpointing must be True or False, got 'yes'"),
    ({"s2_attn_group": 1}, "--s2-attn-group must be a whole number >= 2, got 1"),
    ({"device": ""}, "--device must be a torch device"),
])
def test_train_settings_refuse_bad_values_by_name(bad, message):
    with pytest.raises(ValueError) as err:
        TrainSettings(**bad)
    assert message in str(err.value)


def test_the_fingerprint_holds_every_training_setting_but_the_device():
    a, b = TrainSettings(device="cpu"), TrainSettings(device="cuda:1")
    assert a.fingerprint() == b.fingerprint() and "device" not in a.fingerprint()
    assert TrainSettings(seed=1).fingerprint() != a.fingerprint()
    assert set(a.fingerprint()) | {"device"} == set(a.__dataclass_fields__)
    assert CheckpointSettings().folder_for("runs/x/") == os.path.abspath("runs/x.checkpoints")
    with pytest.raises(ValueError, match="--checkpoint-dir must be a folder's path, got ''"):
        CheckpointSettings(every=2, folder="")


def _run_file(folder, steps=60) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RUN_FILE).write_text(json.dumps({"fingerprint": {"training": {"steps": steps}}, "every": 2,
                                               "before": {}, "seconds": {}}))


def test_what_the_checkpoint_folder_holds_decides_what_is_resumed(tmp_path, capsys):
    from hf_posenc.training.resume import ResumableRun

    out = str(tmp_path / "ft")
    folder = tmp_path / "ft.checkpoints"
    _run_file(folder)  # a run that stopped before its first checkpoint (out of memory at step 1, say)
    run = ResumableRun(CheckpointSettings(every=2), out, {})
    assert "stopped before its first checkpoint" in capsys.readouterr().out and not (folder / RUN_FILE).exists()
    assert run.stored is None
    _run_file(folder)
    for step, state in ((2, '{"global_step": 2}'), (4, '{"global_st')):  # the second cut short by a kill
        (folder / f"checkpoint-{step}").mkdir()
        (folder / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    run = ResumableRun(CheckpointSettings(every=2, resume=True), out, {"training": {"steps": 60}})
    assert [s for s, _ in run.checkpoints()] == [2]
    assert run.resume_from().endswith("checkpoint-2") and not (folder / "checkpoint-4").exists()
    with pytest.raises(ValueError, match="under 2 processes"):
        ResumableRun(CheckpointSettings(every=2), out, {}, processes=2)
    ResumableRun(CheckpointSettings(), out, {})  # without checkpoint flags the folder is not even looked at


def test_a_run_resumes_with_its_base_model_given_by_another_path_but_not_with_other_weights(tmp_path):
    """The base model is named by its files' digest: a relative path from another folder (or the folder moved)
    resumes the run; other files at the path do not."""
    from hf_posenc.training.resume import ResumableRun

    def fingerprint(path, files):
        return {"model": {"model": path, "revision": None, "files": files}, "training": {"steps": 60}}

    folder = tmp_path / "ft.checkpoints"
    (folder / "checkpoint-2").mkdir(parents=True)
    (folder / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    (folder / RUN_FILE).write_text(json.dumps({"fingerprint": fingerprint("runs/base", "sha256:aa"), "every": 2,
                                               "before": {}, "seconds": {}}))
    settings = CheckpointSettings(every=2, resume=True)
    run = ResumableRun(settings, str(tmp_path / "ft"), fingerprint("../elsewhere/runs/base", "sha256:aa"))
    assert run.resume_from().endswith("checkpoint-2")
    with pytest.raises(ValueError, match="model.files: 'sha256:aa' then, 'sha256:bb' now"):
        ResumableRun(settings, str(tmp_path / "ft"), fingerprint("runs/base", "sha256:bb"))


def test_a_run_resumed_from_an_older_release_measures_before_training_again_past_l_as_after(tiny_checkpoint, tmp_path):
    """A run file written before 'ppl past L' was exact holds a 'before' counted from a position bucket's edge (65 of
    L = 64 on the tiny model); resumed, that part is measured again, so before and after compare the same tokens."""
    out, checkpoints = tmp_path / "cut", tmp_path / "cut.checkpoints"
    argv = _argv(tiny_checkpoint, out, "--pose-window", "32", "--target-length", "128", "--eval-needle-trials", "0",
                 "--checkpoint-every", "2")
    _killed_after_a_checkpoint(argv, checkpoints)
    stored = json.loads((checkpoints / RUN_FILE).read_text())
    section = stored["before"]["long_context"]
    exact = dict(section["past_original"])
    for past in (section["past_original"], section["truncated"]["past_original"]):
        assert (past["from"], past["tokens"]) == (64, 64)  # this release: from L exactly
        past.update({"from": 65, "tokens": 63, "ppl": 1e9})  # as an older release counted it
    (checkpoints / RUN_FILE).write_text(json.dumps(stored))
    assert main([*argv, "--resume"]) == 0
    report = _report(out)
    before, after = report["long_context"]["before"], report["long_context"]["after"]
    assert before["past_original"]["ppl"] == pytest.approx(exact["ppl"], rel=1e-6)  # the untrained model again
    assert before["truncated"]["past_original"]["ppl"] < 1e9
    assert after["past_original"]["from"] == before["past_original"]["from"] == 64


def test_a_training_text_edited_between_runs_is_named_as_changed_not_as_the_same_name_twice():
    from hf_posenc.io.documents import Document
    from hf_posenc.training.resume import _difference, document_digests

    then = document_digests([Document("d11.txt", "the first text"), Document("d12.txt", "kept")])
    now = document_digests([Document("d11.txt", "the first text, edited"), Document("d12.txt", "kept")])
    said = _difference("train_documents", then, now)
    assert said == "train_documents: the text of d11.txt changed (same name)"
    other = document_digests([Document("d13.txt", "another")])
    assert _difference("train_documents", then, other) == \
        "train_documents: 2 document(s) (d11.txt, d12.txt) then, 1 document(s) (d13.txt) now"
    assert _difference("training.learning_rate", 0.003, 0.001) == "training.learning_rate: 0.003 then, 0.001 now"
