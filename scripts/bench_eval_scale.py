"""Evaluation at scale, measured: the same passkey grid run by 1 and by 2 processes (``torchrun``; on CPU
the processes meet over gloo), and the cost of resuming (a run killed with SIGKILL halfway through its
cells, then run again) against an uninterrupted run. Every run is a fresh ``python -m hf_posenc`` process
(model loading included, as a user sees it); the reports of all runs must be identical, and the script
fails if they are not. With --write the table replaces this script's section of BENCHMARKS.md.

    python scripts/bench_eval_scale.py --write
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TITLE = "## Evaluation at scale: processes and resuming (passkey grid)"


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}


def _port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _run(launcher: list[str], argv: list[str], kill_after_cells: int | None = None) -> float:
    """Seconds the command took (until killed, when ``kill_after_cells`` cells are in its cells.jsonl)."""
    cmd = [sys.executable, *(["-m", *launcher] if launcher else []), "-m", "hf_posenc", *argv]
    cells = os.path.join(argv[argv.index("--output") + 1], "cells.jsonl")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while kill_after_cells is not None and proc.poll() is None:
        if os.path.exists(cells) and sum(1 for _ in open(cells)) - 1 >= kill_after_cells:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    _, err = proc.communicate()
    seconds = time.perf_counter() - started
    if kill_after_cells is None and proc.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed:\n{err[-3000:]}")
    return seconds


def _results(folder: str) -> dict:
    return json.load(open(os.path.join(folder, "passkey.json")))["results"]


def main(argv: list[str] | None = None) -> int:
    from hf_posenc.io.reports import emit_section, markdown_table

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, alias).")
    p.add_argument("--methods", default="none,yarn", help="comma-separated methods.")
    p.add_argument("--lengths", default="1024,2048", help="passkey prompt lengths (tokens).")
    p.add_argument("--depths", default="0.1,0.5,0.9", help="needle depths.")
    p.add_argument("--trials", type=int, default=2, help="keys per (length, depth) cell.")
    p.add_argument("--processes", type=int, default=2, help="processes of the parallel run.")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    args = p.parse_args(argv)
    command = "python scripts/bench_eval_scale.py " + shlex.join(argv)
    grid = ["eval", "passkey", "--model", args.model, "--methods", args.methods, "--lengths", args.lengths,
            "--depths", args.depths, "--trials", str(args.trials), "--no-progress", "--no-plots"]
    n_cells = len(args.methods.split(",")) * len(args.lengths.split(",")) * len(args.depths.split(","))
    work = tempfile.mkdtemp(prefix="hf_posenc-bench-scale-")
    out = {name: os.path.join(work, name) for name in ("one", "many", "killed")}
    single = _run([], grid + ["--output", out["one"]])
    parallel = _run(["torch.distributed.run", "--nproc_per_node", str(args.processes), "--master_port", _port()],
                    grid + ["--output", out["many"]])
    cut = _run([], grid + ["--output", out["killed"]], kill_after_cells=n_cells // 2)
    resumed = _run([], grid + ["--output", out["killed"]])
    if not _results(out["one"]) == _results(out["many"]) == _results(out["killed"]):
        raise SystemExit(f"the reports differ; see {work}")
    rows = [["1 process", round(single, 1), 1.0],
            [f"{args.processes} processes (torchrun)", round(parallel, 1), round(single / parallel, 2)],
            [f"killed after {n_cells // 2} of {n_cells} cells", round(cut, 1), ""],
            ["... then resumed", round(resumed, 1), ""],
            ["killed + resumed, in all", round(cut + resumed, 1), round(single / (cut + resumed), 2)]]
    text = "\n".join([
        TITLE, "",
        f"Command: `{command.strip()}`  ",
        f"Passkey on {args.model}: methods {args.methods}, lengths {args.lengths}, depths {args.depths}, "
        f"{args.trials} keys per cell ({n_cells} cells). Wall time of a fresh `python -m hf_posenc` process per "
        "run, model loading included; speed-up = 1-process seconds / these seconds. All runs gave the same "
        "report (checked by the script).", "",
        markdown_table(["run", "seconds", "speed-up vs 1 process"], rows), "",
        f"Machine: {os.cpu_count()} CPU cores; each process of the parallel run has its share of them, so on a "
        "CPU the gain is bounded by the cores (and each process loads its own model); on a GPU node each "
        "process has a device of its own.",
    ])
    emit_section(text, args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
