"""Short fine-tunes of patched SmolLM2 on CPU, rerunnable: the training loss and the held-out perplexity
(a book not trained on) before and after, for each method, through ``hf_posenc.training.finetune`` (the same code
as ``hf-posenc finetune``).

Checkpoints go to --output (``runs/`` by default, not versioned); the reports (JSON with every loss,
Markdown, loss plots) are copied to ``benchmarks/finetune/``; with --write the table replaces this
script's section of BENCHMARKS.md, with the exact command.

    python scripts/bench_finetune.py --write
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BOOKS = os.path.join(ROOT, "..", "shared", "data", "books")
TITLE = "## Fine-tuning patched SmolLM2 on CPU (alibi swap, yarn)"


def main(argv: list[str] | None = None) -> int:
    from hf_posenc.config import PosEncConfig
    from hf_posenc.io.documents import read_text_file
    from hf_posenc.io.reports import emit_section, markdown_table
    from hf_posenc.training.finetune import finetune
    from hf_posenc.training.settings import TrainSettings

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="base model (Hub id, folder, .gguf, alias).")
    p.add_argument("--runs", default="alibi:40:3e-4,yarn:40:2e-5",
                   help="comma-separated METHOD:STEPS:LEARNING_RATE runs (yarn uses --factor).")
    p.add_argument("--factor", type=float, default=2.0, help="factor of the methods that take one.")
    p.add_argument("--train", default="pg1342.txt,pg1513.txt", help="training books in ../shared/data/books.")
    p.add_argument("--heldout", default="pg84.txt", help="held-out book (never trained on).")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per training sequence and eval window.")
    p.add_argument("--eval-windows", type=int, default=4, help="held-out windows of --seq-len tokens.")
    p.add_argument("--seed", type=int, default=0, help="random seed.")
    p.add_argument("--output", default=os.path.join(ROOT, "runs", "finetune"), help="where checkpoints go.")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    args = p.parse_args(argv)
    command = "python scripts/bench_finetune.py " + shlex.join(argv)
    train = [read_text_file(os.path.join(BOOKS, b)) for b in args.train.split(",")]
    held = [read_text_file(os.path.join(BOOKS, args.heldout))]
    rows, started = [], time.time()
    for run in args.runs.split(","):
        method, steps, lr = run.split(":")
        spec = PosEncConfig(method, args.factor if method not in ("alibi", "nope") else None)
        out = os.path.join(args.output, method)
        training = TrainSettings(seq_len=args.seq_len, steps=int(steps), learning_rate=float(lr),
                                 eval_windows=args.eval_windows, seed=args.seed)
        report = finetune(model=args.model, config=spec, train_docs=train, eval_docs=held, output=out,
                          training=training, command=command)
        dest = os.path.join(ROOT, "benchmarks", "finetune", method)
        os.makedirs(dest, exist_ok=True)
        for name in ("finetune.json", "finetune.md", "finetune_loss.png"):
            shutil.copy(os.path.join(out, "hf_posenc_eval", name), dest)
        losses = [x["loss"] for x in report["losses"]]
        k = min(5, len(losses))
        rows.append([method, int(steps), float(lr), round(sum(losses[:k]) / k, 3), round(sum(losses[-k:]) / k, 3),
                     round(report["heldout_before"]["ppl"], 2), round(report["heldout_after"]["ppl"], 2),
                     round(report["setup"]["seconds"] / 60, 1)])
    text = "\n".join([
        TITLE, "",
        f"Command: `{command.strip()}`  ",
        f"Model {args.model}, trained on {args.train} packed into {args.seq_len}-token sequences (batch 1, AdamW, "
        f"cosine schedule, gradient checkpointing), held-out perplexity on {args.heldout} "
        f"({args.eval_windows} windows of {args.seq_len} tokens) before and after; {platform.machine()}, "
        f"{os.cpu_count()} cores. Losses per step and plots: `benchmarks/finetune/<method>/`.", "",
        markdown_table(["method", "steps", "learning rate", "train loss (first 5)", "train loss (last 5)",
                        "held-out ppl before", "held-out ppl after", "minutes"], rows), "",
        f"Wall time: {(time.time() - started) / 60:.1f} min.",
    ])
    emit_section(text, args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
