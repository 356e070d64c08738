"""Forward speed of the family swaps against the model's own RoPE, side by side in one run.

One model is loaded once; each variant (``rope`` = unpatched, then the swaps) is patched in turn onto
the same instance and timed on the same token ids. Rounds interleave the variants (rope, alibi, nope,
..., rope, alibi, ...) so that drifts of the machine hit them alike; the median over rounds is kept.
Reported: tokens/s per variant and the ratio to ``rope`` (target for alibi: >= 0.9). With
``--backward`` each timed step is a training step's forward and backward pass instead.

    python scripts/bench_swap_speed.py --lengths 512,1024,2048,4096,8192 --rounds 3 --write
    python scripts/bench_swap_speed.py --lengths 1024,2048 --rounds 3 --backward --write
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TITLES = {False: "## Forward speed of family swaps vs RoPE",
          True: "## Training-step speed (forward + backward) of family swaps vs RoPE"}


def main(argv: list[str] | None = None) -> int:
    import torch

    from hf_posenc.checkpoints.runtime import load_model_and_tokenizer
    from hf_posenc.io.reports import emit_section, markdown_table

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, .gguf, alias).")
    p.add_argument("--lengths", default="1024,2048", help="comma-separated tokens per forward pass.")
    p.add_argument("--batch", type=int, default=1, help="sequences per forward pass.")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds at least (each runs every variant once).")
    p.add_argument("--min-seconds", type=float, default=10.0,
                   help="more rounds, until each variant has run this long in all: short inputs get enough "
                        "samples for the median to shrug off a moment of load on the machine.")
    p.add_argument("--variants", default="rope,alibi,nope,sinusoidal",
                   help="comma-separated: rope (the unpatched model) and swap methods.")
    p.add_argument("--attn-implementation", default="sdpa", help="attention implementation of the model.")
    p.add_argument("--backward", action="store_true",
                   help="time forward + backward (a training step without the optimizer) instead of forward only; "
                        "written to its own section of BENCHMARKS.md.")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's).")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if "rope" not in variants:
        raise SystemExit("--variants must include rope (the reference)")
    model, _, _ = load_model_and_tokenizer(args.model, attn_implementation=args.attn_implementation)
    lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
    rows, alibi = [], {}
    for length in lengths:
        x = torch.randint(0, model.config.vocab_size, (args.batch, length), generator=torch.Generator().manual_seed(0))
        speed, times = measure(model, x, variants, args.rounds, args.backward, args.min_seconds)
        for v in variants:
            rows.append([length, v, round(speed[v], 1), round(statistics.median(times[v]), 3), len(times[v]),
                         round(speed[v] / speed["rope"], 3)])
        if "alibi" in speed:
            alibi[length] = speed["alibi"] / speed["rope"]
    command = "python scripts/bench_swap_speed.py " + shlex.join(argv)
    text = "\n".join([
        TITLES[args.backward], "",
        f"Command: `{command.strip()}`  ",
        f"Model {args.model}, batch {args.batch}, attention {args.attn_implementation}, model body "
        f"{'forward + backward of the mean square of its output' if args.backward else 'forward'} (no LM head), "
        f"median of >= {args.rounds} interleaved rounds (and >= {args.min_seconds:g} s per variant) after one "
        f"warm-up; {platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads.",
        "",
        markdown_table(["tokens", "variant", "tokens/s", "seconds (median)", "rounds", "ratio to rope"], rows),
        "",
        "**alibi / rope: " + ", ".join(f"{r:.2f} at {n}" for n, r in alibi.items()) + "** (target >= 0.9)."
        if alibi else "",
    ])
    emit_section(text, args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


def measure(model, x, variants: list[str], rounds: int, backward: bool = False, min_seconds: float = 0.0):
    """tokens/s and the times of each variant on ``x``, rounds interleaved, one warm-up each; ``backward``:
    each step also back-propagates the mean square of the body's output to the weights."""
    import torch

    import hf_posenc

    def run(variant: str) -> float:
        if variant == "rope":
            hf_posenc.unpatch(model)
        else:
            hf_posenc.patch(model, variant)
        with torch.set_grad_enabled(backward):
            start = time.perf_counter()
            out = model.model(input_ids=x, use_cache=False)  # the body: attention and positions, not the LM head
            if backward:
                out.last_hidden_state.float().square().mean().backward()
            elapsed = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return elapsed

    for v in variants:  # warm-up
        run(v)
    times: dict[str, list[float]] = {v: [] for v in variants}
    while len(times["rope"]) < rounds or min(sum(t) for t in times.values()) < min_seconds:
        for v in variants:
            times[v].append(run(v))
    hf_posenc.unpatch(model)
    tokens = x.numel()
    return {v: tokens / statistics.median(t) for v, t in times.items()}, times


if __name__ == "__main__":
    sys.exit(main())
