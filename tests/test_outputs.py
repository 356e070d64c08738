"""Nothing a command did not write is ever deleted: ``patch`` and ``finetune`` replace their
``--output`` whole only when it is their own earlier output, unchanged; one run per folder; a kill leaves no lock
and no staged folder; the other output-taking commands keep what else the folder holds."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import book_path, refused

from hf_posenc.cli import main
from hf_posenc.io.files import LOCK_FILE
from hf_posenc.io.output_folder import MANIFEST, ReplacedOutput

PATCH = ["patch", "--method", "yarn", "--factor", "2", "--no-progress"]


def _patch(model, out):
    return [*PATCH, "--model", model, "--output", str(out)]


def _finetune(model, out, train=None):
    return ["finetune", "--model", model, "--method", "alibi", "--text-file", train or book_path("pg1513.txt"),
            "--eval-text-file", book_path("pg84.txt"), "--seq-len", "64", "--steps", "1", "--eval-windows", "1",
            "--output", str(out), "--no-progress"]


def _leftovers(parent) -> list[str]:
    """What a run may leave beside its output: staged folders, moved-aside outputs, locks."""
    return sorted(n for n in os.listdir(parent) if ".partial-" in n or ".old-" in n or n.endswith(".hf_posenc.lock"))


def test_patch_refuses_a_folder_with_a_file_it_did_not_write(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "keep.txt").write_text("my notes")
    err = refused(_patch(tiny_checkpoint, out), capsys)
    assert "already holds files that hf-posenc patch did not write (keep.txt)" in err and "never deletes" in err
    assert (out / "keep.txt").read_text() == "my notes" and os.listdir(out) == ["keep.txt"]
    assert _leftovers(tmp_path) == []


def test_patch_refuses_a_parent_of_the_model(tiny_checkpoint, tmp_path, capsys):
    import shutil

    base = tmp_path / "parent" / "base"
    shutil.copytree(tiny_checkpoint, base)
    err = refused(_patch(str(base), tmp_path / "parent"), capsys)
    assert f"contains the model being read ({base})" in err
    assert (base / "config.json").exists()


def test_patch_refuses_the_working_directory(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    here = tmp_path / "empty-here"
    here.mkdir()
    monkeypatch.chdir(here)
    err = refused(_patch(tiny_checkpoint, "."), capsys)
    assert "contains the current working directory" in err
    err = refused(_patch(tiny_checkpoint, tmp_path), capsys)  # an ancestor of it too
    assert "contains the current working directory" in err
    assert here.exists() and os.listdir(here) == []


def test_patch_replaces_its_own_output_but_not_once_a_file_is_added_or_changed(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "patched"
    assert main(_patch(tiny_checkpoint, out)) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["command"] == "patch" and "config.json" in manifest["files"] and "README.md" in manifest["files"]
    assert main(_patch(tiny_checkpoint, out)) == 0  # its own earlier output, unchanged: replaced
    capsys.readouterr()
    (out / "hf_posenc_eval").mkdir(exist_ok=True)
    (out / "hf_posenc_eval" / "my-eval.json").write_text("{}")
    err = refused(_patch(tiny_checkpoint, out), capsys)
    assert "files it did not write (hf_posenc_eval/my-eval.json)" in err
    (out / "hf_posenc_eval" / "my-eval.json").unlink()
    card = (out / "README.md").read_text()
    (out / "README.md").write_text(card + "\nmy edit\n")
    err = refused(_patch(tiny_checkpoint, out), capsys)
    assert "files changed since it wrote them (README.md)" in err
    assert (out / "README.md").read_text().endswith("my edit\n")
    assert _leftovers(tmp_path) == []


def test_patch_does_not_replace_a_finetune_output(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "trained"
    out.mkdir()
    (out / "weights.bin").write_text("x")
    (out / MANIFEST).write_text(json.dumps({"command": "finetune", "files": {"weights.bin": [1, 0]}}))
    err = refused(_patch(tiny_checkpoint, out), capsys)
    assert "holds the output of `hf-posenc finetune`" in err and (out / "weights.bin").exists()


def test_a_second_patch_run_on_the_same_output_is_refused(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "patched"
    with ReplacedOutput(str(out), "patch"):  # another run holding it
        err = refused(_patch(tiny_checkpoint, out), capsys)
    assert f"in use by another hf-posenc run (pid {os.getpid()}" in err
    assert not out.exists() and _leftovers(tmp_path) == []


def test_an_output_moved_aside_by_a_killed_run_is_put_back(tmp_path):
    out = tmp_path / "patched"
    moved = tmp_path / ".patched.old-abc_1234" / "previous"  # killed between its two renames (mkdtemp names)
    moved.mkdir(parents=True)
    (moved / "config.json").write_text("{}")
    (tmp_path / ".patched.partial-xyz_5678").mkdir()  # and a staged folder a killed run left
    with ReplacedOutput(str(out), "patch"):
        assert (out / "config.json").read_text() == "{}"
    assert _leftovers(tmp_path) == []


def test_a_failed_save_leaves_the_output_and_no_parents_it_made(tmp_path):
    out = tmp_path / "a" / "b" / "patched"
    with pytest.raises(RuntimeError):
        with ReplacedOutput(str(out), "patch") as run, run.staged() as staged:
            open(os.path.join(staged, "config.json"), "w").close()
            raise RuntimeError("disk full")
    assert os.listdir(tmp_path) == []


def test_finetune_refuses_a_folder_with_a_file_it_did_not_write_and_the_folder_of_its_data(tiny_checkpoint, tmp_path,
                                                                                          capsys):
    out = tmp_path / "ft"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    err = refused(_finetune(tiny_checkpoint, out), capsys)
    assert "did not write (keep.txt)" in err and (out / "keep.txt").exists()
    data = tmp_path / "data"
    data.mkdir()
    train = data / "train.txt"
    train.write_text(open(book_path("pg1513.txt"), encoding="utf-8").read())
    err = refused(_finetune(tiny_checkpoint, tmp_path / "data", str(train)), capsys)
    assert f"contains the input ({train})" in err and train.exists()


@pytest.mark.parametrize("command", ["ppl", "tune", "serve-check"])
def test_commands_that_write_into_a_folder_keep_what_else_it_holds(command, tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "reports"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    if command == "ppl":
        argv = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none", "--lengths", "64", "--max-windows", "1",
                "--corpus", "python-docs", "--limit", "1", "--no-plots", "--no-progress"]
    elif command == "tune":
        argv = ["tune", "--model", tiny_checkpoint, "--target-length", "128", "--corpus", "python-docs", "--limit", "1",
                "--methods", "pi", "--no-progress"]
    else:  # a method no engine computes: the verdict comes without starting one
        patched = tmp_path / "patched"
        assert main(["patch", "--model", tiny_checkpoint, "--method", "self_extend", "--output", str(patched),
                     "--no-progress"]) == 0
        argv = ["serve-check", str(patched)]
    assert main([*argv, "--output", str(out)]) == 0, capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine" and not (out / LOCK_FILE).exists()


def test_overwrite_never_deletes_a_cells_file_it_did_not_write(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "reports"
    out.mkdir()
    (out / "cells.jsonl").write_text("my own data\n")
    err = refused(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none", "--lengths", "64", "--corpus",
                   "python-docs", "--limit", "1", "--overwrite", "--output", str(out)], capsys)
    assert "is not a cells file of hf_posenc" in err and (out / "cells.jsonl").read_text() == "my own data\n"


@pytest.mark.parametrize("command", ["eval", "patch"])
def test_sigterm_releases_the_lock_and_removes_what_was_staged(command, tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    if command == "eval":
        argv = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,pi", "--factor", "2", "--lengths",
                "64,128,256,512,1024,2048", "--corpus", "python-docs", "--limit", "3", "--no-progress"]
        lock = out / LOCK_FILE
    else:
        argv = [*PATCH, "--model", tiny_checkpoint, "--eval", "ppl", "--ppl-lengths", "64,128,256,512,1024,2048",
                "--max-windows", "8", "--text-file", book_path("pg84.txt")]
        lock = tmp_path / ".out.hf_posenc.lock"
    child = subprocess.Popen([sys.executable, "-m", "hf_posenc.cli", *argv, "--output", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not lock.exists() and child.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert lock.exists(), child.communicate()
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 143 and "terminated" in err and "Traceback" not in err, err
    assert not lock.exists() and _leftovers(tmp_path) == []


_KILLED_AT = """
import os, signal, sys
from hf_posenc.io.interrupts import Terminated, sigterm_interrupts
from hf_posenc.io.output_folder import MANIFEST, ReplacedOutput

where, out = sys.argv[1], sys.argv[2]
def write(text):
    with ReplacedOutput(out, "patch") as o, o.staged() as tmp:
        open(os.path.join(tmp, "a.txt"), "w").write(text)
        if text == "old":
            return
        arm("manifest", "replace", lambda src, dst: dst.endswith(MANIFEST))
        arm("renames", "replace", lambda src, dst: src == os.path.abspath(out))
def arm(point, name, when=lambda *a: True):
    if point != where:
        return
    real = getattr(os, name)
    def kill_then_call(*args, **kwargs):
        if when(*args):
            setattr(os, name, real)
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)
    setattr(os, name, kill_then_call)
write("old")
arm("lock", "ftruncate")
arm("staging", "chmod")
try:
    with sigterm_interrupts():
        write("new")
    print("finished")
except Terminated:
    print("terminated")
"""


@pytest.mark.parametrize("where", ["lock", "staging", "manifest", "renames"])
def test_a_kill_at_any_step_of_replacing_an_output_leaves_it_whole_and_nothing_beside(where, tmp_path):
    """SIGTERM while the lock is taken, the staged folder made, its manifest written, or during the two renames
    (there it waits until both are done): the run stops, the output is the old one or the new one, and neither a
    lock, a staged folder nor a moved-aside output is left."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", _KILLED_AT, where, str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "terminated", done.stderr
    assert os.listdir(tmp_path) == ["out"]
    assert (out / "a.txt").read_text() == ("new" if where == "renames" else "old")
    assert sorted(os.listdir(out)) == sorted(["a.txt", MANIFEST])


def test_what_only_looks_like_a_killed_runs_leftovers_is_kept(tmp_path):
    """Only the names a run makes (mkdtemp's) are cleaned: another output's staging folder, or a user's folder
    that happens to start alike, stays."""
    other = tmp_path / ".patched.partial-v2.partial-abcd1234"  # the staging folder of --output patched.partial-v2
    mine = tmp_path / ".patched.old-mine"
    for folder in (other, mine):
        folder.mkdir()
        (folder / "x").write_text("keep")
    with ReplacedOutput(str(tmp_path / "patched"), "patch"):
        pass
    assert (other / "x").exists() and (mine / "x").exists()


def test_a_lock_path_that_is_a_link_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("important")
    (tmp_path / ".out.hf_posenc.lock").symlink_to(victim)
    with pytest.raises(ValueError, match="cannot be taken"):
        ReplacedOutput(str(tmp_path / "out"), "patch")
    assert victim.read_text() == "important"


def test_patch_refuses_a_link_as_output_and_a_folder_an_eval_is_writing(tiny_checkpoint, tmp_path, capsys):
    target = tmp_path / "big-disk"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    err = refused(_patch(tiny_checkpoint, tmp_path / "link"), capsys)
    assert "is a symbolic link" in err and (tmp_path / "link").is_symlink()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "deep")
    assert "is a symbolic link" in refused(_patch(tiny_checkpoint, tmp_path / "dangling"), capsys)
    from hf_posenc.io.files import OutputLock

    held = OutputLock(str(tmp_path / "ev"))  # an eval running into that folder
    try:
        err = refused(_patch(tiny_checkpoint, tmp_path / "ev"), capsys)
    finally:
        held.release()
    assert f"did not write ({LOCK_FILE})" in err


def test_a_failed_final_rename_keeps_the_old_output_and_the_new_one(tmp_path, monkeypatch):
    out = tmp_path / "patched"
    with ReplacedOutput(str(out), "patch") as run, run.staged() as staged:
        open(os.path.join(staged, "config.json"), "w").write("old")
    real = os.replace

    def failing(src, dst):
        if str(dst) == str(out) and ".partial-" in str(src):
            raise OSError(16, "Device or resource busy")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(ValueError, match="could not be replaced .*kept in") as err:
        with ReplacedOutput(str(out), "patch") as run, run.staged() as staged:
            open(os.path.join(staged, "config.json"), "w").write("new")
    kept = str(err.value).rsplit("kept in ", 1)[1]
    assert (out / "config.json").read_text() == "old" and open(os.path.join(kept, "config.json")).read() == "new"


class _Finalizer:
    """Sends SIGTERM from its ``__del__`` and runs on there: the handler's exception is raised inside the finalizer,
    where Python drops it ("Exception ignored in ..."), as when a kill lands in a regex object's __del__."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):
            pass


def test_a_sigterm_dropped_in_a_finalizer_still_interrupts_and_nothing_stays_armed():
    from hf_posenc.io.interrupts import Terminated, sigterm_interrupts

    seen = []
    hook, before = sys.unraisablehook, signal.getsignal(signal.SIGTERM)
    sys.unraisablehook = seen.append  # another unraisable exception still reaches the hook that was there
    try:
        start = time.time()
        with pytest.raises(Terminated, match="signal 15"):
            with sigterm_interrupts():
                _Finalizer()
                while time.time() - start < 10:
                    time.sleep(0.01)
        assert time.time() - start < 5  # raised again at once, in ordinary code, not after the block ran on
        with sigterm_interrupts():
            class Fails:
                def __del__(self):
                    raise ValueError("not ours")
            Fails()
        assert [type(u.exc_value) for u in seen] == [ValueError]
        assert sys.unraisablehook == seen.append and signal.getsignal(signal.SIGTERM) == before
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        sys.unraisablehook = hook
