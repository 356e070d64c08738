"""Peak memory and speed of one training step at long lengths (issue 44 item 1): the model's own loss over its
whole ``[tokens x vocab]`` logits vs hf_posenc's chunked LM-head loss, each with and without activation
checkpointing, side by side in one run, on SmolLM2-135M (default) patched with YaRN to cover the length.

Each cell (length x loss x checkpointing) runs in its own fresh process, which trains ``--steps`` optimizer steps
of one sequence (AdamW, every weight) and reports the peak of its resident memory during those steps above its
resident memory just before them (after loading the model and the data and making the gradients' and the
optimizer's state with a step on zero gradients; the peak restarts there, so that the setup's own peak does not hide
it), and the tokens per second of its steps. The process runs with glibc's ``MALLOC_MMAP_THRESHOLD_`` at 128 KiB:
every larger block (every activation) is mapped for itself and given back to the system when freed, so that
resident memory follows what the tensors hold; with glibc's default (a threshold that grows up to 32 MiB), freed
blocks stay in the process and are reused in an order that changes from run to run, and the same cell measured
1,200 MB and 1,430 MB at 2,048 tokens, 2,655 MB and 3,610 MB (by the former measure) at 8,192.
Each cell runs under a data-memory limit (``--memory-limit-gb``, default the machine's memory less 2 GiB): a cell
that needs more is reported as out of memory at that limit instead of pushing the machine into swap or the kernel's
OOM killer. Finished cells are kept in ``--cells`` (one JSON line each, with the settings that made them) and a rerun
computes only the missing ones; ``--variants`` measures some of the four (loss x checkpointing) only, the table
showing a kept cell of an earlier measure, marked, for the others. Results are printed and, with --write, recorded
in BENCHMARKS.md together with this command.

    python scripts/bench_train_memory.py --lengths 2048,4096,8192,16384 --write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

from _bench import ROOT, comma_list, prompt_ids, rel, reset_peak_rss, status_mb

VARIANTS = {"full": ("full logits", False, False), "full+checkpointing": ("full logits", True, False),
            "chunked": ("chunked", False, True), "chunked+checkpointing": ("chunked", True, True)}
# name: (loss, activation checkpointing, chunked)
MEASURE = "rss-peak-reset, mmap threshold 128 KiB"  # in each cell's key: a cell of another measure is not reused
MMAP_THRESHOLD = 128 * 1024  # bytes; glibc maps every block above it for itself and unmaps it when freed


OUT_OF_MEMORY = ("can't allocate memory", "cannot allocate memory", "out of memory", "MemoryError",
                 "std::bad_alloc")


def child(args) -> None:
    if args.memory_limit_gb:  # private writable memory (what malloc and torch's allocator take), in bytes
        limit = int(args.memory_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    import torch

    import hf_posenc
    from hf_posenc.checkpoints.runtime import load_model_and_tokenizer
    from hf_posenc.eval.scoring import chunked_lm_loss

    torch.manual_seed(0)
    model, tok, _ = load_model_and_tokenizer(args.model)
    factor = max(1.0, args.length / model.config.max_position_embeddings)
    if factor > 1:
        hf_posenc.patch(model, "yarn", factor=factor)
    ids, _ = prompt_ids(tok, args.length, model.config.vocab_size)
    model.train()
    if args.checkpointing:
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> float:
        if args.chunked:
            total, count = chunked_lm_loss(model, ids)
            loss = total / count
        else:
            loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    for param in model.parameters():  # gradients and the optimizer's state exist from here on: the baseline
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    base = reset_peak_rss()
    start = time.time()
    losses = [step() for _ in range(args.steps)]
    seconds = time.time() - start
    print(json.dumps({"baseline_mb": base, "increment_mb": status_mb("VmHWM") - base,
                      "kept_after_mb": status_mb("VmRSS") - base, "loss": losses[0],
                      "tokens_per_s": args.length * args.steps / seconds}))


def total_memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model to train (Hub id, folder, .gguf, alias)")
    p.add_argument("--lengths", type=comma_list(int), default=[2048, 4096], help="sequence lengths in tokens")
    p.add_argument("--variants", type=comma_list(str), default=list(VARIANTS),
                   help=f"the (loss x checkpointing) cells to measure, of {', '.join(VARIANTS)}; the table shows "
                        "the others from kept cells of an earlier measure where there are some")
    p.add_argument("--steps", type=int, default=1, help="timed optimizer steps per cell")
    p.add_argument("--memory-limit-gb", type=float, default=round(max(1.0, total_memory_gb() - 2), 1),
                   help="data-memory limit of each cell's process in GiB (0: none); a cell that needs more is "
                        "reported as out of memory at this limit")
    p.add_argument("--cells", default=os.path.join(ROOT, "benchmarks", "train_memory", "cells.jsonl"),
                   help="file of the finished cells (JSON lines); a rerun computes only the missing ones")
    p.add_argument("--write", action="store_true", help="record the result in BENCHMARKS.md")
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", type=int, help=argparse.SUPPRESS)
    p.add_argument("--chunked", type=int, help=argparse.SUPPRESS)
    return p


def cell_key(args, length: int, checkpointing: bool, chunked: bool) -> dict:
    """What makes a cell's numbers: a kept cell is reused only when every field is the same."""
    import torch

    return {"model": args.model, "length": length, "checkpointing": checkpointing, "chunked": chunked,
            "steps": args.steps, "memory_limit_gb": args.memory_limit_gb, "cores": os.cpu_count(),
            "torch": torch.__version__, "measure": MEASURE}


def legacy_key(key: dict) -> dict:
    """The key the cell of ``key`` had before the measure was in it (peak ru_maxrss above its value after the setup,
    glibc's default allocator), which the setup's own peak hid part of."""
    return {k: v for k, v in key.items() if k != "measure"}


def kept_cells(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                kept.append(json.loads(line))
            except ValueError:  # a line cut short by a kill: that cell is measured again
                continue
    return kept


def run_cell(args, length: int, checkpointing: bool, chunked: bool) -> dict:
    """One cell in a fresh process: its JSON result, or ``{"out_of_memory": True}`` when it passed the limit."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD))
    cmd = [sys.executable, __file__, "--model", args.model, "--length", str(length), "--steps", str(args.steps),
           "--checkpointing", str(int(checkpointing)), "--chunked", str(int(chunked)),
           "--memory-limit-gb", str(args.memory_limit_gb)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        if args.memory_limit_gb and any(m in out.stderr for m in OUT_OF_MEMORY):
            return {"out_of_memory": True}
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(args) -> list[tuple]:
    """Every cell of the grid: of ``--variants``, computed unless ``--cells`` has it (each new one appended there as
    it ends); of the others, the kept cell of this measure, else of the earlier one (its result marked ``legacy``),
    else none."""
    kept, rows = kept_cells(args.cells), []
    os.makedirs(os.path.dirname(os.path.abspath(args.cells)), exist_ok=True)
    for length in args.lengths:
        for name, (loss, checkpointing, chunked) in VARIANTS.items():
            key = cell_key(args, length, checkpointing, chunked)
            r = next((c["result"] for c in kept if c["key"] == key), None)
            if r is None and name not in args.variants:
                r = next(({**c["result"], "legacy": True} for c in kept if c["key"] == legacy_key(key)), None)
                if r is None:
                    continue
            if r is None:
                r = run_cell(args, length, checkpointing, chunked)
                with open(args.cells, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "result": r}) + "\n")
            rows.append((length, loss, checkpointing, r))
            print(length, loss, checkpointing, r, flush=True)
    return rows


def row(rows: list[tuple], length: int, loss: str, checkpointing: bool, r: dict) -> str:
    """One table row; a cell of the earlier measure is marked with a dagger, and a ratio is given only between two
    cells of the same measure."""
    mark = " †" if r.get("legacy") else ""
    if r.get("out_of_memory"):
        return (f"| {length} | {loss} | {'on' if checkpointing else 'off'} | out of memory (limit reached){mark} | – "
                "| – | – |")
    naive = next((x for n, lo, c, x in rows if n == length and lo == "full logits" and not c), None)
    comparable = naive is not None and not naive.get("out_of_memory") and naive.get("legacy") == r.get("legacy")
    ratio = f"{r['increment_mb'] / naive['increment_mb']:.2f}" if comparable else "–"
    return (f"| {length} | {loss} | {'on' if checkpointing else 'off'} | {r['increment_mb']:.0f}{mark} | {ratio} | "
            f"{r['tokens_per_s']:.0f} | {r['loss']:.4f} |")


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        parser.error(f"--variants: {', '.join(unknown) or 'none given'}; choose among {', '.join(VARIANTS)}")
    if args.length:
        return child(args)
    rows = measure(args)
    command = "python scripts/bench_train_memory.py " + " ".join(a for a in sys.argv[1:] if a != "--write")
    legacy = any(r.get("legacy") for *_, r in rows)
    limit = (f"each cell's process limited to {args.memory_limit_gb:g} GiB of data memory (of "
             f"{total_memory_gb():.0f} GiB); " if args.memory_limit_gb else "")
    lines = [
        "## Training memory at long lengths (chunked LM-head loss, activation checkpointing)",
        "",
        f"Command: `{command.strip()} --write`  ",
        f"Model {args.model} (YaRN to the length past its context), one sequence per step, AdamW on every weight, "
        f"{args.steps} timed step(s); CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores); "
        f"each cell in a fresh process; {limit}peak RSS above the level with the weights, their gradients and the "
        "optimizer's state in memory (what the activations and the logits add), the peak restarted at that level "
        "(/proc/self/clear_refs) and glibc's MALLOC_MMAP_THRESHOLD_ at 128 KiB, so that freed activations leave the "
        "process (with glibc's default they stay, and the same cell's peak varied by up to 1 GB from run to run). "
        "Peak memory does not depend on what else the machine runs; tokens/s is one step's wall clock, slower in a "
        "cell that shared the cores with other work (a cell is measured again when its line is deleted from "
        f"{rel(args.cells)}).",
        "",
        "| length | loss | activation checkpointing | peak increment (MB) | ratio to full logits, no checkpointing "
        "| tokens/s | loss (first step) |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [row(rows, *r) for r in rows]
    if legacy:
        lines += ["", "† measured by the earlier measure: peak ru_maxrss above its value after the setup, which the "
                  "setup's own peak (~300 MB above the level before the step) hid part of, with glibc's default "
                  "allocator, whose freed blocks made the same cell vary by up to 1 GB from run to run: comparable "
                  "neither with the other rows nor with each other (by it, chunked with checkpointing gave 2,655 MB at "
                  "8,192 tokens and 1,758 MB at 16,384, and 3,610 MB at 8,192 when run again). Their tokens/s come "
                  "from another run, on a machine less busy. These cells need up to 21 GiB; "
                  "`python scripts/bench_train_memory.py --lengths 2048,4096,8192,16384 --write` measures them "
                  "again."]
    text = "\n".join(lines + [""])
    print(text)
    if args.write:
        from hf_posenc.io.reports import replace_markdown_section

        replace_markdown_section(os.path.join(ROOT, "BENCHMARKS.md"), text)


if __name__ == "__main__":
    main()
