"""scripts/_bench.py's run_needles_far_first: the needles out of the truncated model's reach are computed first, and
the run over every depth resumes them (the same keys) and reports every depth."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))

import _bench  # noqa: E402


def _argv(model: str, output: str, depths: str) -> list[str]:
    return ["eval", "passkey", "--model", model, "--lengths", "256", "--original-context", "128", "--depths", depths,
            "--trials", "2", "--methods", "none", "--device", "cpu", "--output", output]


def test_far_depths_run_first_then_every_depth_resumes_them(tiny_checkpoint, tmp_path, monkeypatch):
    calls = []
    real = _bench.run_cli
    monkeypatch.setattr(_bench, "run_cli", lambda argv, no_progress=False: (calls.append(argv), real(argv, True)))
    argv = _argv(tiny_checkpoint, str(tmp_path / "needles"), "0.1,0.3,0.5,0.9")
    _bench.run_needles_far_first(argv, 128, 256)
    assert [a[a.index("--depths") + 1] for a in calls] == ["0.1,0.3", "0.1,0.3,0.5,0.9"]
    with open(tmp_path / "needles" / "passkey.json", encoding="utf-8") as f:
        report = json.load(f)
    assert report["setup"]["depths"] == [0.1, 0.3, 0.5, 0.9]
    cells = _cells(tmp_path / "needles")
    assert [c["key"][1] for c in cells] == [0.1, 0.3, 0.5, 0.9]  # the far cells resumed, not computed again

    once = tmp_path / "once"  # the grid in one pass: the same passkeys at the same places
    _bench.run_needles_far_first(_argv(tiny_checkpoint, str(once), "0.1,0.3,0.5,0.9"), 256, 256)
    assert [s["key"] for c in _cells(once) for s in c["result"]["samples"]] == \
        [s["key"] for c in cells for s in c["result"]["samples"]]


def _cells(folder) -> list[dict]:
    with open(folder / "cells.jsonl", encoding="utf-8") as f:
        return [c for c in map(json.loads, f) if c["kind"] == "cell"]


def test_depths_not_leading_the_list_run_in_one_pass(monkeypatch):
    calls = []
    monkeypatch.setattr(_bench, "run_cli", lambda argv, no_progress=False: calls.append(argv))
    _bench.run_needles_far_first(_argv("m", "o", "0.9,0.1"), 128, 256)  # 0.1 is far but not first: keys would differ
    _bench.run_needles_far_first(_argv("m", "o", "0.5,0.9"), 128, 256)  # nothing far
    _bench.run_needles_far_first(_argv("m", "o", "0.1,0.3"), 128, 256)  # every depth far
    assert [a[a.index("--depths") + 1] for a in calls] == ["0.9,0.1", "0.5,0.9", "0.1,0.3"]
