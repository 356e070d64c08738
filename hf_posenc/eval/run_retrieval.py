"""``hf-posenc eval retrieval``: long-document needle retrieval with sentence embeddings, methods side by side."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from ..io import documents as D
from ..io.reports import markdown_table, plot_lines
from .cells import NUMBER
from .common import Run
from .params import depths, documents, ints, param, positive
from .retrieval import NeedleDocs, aggregate_retrieval, check_retrieval, grid, retrieval_cell
from .settings import RunSettings
from .tasks import Defaults, EvalTask, PatchUse, per_length_entries, register_task


@dataclass(frozen=True)
class RetrievalParams:
    """What ``eval retrieval`` measures (its flags: ``--lengths``, ``--depths``, ...; checked when made)."""

    lengths: list[int] = param([512, 1024, 2048], "document lengths in tokens.", read=ints)
    docs: Any = documents("filler ")
    depths: list[float] = param([0.1, 0.5, 0.9], "where the fact sits in each document (0..1).", read=depths)
    trials: int = param(10, "queries per (length, depth).", read=positive)
    candidates: int = param(5, "documents ranked per query (one holds the fact).", read=positive)
    filler: str = param("same", "same: all candidates share one passage, only their facts differ; different: a "
                        "passage each.", choices=("same", "different"))

    def __post_init__(self):
        check_retrieval(self.depths, self.trials, self.candidates, self.filler)


def retrieval_run(settings: RunSettings, params: RetrievalParams) -> dict[str, Any]:
    """Needle retrieval of each variant per (length, depth)."""
    p = params
    lengths, depths, trials, candidates, filler = p.lengths, p.depths, p.trials, p.candidates, p.filler
    with Run(settings) as job:
        docs = D.documents_of(p.docs)  # read before the slow load
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


RETRIEVAL = register_task(EvalTask(
    name="retrieval", report="retrieval", summary="long-document needle retrieval with sentence embeddings (BERT "
    "family).", title="Needle retrieval", params=RetrievalParams, run=retrieval_run,
    defaults=Defaults(methods=("none", "interpolate", "hierarchical"), model="all-minilm-l6-v2", factor=4.0),
    model_index=per_length_entries(dict(task_type="sentence-similarity", task_name="Long-document needle retrieval",
                                        dataset_type="needle-retrieval", dataset_name="synthetic needle retrieval",
                                        metric_type="accuracy"), "needle retrieval top-1 @ {n} tokens",
                                   lambda res, n: (res["by_length"].get(n) or {}).get("accuracy")),
    patch=PatchUse(lambda e: RetrievalParams(lengths=e.lengths, docs=e.docs, depths=e.depths, trials=e.trials))))


def run_retrieval(**keywords: Any) -> dict[str, Any]:
    """``eval retrieval`` from Python: :class:`RetrievalParams`' keywords and the run's (:data:`settings.KEYWORDS`)."""
    return RETRIEVAL(**keywords)
