"""Helpers shared by the benchmark scripts (each is run as ``python scripts/<name>.py``, which puts this folder
on ``sys.path``)."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def comma_list(kind):
    """An argparse type: ``"a,b,c"`` -> ``[kind(a), kind(b), kind(c)]``."""
    def parse(text: str):
        return [kind(x) for x in text.split(",") if x.strip()]
    return parse


def rel(path: str) -> str:
    """``path`` relative to the repository root (as the commands in BENCHMARKS.md are run from there)."""
    return os.path.relpath(path, ROOT)


def status_mb(field: str) -> float:
    """``field`` of ``/proc/self/status`` in MB (Linux): ``VmRSS`` is the resident memory now, ``VmHWM`` its peak."""
    with open("/proc/self/status", encoding="ascii") as f:
        line = next(row for row in f if row.startswith(field + ":"))
    return int(line.split()[1]) / 1024  # kB


def reset_peak_rss() -> float:
    """Restarts this process's resident-memory peak (``VmHWM``) from its resident memory now (Linux
    ``/proc/self/clear_refs``), so that what ran before (a GGUF de-quantised in memory) does not hide the peak of what
    runs next; returns the resident memory now in MB."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    return status_mb("VmRSS")


BOOK = os.path.join(ROOT, "..", "shared", "data", "books", "pg84.txt")


def prompt_ids(tok, n: int, vocab: int):
    """The first ``n`` tokens of the shared book (pg84.txt) as ``[1, n]`` ids and the book's name; random tokens
    (seed 0) when the book is absent or too short."""
    import torch

    if os.path.isfile(BOOK):
        with open(BOOK, encoding="utf-8") as f:
            ids = tok(f.read(), return_tensors="pt").input_ids[:, :n]
        if ids.shape[1] == n:
            return ids, os.path.basename(BOOK)
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(0)), "random tokens"


def greedy_decode(model, cache, first, start: int, steps: int):
    """Greedy decoding of ``steps`` tokens from ``cache`` (which they extend), the first fed being ``first`` at
    position ``start``: (seconds, the tokens, the last logits)."""
    import time

    import torch

    from hf_posenc.adapters.cache_argument import with_cache

    out, token = [], first
    with torch.no_grad():
        begin = time.perf_counter()
        for i in range(steps):
            pos = torch.tensor([[start + i]])
            logits = model(input_ids=token, **with_cache(model, cache), position_ids=pos, use_cache=True).logits[:, -1]
            token = logits.argmax(-1, keepdim=True)
            out.append(token)
        return time.perf_counter() - begin, torch.cat(out, -1), logits.float()


def load_json(path: str) -> dict | None:
    """The JSON report at ``path``, or None before it is written."""
    import json

    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def require_book(path: str) -> None:
    """SystemExit naming ``path`` unless it is a file (the benchmark books live outside the repository)."""
    if not os.path.isfile(path):
        raise SystemExit(f"--text-file {path}: no such file (the books live in ../shared/data/books/)")


def run_cli(argv: list[str], no_progress: bool = False) -> None:
    """``hf-posenc ARGV`` run from the repository root, in this process; SystemExit if it fails."""
    from hf_posenc.cli import main as cli

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        if cli(argv + (["--no-progress"] if no_progress else [])) != 0:
            raise SystemExit(f"hf-posenc {' '.join(argv[:2])} failed")
    finally:
        os.chdir(cwd)


def run_needles_far_first(argv: list[str], context: int, length: int, no_progress: bool = False) -> None:
    """``hf-posenc eval passkey ARGV`` in two passes: first the ``--depths`` whose needle lies out of reach of the
    model truncated to its last ``context`` of ``length`` tokens (depth < 1 - context / length: the informative
    cells, computed first so an interrupted run has them for every variant), then every depth, which resumes those
    cells and writes the report of all of them. A needle's key comes from its cell's place in the grid, so the first
    pass runs only when those depths lead the list (as in the ascending default): then its cells are the same."""
    i = argv.index("--depths") + 1
    depths = argv[i].split(",")
    far = [d for d in depths if float(d) < 1 - context / length]
    if far and far == depths[:len(far)] and len(far) < len(depths):
        run_cli([*argv[:i], ",".join(far), *argv[i + 1:]], no_progress)
    run_cli(argv, no_progress)


def tuned_run_flags(p, output: str, depths: str, trials: int) -> None:
    """The flags of a benchmark measuring on one book with the knobs ``hf-posenc tune`` chose on another: where the
    tune runs are, the book, the passkey grid, the device, the output folder, --write and --no-progress."""
    p.add_argument("--tune", default=os.path.join(ROOT, "benchmarks", "tune"),
                   help="folder of the tune runs (<T>/tune.json and <T>/space.json) the knobs are taken from.")
    p.add_argument("--text-file", default=BOOK, help="the book measured on (default: Frankenstein).")
    p.add_argument("--depths", default=depths, help="passkey / needle depths.")
    p.add_argument("--trials", type=int, default=trials, help="keys per depth.")
    p.add_argument("--device", default="cpu", help="torch device.")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", output), help="folder of the runs.")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars.")


def run_then_write(args, argv: list[str], run_all, section) -> int:
    """A resumable benchmark's last steps: ``run_all(args)`` unless ``--no-run``, then its section printed (and
    written into BENCHMARKS.md with ``--write``), its command recorded without ``--no-run``."""
    from hf_posenc.io.reports import emit_section

    if not args.no_run:
        run_all(args)
    emit_section(section(args, [a for a in argv if a != "--no-run"]), args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0
