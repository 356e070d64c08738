"""Peak memory of perplexity scoring: hf_posenc's chunked LM-head loss vs the naive
``model(ids, labels=ids)``, side by side in one run, on SmolLM2-135M (default) at 8,192 tokens.

Each variant runs in its own fresh process (so that one's allocations cannot hide the other's), which
reports its peak resident memory above the level reached after loading the model and the data. The
ratio of the two increments is the number that matters (target: <= 0.6). Results are printed and, with
--write, recorded in BENCHMARKS.md together with this command.

    python scripts/bench_ppl_memory.py --length 8192 --write
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


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(args) -> None:
    import torch

    from hf_posenc.checkpoints.runtime import load_model_and_tokenizer
    from hf_posenc.eval.scoring import token_nll
    from hf_posenc.io.documents import read_text_file, tokenize_documents

    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tok, _ = load_model_and_tokenizer(args.model)
    ids = tokenize_documents(tok, [read_text_file(args.text_file)], args.length)[0][None]
    if ids.shape[1] < args.length:
        raise SystemExit(f"too little text in {args.text_file} for {args.length} tokens ({ids.shape[1]})")
    base = peak_rss_mb()
    start = time.time()
    with torch.no_grad():
        if args.variant == "naive":
            loss = model(ids, labels=ids).loss.item()
        else:
            loss = token_nll(model, ids, chunk_size=args.chunk_size).mean().item()
    print(json.dumps({"variant": args.variant, "baseline_mb": base, "peak_mb": peak_rss_mb(),
                      "increment_mb": peak_rss_mb() - base, "loss": loss, "seconds": time.time() - start}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model to score (Hub id, folder, .gguf, alias)")
    p.add_argument("--length", type=int, default=8192, help="sequence length in tokens")
    p.add_argument("--chunk-size", type=int, default=1024, help="LM-head chunk of the hf_posenc variant")
    p.add_argument("--text-file",
                   default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "books", "pg84.txt"),
                   help="text to score")
    p.add_argument("--write", action="store_true", help="record the result in BENCHMARKS.md")
    p.add_argument("--variant", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        return child(args)
    results = {}
    for variant in ("naive", "chunked"):
        cmd = [sys.executable, __file__, "--variant", variant, "--model", args.model, "--length", str(args.length),
               "--chunk-size", str(args.chunk_size), "--text-file", args.text_file]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(out.stderr[-2000:])
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    ratio = results["chunked"]["increment_mb"] / results["naive"]["increment_mb"]
    command = "python scripts/bench_ppl_memory.py " + " ".join(
        a for a in sys.argv[1:] if a != "--write") + (" --write" if args.write else "")
    lines = [
        "## Perplexity scoring memory (chunked LM head vs naive `model(ids, labels=ids)`)",
        "",
        f"Command: `{command.strip()}`  ",
        f"Model {args.model}, {args.length} tokens, chunk {args.chunk_size}, "
        f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), each variant in a fresh process; "
        "peak RSS above the post-load level.",
        "",
        "| variant | peak increment (MB) | loss | seconds |",
        "|---|---|---|---|",
    ]
    for v in ("naive", "chunked"):
        r = results[v]
        lines.append(f"| {v} | {r['increment_mb']:.0f} | {r['loss']:.5f} | {r['seconds']:.1f} |")
    lines += ["", f"**Ratio chunked / naive: {ratio:.2f}** (target <= 0.6).", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        from hf_posenc.io.reports import replace_markdown_section

        replace_markdown_section(os.path.join(os.path.dirname(__file__), "..", "BENCHMARKS.md"), text)

if __name__ == "__main__":
    main()
