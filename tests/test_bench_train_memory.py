"""scripts/bench_train_memory.py's measure: the peak restarts before the step, so that the setup's
own peak does not hide the step's; cells of the earlier measure are never reused as this one's, and are shown marked
only for the variants not measured."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))

import _bench  # noqa: E402
import bench_train_memory as B  # noqa: E402

PEAK_CHECK = """
import sys
sys.path.insert(0, sys.argv[1])
import _bench
block = bytearray(256 * 2**20)  # a peak above what follows
block[:: 4096] = b"x" * len(block[:: 4096])
del block
base = _bench.reset_peak_rss()
print(_bench.status_mb("VmHWM") - base)  # the 256 MB freed before no longer count
block = bytearray(128 * 2**20)
block[:: 4096] = b"x" * len(block[:: 4096])  # resident: every page touched
print(_bench.status_mb("VmHWM") - base)
"""


def test_the_peak_restarts_from_the_memory_now():
    """In a fresh Python (a test process's own earlier peak, gigabytes under pytest -n, would hide the 128 MB)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", PEAK_CHECK, os.path.dirname(_bench.__file__)], capture_output=True,
                          text=True, check=True)
    after_reset, after_block = map(float, done.stdout.split())
    assert after_reset < 64 and after_block > 100, (after_reset, after_block)


def _args(tmp_path, variants):
    args = B.build_parser().parse_args(["--lengths", "2048", "--variants", ",".join(variants), "--cells",
                                        str(tmp_path / "cells.jsonl"), "--memory-limit-gb", "21.5"])
    return args


def test_cells_of_the_earlier_measure_are_measured_again_or_shown_marked(tmp_path, monkeypatch):
    args = _args(tmp_path, ["chunked+checkpointing"])
    old = {"baseline_mb": 2716.0, "increment_mb": 1000.0, "loss": 3.15, "tokens_per_s": 130.0}
    with open(args.cells, "w", encoding="utf-8") as f:
        for _loss, checkpointing, chunked in B.VARIANTS.values():
            key = B.legacy_key(B.cell_key(args, 2048, checkpointing, chunked))
            f.write(json.dumps({"key": key, "result": old}) + "\n")
    ran = []

    def run_cell(args, length, checkpointing, chunked):
        ran.append((length, checkpointing, chunked))
        return {"baseline_mb": 2000.0, "increment_mb": 500.0, "kept_after_mb": 20.0, "loss": 3.15,
                "tokens_per_s": 131.0}

    monkeypatch.setattr(B, "run_cell", run_cell)
    rows = B.measure(args)
    assert ran == [(2048, True, True)]  # the one variant asked for: its earlier cell is not reused
    assert [r.get("legacy", False) for *_, r in rows] == [True, True, True, False]
    table = [B.row(rows, *r) for r in rows]
    assert table[0] == "| 2048 | full logits | off | 1000 † | 1.00 | 130 | 3.1500 |"
    assert table[3] == "| 2048 | chunked | on | 500 | – | 131 | 3.1500 |"  # no ratio across measures
    assert B.measure(args) == rows and len(ran) == 1  # kept now: a rerun measures nothing


def test_a_variant_not_asked_for_and_never_measured_is_left_out(tmp_path, monkeypatch):
    args = _args(tmp_path, ["chunked"])
    monkeypatch.setattr(B, "run_cell", lambda *a: {"baseline_mb": 1.0, "increment_mb": 2.0, "loss": 3.0,
                                                  "tokens_per_s": 4.0})
    assert [(lo, c) for _, lo, c, _ in B.measure(args)] == [("chunked", False)]
