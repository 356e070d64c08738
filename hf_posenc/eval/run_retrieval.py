"""``hf-posenc eval retrieval``: long-document needle retrieval with sentence embeddings, methods side by side."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from . import data as D
from .cells import NUMBER
from .common import Run
from .report import markdown_table, plot_lines
from .retrieval import NeedleDocs, aggregate_retrieval, check_retrieval, grid, retrieval_cell


def run_retrieval(*, lengths: list[int], docs: list[D.Document], depths: list[float], trials: int = 10,
                  candidates: int = 5, filler: str = "same", **run: Any) -> dict[str, Any]:
    """Needle retrieval of each variant per (length, depth); ``run``: the keywords of :class:`common.Run`."""
    with Run(**run) as job:
        check_retrieval(depths, trials, candidates, filler)
        lm, tok, _ = job.load()
        if lm.get_output_embeddings() is not None:  # an LM head: not an encoder giving token states to pool
            raise ValueError(f"retrieval evaluates sentence-embedding encoders (e.g. BertModel); {type(lm).__name__} "
                             "is not one (use 'eval ppl' or 'eval passkey' for language models).")
        stream = D.corpus_stream(tok, docs)
        builder = NeedleDocs(tok, stream)
        cells = grid(lengths, depths, job.seed)
        settings = {"trials": trials, "candidates": candidates, "filler": filler,
                    "corpus": hashlib.sha256(str(stream).encode()).hexdigest()[:16]}
        done = job.cells("retrieval", settings, {v.label: [list(c) for c in cells] for v in job.variants},
                         lambda v, k: retrieval_cell(lm, tok, builder, *k, trials, candidates, filler),
                         fields=dict.fromkeys(("hits", "rr", "trials", "positions"), NUMBER))
        results = {label: aggregate_retrieval(lengths, [(n, d, c) for (n, d, _), c in zip(cells, values)])
                   for label, values in done.items()}
        settings.update(lengths=lengths, depths=depths, documents=[d.name for d in docs], corpus_tokens=len(stream))
        return job.report("retrieval", settings, results, retrieval_table, retrieval_plots)


def retrieval_table(report: dict[str, Any]) -> str:
    s = report["setup"]
    rows = []
    for m, r in report["results"].items():
        rows.append([m, r["positions"], *(r["by_length"][str(n)]["accuracy"] for n in s["lengths"]),
                     *(r["by_length"][str(n)]["mrr"] for n in s["lengths"])])
    note = (f"Needle retrieval, top-1 accuracy then MRR ({s['candidates']} candidate documents, {s['trials']} trials x "
            f"{len(s['depths'])} depths per length), model {s['model']}; 'positions': tokens the model reads (longer "
            "documents are truncated).")
    header = ["method", "positions", *(f"acc@{n}" for n in s["lengths"]), *(f"mrr@{n}" for n in s["lengths"])]
    return note + "\n\n" + markdown_table(header, rows)


def retrieval_plots(report: dict[str, Any], output: str) -> list[str]:
    s = report["setup"]
    series = {m: (s["lengths"], [r["by_length"][str(n)]["accuracy"] for n in s["lengths"]])
              for m, r in report["results"].items()}
    return [plot_lines(series, "Needle retrieval: top-1 accuracy vs document length", "document length (tokens)",
                       "top-1 accuracy", os.path.join(output, "retrieval_vs_length.png"),
                       vline=s["original_context"])]
