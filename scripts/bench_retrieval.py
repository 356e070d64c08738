"""Needle retrieval with sentence embeddings on all-MiniLM-L6-v2 (512 learned positions), rerunnable:
``none`` (documents truncated to 512 tokens, what users do today) against ``interpolate`` and
``hierarchical`` tables of 2048 positions, at 512/1024/2048-token documents. Same library code as
``hf-posenc eval retrieval``; full report and plot in ``benchmarks/retrieval/``; with --write the table
replaces this script's section of BENCHMARKS.md, with the exact command.

    python scripts/bench_retrieval.py --write
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TITLE = "## Needle retrieval with sentence embeddings (all-MiniLM-L6-v2)"


def main(argv: list[str] | None = None) -> int:
    from hf_posenc.eval.run_retrieval import run_retrieval
    from hf_posenc.io.documents import gather_documents
    from hf_posenc.io.reports import emit_section

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="all-minilm-l6-v2", help="encoder (Hub id, folder, alias).")
    p.add_argument("--methods", default="none,interpolate,hierarchical", help="comma-separated methods.")
    p.add_argument("--factor", type=float, default=4.0, help="table growth of interpolate/hierarchical.")
    p.add_argument("--lengths", default="512,1024,2048", help="document lengths (tokens).")
    p.add_argument("--depths", default="0.1,0.5,0.9", help="fact depths (0..1).")
    p.add_argument("--trials", type=int, default=20, help="queries per (length, depth).")
    p.add_argument("--candidates", type=int, default=5, help="documents ranked per query.")
    p.add_argument("--seed", type=int, default=0, help="random seed.")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "retrieval"), help="report folder.")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    args = p.parse_args(argv)
    command = "python scripts/bench_retrieval.py " + shlex.join(argv)
    report = run_retrieval(model=args.model, methods=args.methods.split(","), factor=args.factor, method_params={},
                           lengths=[int(n) for n in args.lengths.split(",")], docs=gather_documents(),
                           depths=[float(d) for d in args.depths.split(",")], trials=args.trials,
                           candidates=args.candidates, seed=args.seed, output=args.output, command=command)
    s = report["setup"]
    text = "\n".join([
        TITLE, "",
        f"Command: `{command.strip()}`  ",
        f"Filler from {', '.join(s['documents'])}; {s['candidates']} candidates sharing one passage, each with its own "
        f"fact; random-draw credit for ties (a truncated document loses its fact: 1/{s['candidates']} = "
        f"{1 / s['candidates']:.2f}). Run time {s['seconds'] / 60:.1f} min. Report and plot: "
        f"`{os.path.relpath(args.output, ROOT)}/`.", "",
        report["table"], "",
    ])
    emit_section(text, args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
