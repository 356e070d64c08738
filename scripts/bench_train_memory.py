"""Peak memory and speed of one training step at long lengths (issue 44 item 1): the model's own loss over its
whole ``[tokens x vocab]`` logits vs hf_posenc's chunked LM-head loss, each with and without activation
checkpointing, side by side in one run, on SmolLM2-135M (default) patched with YaRN to cover the length.

Each cell (length x loss x checkpointing) runs in its own fresh process, which trains ``--steps`` optimizer steps
of one sequence (AdamW, every weight) and reports its peak resident memory above the level reached after loading
the model and the data and making the gradients' and the optimizer's state (a step on zero gradients), and the
tokens per second of its steps.
Results are printed and, with --write, recorded in BENCHMARKS.md together with this command.

    python scripts/bench_train_memory.py --lengths 2048,4096 --write
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

from _bench import comma_list, prompt_ids

VARIANTS = [("full logits", False, False), ("full logits", True, False), ("chunked", False, True),
            ("chunked", True, True)]  # (loss, activation checkpointing, chunked)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(args) -> None:
    import torch

    import hf_posenc
    from hf_posenc.eval.scoring import chunked_lm_loss
    from hf_posenc.runtime import load_model_and_tokenizer

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
    base = peak_rss_mb()
    start = time.time()
    losses = [step() for _ in range(args.steps)]
    seconds = time.time() - start
    print(json.dumps({"baseline_mb": base, "increment_mb": peak_rss_mb() - base, "loss": losses[0],
                      "tokens_per_s": args.length * args.steps / seconds}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model to train (Hub id, folder, .gguf, alias)")
    p.add_argument("--lengths", type=comma_list(int), default=[2048, 4096], help="sequence lengths in tokens")
    p.add_argument("--steps", type=int, default=1, help="timed optimizer steps per cell")
    p.add_argument("--write", action="store_true", help="record the result in BENCHMARKS.md")
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", type=int, help=argparse.SUPPRESS)
    p.add_argument("--chunked", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.length:
        return child(args)
    rows = []
    for length in args.lengths:
        for loss, checkpointing, chunked in VARIANTS:
            cmd = [sys.executable, __file__, "--model", args.model, "--length", str(length), "--steps",
                   str(args.steps), "--checkpointing", str(int(checkpointing)), "--chunked", str(int(chunked))]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(out.stderr[-2000:])
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append((length, loss, checkpointing, r))
            print(length, loss, checkpointing, r, flush=True)
    command = "python scripts/bench_train_memory.py " + " ".join(a for a in sys.argv[1:] if a != "--write")
    lines = [
        "## Training memory at long lengths (chunked LM-head loss, activation checkpointing)",
        "",
        f"Command: `{command.strip()} --write`  ",
        f"Model {args.model} (YaRN to the length past its context), one sequence per step, AdamW on every weight, "
        f"{args.steps} timed step(s); CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores); "
        "each cell in a fresh process; peak RSS above the level with the weights, their gradients and the "
        "optimizer's state in memory (what the activations and the logits add).",
        "",
        "| length | loss | activation checkpointing | peak increment (MB) | ratio to full logits, no checkpointing "
        "| tokens/s | loss (first step) |",
        "|---|---|---|---|---|---|---|",
    ]
    for length, loss, checkpointing, r in rows:
        naive = next(x for n, lo, c, x in rows if n == length and lo == "full logits" and not c)
        lines.append(f"| {length} | {loss} | {'on' if checkpointing else 'off'} | {r['increment_mb']:.0f} | "
                     f"{r['increment_mb'] / naive['increment_mb']:.2f} | {r['tokens_per_s']:.0f} | {r['loss']:.4f} |")
    text = "\n".join(lines + [""])
    print(text)
    if args.write:
        from hf_posenc.eval.report import replace_markdown_section

        replace_markdown_section(os.path.join(os.path.dirname(__file__), "..", "BENCHMARKS.md"), text)


if __name__ == "__main__":
    main()
