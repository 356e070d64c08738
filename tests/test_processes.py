"""Processes, as a hostile user runs them -- a rank of a ``torchrun --nproc_per_node 2`` (gloo)
``eval ppl`` killed mid-run, ``--device-map cpu``/``auto`` on CPU, ``tune`` stopped by SIGTERM then SIGKILL and
rerun, an ``upload`` to the loopback Hub stopped by SIGTERM and its printed rerun line pasted back.

Numbers are compared as the reports' JSON: equal to the bit except timings (which differ run to run)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers import tiny_model

import hf_posenc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "hf_probe_token_not_a_secret_0123456789"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), **extra)
    return env


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait_for_lines(path, n: int, child, limit: float = 120.0) -> None:
    start = time.time()
    while len(_lines(path)) < n:
        assert child.poll() is None, f"the run ended (rc {child.returncode}) before {n} lines of {path}"
        assert time.time() - start < limit, f"fewer than {n} lines of {path} after {limit} s"
        time.sleep(0.05)


def _without_timings(value):
    """A report's JSON without what differs between two runs of one command: seconds, processes, the command."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items()
                if k not in ("seconds", "compute", "environment", "processes", "command")}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def _cells_whole(path) -> list[dict]:
    """Every line of a cells file is one whole JSON object (nothing half-written)."""
    return [json.loads(line) for line in _lines(path)]


# -- torchrun: one rank killed -----------------------------------------------------------------------------------
PPL = ["eval", "ppl", "--methods", "none", "--variant", "y4=yarn:factor=4", "--lengths", "32,128",
       "--max-windows", "6", "--corpus", "python-docs", "--no-progress", "--no-plots"]


@pytest.mark.parametrize("victim", ["1"])
def test_a_killed_rank_stops_the_run_cleanly_and_a_rerun_resumes_to_the_single_process_numbers(
        victim, tiny_checkpoint, tmp_path):
    from hf_posenc.cli import main

    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*PPL, "--model", tiny_checkpoint, "--output", str(one)]) == 0
    total = len(_lines(one / "cells.jsonl"))
    child = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                              _free_port(), "-m", "hf_posenc", *PPL, "--model", tiny_checkpoint, "--output", str(two)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    try:
        _wait_for_lines(two / "cells.jsonl", 6, child)
        workers = subprocess.run(["pgrep", "-P", str(child.pid)], capture_output=True, text=True).stdout.split()
        ranks = {}
        for pid in workers:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = dict(x.split(b"=", 1) for x in fh.read().split(b"\0") if b"=" in x)
            ranks[env[b"RANK"].decode()] = int(pid)
        assert set(ranks) == {"0", "1"}, ranks
        os.kill(ranks[victim], signal.SIGKILL)
        _, err = child.communicate(timeout=120)  # the other rank must not hang
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode != 0
    assert "exitcode  : 143" in err  # the surviving rank was terminated by torchrun and unwound (SIGTERM -> 143)
    assert not (two / "perplexity.json").exists() and not (two / "perplexity.md").exists()  # no report
    kept = _cells_whole(two / "cells.jsonl")
    assert 6 <= len(kept) < total
    assert not (two / ".hf_posenc.lock").exists()  # rank 0 unwound: its lock released and removed
    # the rerun (one process this time) resumes what the killed run computed and gives the same numbers
    res = subprocess.run([sys.executable, "-m", "hf_posenc", *PPL, "--model", tiny_checkpoint, "--output", str(two)],
                         capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"resumed {len(kept) - 1} of {total - 1} cells" in res.stderr
    single, resumed = (json.loads((d / "perplexity.json").read_text()) for d in (one, two))
    assert _without_timings(resumed) == _without_timings(single)


# -- --device-map on CPU -------------------------------------------------------------------------------------------
def test_device_map_cpu_and_auto_give_the_numbers_of_no_device_map(tiny_checkpoint, tmp_path):
    from hf_posenc.cli import main

    base = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn,self_extend,alibi", "--lengths", "32,96",
            "--max-windows", "2", "--corpus", "python-docs", "--no-progress", "--no-plots",
            "--method-param", "self_extend.window=16", "--method-param", "self_extend.group_size=4"]
    reports = {}
    for name, extra in (("plain", []), ("cpu", ["--device-map", "cpu"]), ("auto", ["--device-map", "auto"])):
        assert main(base + extra + ["--output", str(tmp_path / name)]) == 0
        reports[name] = json.loads((tmp_path / name / "perplexity.json").read_text())
    assert reports["cpu"]["results"] == reports["plain"]["results"]
    assert reports["auto"]["results"] == reports["plain"]["results"]


# -- tune: SIGTERM, then SIGKILL, then a rerun ---------------------------------------------------------------------
def _tune(checkpoint, out):
    return [sys.executable, "-m", "hf_posenc", "tune", "--model", checkpoint, "--target-length", "128", "--corpus",
            "python-docs", "--no-progress", "--no-plots", "--methods", "yarn,self_extend", "--output", str(out)]


def test_tune_stopped_by_sigterm_then_sigkill_resumes_to_the_uninterrupted_results(tiny_checkpoint, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    res = subprocess.run(_tune(tiny_checkpoint, whole), capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    cells = cut / "cells.jsonl"
    for sig, more in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        before = len(_lines(cells))
        child = subprocess.Popen(_tune(tiny_checkpoint, cut), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=_env())
        _wait_for_lines(cells, before + more, child)
        child.send_signal(sig)
        _, err = child.communicate(timeout=60)
        assert child.returncode == (143 if sig == signal.SIGTERM else -9), err[-2000:]
        assert not (cut / "tune.json").exists() and not (cut / "best.json").exists()
        _cells_whole(cells)
        if sig == signal.SIGTERM:
            assert "terminated" in err and not (cut / ".hf_posenc.lock").exists()
    res = subprocess.run(_tune(tiny_checkpoint, cut), capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resumed" in res.stderr
    once, resumed = (json.loads((d / "tune.json").read_text())["results"] for d in (whole, cut))
    for key in ("best", "runner_up", "rungs", "confirmation"):
        assert _without_timings(resumed[key]) == _without_timings(once[key]), key
    assert (cut / "best.json").read_text() == (whole / "best.json").read_text()


# -- upload: SIGTERM mid-commit, then the printed rerun line -------------------------------------------------------
def test_an_upload_stopped_by_sigterm_prints_a_rerun_line_that_works_when_pasted_back(tmp_path, monkeypatch):
    import hub_server
    from hub_server import HubServer

    folder = tmp_path / "a saved 'model'"  # a space and quotes: the rerun line must quote them
    hf_posenc.save_pretrained(hf_posenc.patch(tiny_model("llama"), "pi", factor=2.0), str(folder))
    entered, release = threading.Event(), threading.Event()
    real_commit = hub_server.Repo.commit
    stalls = [1]

    def stalled_commit(self, branch, changes):  # the first commit hangs until the client is gone, then fails
        if stalls:
            stalls.pop()
            entered.set()
            release.wait(60)
            raise ConnectionError("the client went away")
        return real_commit(self, branch, changes)

    monkeypatch.setattr(hub_server.Repo, "commit", stalled_commit)
    with HubServer(TOKEN) as hub:
        env = _env(HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN, HF_HOME=str(tmp_path / "home"), HF_HUB_DISABLE_TELEMETRY="1")
        child = subprocess.Popen([sys.executable, "-m", "hf_posenc", "upload", str(folder), "me/m", "--revision",
                                  "dev branch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert entered.wait(120), "the upload never reached its commit"
            child.send_signal(signal.SIGTERM)
            out, err = child.communicate(timeout=60)
        finally:
            release.set()
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == 143, err[-2000:]
        assert "Traceback" not in err and TOKEN not in out + err
        assert "me/m" not in hub.state.repos or "dev branch" not in hub.state.repos["me/m"].branches or \
            hub.state.repos["me/m"].commits[hub.state.repos["me/m"].branches["dev branch"]] == {}
        rerun = [line.split("Rerun: ", 1)[1] for line in err.splitlines() if "Rerun: " in line]
        assert len(rerun) == 1, err[-2000:]
        argv = shlex.split(rerun[0])
        assert argv[:2] == ["hf-posenc", "upload"]
        again = subprocess.run([sys.executable, "-m", "hf_posenc", *argv[1:]], capture_output=True, text=True, env=env,
                               timeout=300)
        assert again.returncode == 0, again.stderr[-2000:]
        repo = hub.state.repos["me/m"]
        files = repo.commits[repo.branches["dev branch"]]
        for name in ("config.json", "model.safetensors"):
            assert files[name] == (folder / name).read_bytes()


# -- accelerate launch --cpu ---------------------------------------------------------------------------------------
def test_accelerate_launch_cpu_gives_the_single_process_report_and_records_what_ran(tiny_checkpoint, tmp_path):
    """``accelerate launch --cpu --num_processes 2`` starts ONE process (accelerate's simple launcher; several CPU
    processes need ``--multi_gpu``, as tests/test_eval_scale.py does): the report must say 1, not 2, and match."""
    from hf_posenc.cli import main

    small = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn", "--lengths", "32,64",
             "--max-windows", "2", "--corpus", "python-docs", "--no-progress", "--no-plots"]
    assert main(small + ["--output", str(tmp_path / "one")]) == 0
    res = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                          "--main_process_port", _free_port(), "-m", "hf_posenc", *small,
                          "--output", str(tmp_path / "acc")], capture_output=True, text=True, env=_env(), cwd=ROOT,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("| none |") == 1
    single, launched = (json.loads((tmp_path / d / "perplexity.json").read_text()) for d in ("one", "acc"))
    assert launched["setup"]["processes"] == 1
    assert _without_timings(launched) == _without_timings(single)
    assert sorted(os.listdir(tmp_path / "acc")) == ["cells.jsonl", "perplexity.json", "perplexity.md"]
