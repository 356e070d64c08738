"""``hf-posenc eval retrieval``: long-document needle retrieval with sentence embeddings, methods side by side."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from . import data as D
from .cells import NUMBER
from .common import Run
from .report import markdown_table, plot_lines
from .tasks import EvalTask, per_length_entries, register_task
from ..flags import depths, encoding_flag, ints, positive
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


def retrieval_flags(p) -> None:
    d = p.add_argument_group("data")
    d.add_argument("--text-file", action="append", help="text the documents' filler is cut from; repeatable "
                   "(default: the default corpus, see 'eval ppl --help').")
    d.add_argument("--text-dir", action="append", help="a folder of .txt/.md files for the filler; repeatable.")
    encoding_flag(d)
    e = p.add_argument_group("evaluation")
    e.add_argument("--lengths", type=ints, default=[512, 1024, 2048], help="document lengths in tokens.")
    e.add_argument("--depths", type=depths, default=[0.1, 0.5, 0.9], help="where the fact sits in each document (0..1).")
    e.add_argument("--trials", type=positive, default=10, help="queries per (length, depth).")
    e.add_argument("--candidates", type=positive, default=5, help="documents ranked per query (one holds the fact).")
    e.add_argument("--filler", choices=["same", "different"], default="same",
                   help="same: all candidates share one passage, only their facts differ; different: a passage each.")


def retrieval_keywords(args) -> dict[str, Any]:
    docs = D.gather_documents(args.text_file, args.text_dir, encoding=args.encoding)
    return dict(lengths=args.lengths, docs=docs, depths=args.depths, trials=args.trials, candidates=args.candidates,
                filler=args.filler)


RETRIEVAL = register_task(EvalTask(
    name="retrieval", report="retrieval", summary="long-document needle retrieval with sentence embeddings (BERT "
    "family).", title="Needle retrieval", run=run_retrieval, flags=retrieval_flags, keywords=retrieval_keywords,
    default_methods=("none", "interpolate", "hierarchical"), parser_defaults=dict(model="all-minilm-l6-v2", factor=4.0),
    model_index=per_length_entries(dict(task_type="sentence-similarity", task_name="Long-document needle retrieval",
                                        dataset_type="needle-retrieval", dataset_name="synthetic needle retrieval",
                                        metric_type="accuracy"), "needle retrieval top-1 @ {n} tokens",
                                   lambda res, n: (res["by_length"].get(n) or {}).get("accuracy")),
    patch_keywords=lambda e: dict(lengths=e.lengths, docs=e.docs, depths=e.depths, trials=e.trials),
    reads_documents=True))
