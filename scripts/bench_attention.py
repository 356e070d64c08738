"""Speed and memory of the remapped-position attention methods against the model's own SDPA attention, side by
side in one run.

Speed: one model, loaded once; each variant (``native`` = unpatched SDPA, then each method with its default
knobs) is patched in turn onto the same instance and timed on the same token ids (the model body's forward,
no LM head), the variants interleaved within each round so that drifts of the machine hit them alike; one
warm-up of every variant at the shortest length; the median over rounds is kept. Reported: tokens/s and the
ratio to native (target: >= 0.7 at 8k and 12k).

Memory: at ``--memory-length`` every variant runs once more in a fresh process, which resets its peak resident
memory after loading the model and the tokens (Linux ``/proc/self/clear_refs``) and reports the peak of the
forward above that level (the attention's working memory; the activations are the same for every variant).

    python scripts/bench_attention.py --lengths 2048,4096,8192,12288 --write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TITLE = "## Remapped-position attention: speed and memory vs native SDPA"
METHODS = ("self_extend", "dca", "string", "rerope", "leaky_rerope")


def tokens(model, length: int):
    import torch

    return torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))


def forward(model, variant: str, x) -> float:
    import torch

    import hf_posenc

    if variant == "native":
        hf_posenc.unpatch(model)
    else:
        hf_posenc.patch(model, variant)
    with torch.no_grad():
        start = time.perf_counter()
        model.model(input_ids=x, use_cache=False)
        return time.perf_counter() - start


def child(args) -> None:
    """One variant at one length in this fresh process: JSON with the peak RSS increment and the time."""
    from hf_posenc.runtime import load_model_and_tokenizer

    model, _, _ = load_model_and_tokenizer(args.model, attn_implementation="sdpa")
    x = tokens(model, args.memory_length)
    with open("/proc/self/clear_refs", "w") as f:  # Linux: the peak (VmHWM) restarts from the current RSS, so
        f.write("5")  # that loading (a GGUF de-quantised in memory) does not hide the forward's own peak
    base = _status_mb("VmRSS")
    seconds = forward(model, args.variant, x)
    print(json.dumps({"variant": args.variant, "increment_mb": _status_mb("VmHWM") - base, "seconds": seconds}))


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        line = next(row for row in f if row.startswith(field + ":"))
    return int(line.split()[1]) / 1024  # kB


def speed(args, variants: list[str]) -> dict[int, dict[str, list[float]]]:
    from tqdm import tqdm

    from hf_posenc.runtime import load_model_and_tokenizer

    model, _, _ = load_model_and_tokenizer(args.model, attn_implementation="sdpa")
    lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
    times: dict[int, dict[str, list[float]]] = {n: {v: [] for v in variants} for n in lengths}
    for v in variants:
        forward(model, v, tokens(model, min(lengths)))  # warm-up
    steps = tqdm(total=len(lengths) * args.rounds * len(variants), desc="forward passes")
    for n in lengths:
        x = tokens(model, n)
        for _ in range(args.rounds):
            for v in variants:
                times[n][v].append(forward(model, v, x))
                steps.update()
    steps.close()
    return times


def memory(args, variants: list[str]) -> dict[str, dict]:
    out = {}
    for v in variants:
        cmd = [sys.executable, __file__, "--variant", v, "--model", args.model, "--memory-length", str(args.memory_length)]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(run.stderr[-2000:])
        out[v] = json.loads(run.stdout.strip().splitlines()[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    from hf_posenc.eval.report import emit_section, markdown_table

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, .gguf, alias); default knobs of "
                                                            "every method are derived from its context.")
    p.add_argument("--lengths", default="2048,4096,8192,12288", help="comma-separated tokens per forward pass.")
    p.add_argument("--rounds", type=int, default=1, help="timed rounds (each runs every variant once per length).")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated attention-level methods to compare.")
    p.add_argument("--memory-length", type=int, default=12288,
                   help="tokens of the fresh-process memory measurement (0: skip it).")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    p.add_argument("--variant", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.variant:
        child(args)
        return 0
    variants = ["native", *[m.strip() for m in args.methods.split(",") if m.strip()]]
    times = speed(args, variants)
    rows, at = [], {}
    for n, per in times.items():
        native = statistics.median(per["native"])
        for v in variants:
            t = statistics.median(per[v])
            ratio = round(native / t, 2)  # rounded once: the table and the summary line show the same number
            rows.append([n, v, round(n / t, 1), round(t, 2), ratio])
            at.setdefault(v, {})[n] = ratio
    mem = memory(args, variants) if args.memory_length else {}
    command = "python scripts/bench_attention.py " + shlex.join(argv)
    lines = [
        TITLE, "",
        f"Command: `{command.strip()}`  ",
        f"Model {args.model}, SDPA, the model body's forward (no LM head), batch 1, every method with its default "
        f"knobs; median of {args.rounds} interleaved round(s) after one warm-up; {platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads.", "",
        markdown_table(["tokens", "variant", "tokens/s", "seconds", "ratio to native"], rows), "",
        "**Ratio to native: " + "; ".join(
            f"{v} " + ", ".join(f"{r:.2f} at {n}" for n, r in at[v].items()) for v in variants[1:]) + "** "
        "(target >= 0.7 at 8k and 12k).",
    ]
    if mem:
        lines += ["", f"Peak memory above the loaded model, one fresh process per variant, {args.memory_length} tokens:", "",
                  markdown_table(["variant", "peak increment (MB)", "seconds"],
                                 [[v, round(r["increment_mb"]), round(r["seconds"], 1)] for v, r in mem.items()])]
    emit_section("\n".join(lines), args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
