"""``hf-posenc eval ppl``: compare methods by long-context perplexity, side by side on shared data."""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from . import data as D
from .common import Run
from .perplexity import aggregate_length, doc_digest, plan_lengths, window_cell
from .cells import NUMBER
from .report import markdown_table, plot_lines

WINDOW_FIELDS = {"tokens": NUMBER, "nll_sum": NUMBER, "bucket_sum": list, "bucket_cnt": list}


def gather_documents(text_file=None, text_dir=None, dataset=None, dataset_config=None, split="test",
                     column="text", limit=None, corpus=None, encoding="utf-8") -> list[D.Document]:
    """The documents asked for (files and folders read as ``encoding``: one path or a list; a dataset, a built-in
    corpus), else the default corpus."""
    docs: list[D.Document] = []
    if corpus:
        docs.extend(D.builtin_corpus(corpus))
    for path in _paths(text_file):
        docs.append(D.read_text_file(path, encoding))
    for path in _paths(text_dir):
        docs.extend(D.read_text_dir(path, encoding))
    if dataset:
        docs.extend(D.read_dataset(dataset, dataset_config, split, column, limit))
    if not docs:
        docs = D.default_corpus()
    return docs[:limit] if limit else docs


def _paths(given) -> list:
    """One path (a string or os.PathLike) or an iterable of them, as a list; None as none."""
    if given is None:
        return []
    return [given] if isinstance(given, (str, os.PathLike)) else list(given)


def tokenize_documents(tok, docs: list[D.Document], max_tokens: int | None = None) -> list[torch.Tensor]:
    """Token ids of each document, once for every method and length (cut to ``max_tokens`` when given)."""
    out = []
    for d in docs:
        text = d.text if max_tokens is None else d.text[: max_tokens * 12]  # ~12 chars bound a token from above
        ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        out.append(torch.tensor(ids[:max_tokens] if max_tokens else ids, dtype=torch.long))
    return out


def run_perplexity(*, lengths: list[int], docs: list[D.Document], mode: str = "windows", stride: int | None = None,
                   max_windows: int | None = None, buckets: int = 32, chunk_size: int = 1024,
                   **run: Any) -> dict[str, Any]:
    """Perplexity of each variant at each of ``lengths`` over ``docs``; ``run``: the keywords of
    :class:`common.Run` (model, methods or variants, output, ...). Each window is a cell: resumable, and
    shared between processes under ``accelerate launch``."""
    with Run(**run) as job:
        if not lengths or any(n < 2 for n in lengths):
            raise ValueError(f"--lengths must be token counts >= 2, got {lengths}")
        if stride is not None and mode != "sliding":
            raise ValueError(f"--stride {stride} applies to --mode sliding; windows mode scores non-overlapping windows "
                             "(drop --stride, or add --mode sliding)")
        lm, tok, _ = job.load()
        need = None
        if max_windows and mode == "windows":
            need = max(lengths) * max_windows
        elif max_windows:
            need = max(lengths) + (stride or max(lengths)) * max_windows
        token_docs = tokenize_documents(tok, docs, need)
        names = [d.name for d in docs]
        plans = plan_lengths(token_docs, lengths, mode, stride, max_windows)
        digests = [doc_digest(t) for t in token_docs]
        cells = [(n, w) for n in lengths for w in plans[n]]
        keys = [[n, names[w.doc], digests[w.doc], w.begin] for n, w in cells]
        settings = {"mode": mode, "stride": stride, "buckets": buckets}
        window_of = {json.dumps(k): w for k, (_, w) in zip(keys, cells)}

        def compute(variant, key):
            w = window_of[json.dumps(key)]
            return window_cell(lm, token_docs[w.doc], w, buckets, chunk_size)

        done = job.cells("perplexity", settings, {v.label: keys for v in job.variants}, compute, fields=WINDOW_FIELDS)
        results = {}
        for label, values in done.items():
            results[label] = {str(n): aggregate_length(n, plans[n], [c for (m, _), c in zip(cells, values) if m == n],
                                                       names, buckets) for n in lengths}
        settings.update(lengths=lengths, max_windows=max_windows, documents=names,
                        document_tokens=[len(t) for t in token_docs])
        return job.report("perplexity", settings, results, ppl_table, ppl_plots)


def ppl_table(report: dict[str, Any]) -> str:
    lengths = report["setup"]["lengths"]
    rows = []
    for method, per_len in report["results"].items():
        row: list[Any] = [method]
        for n in lengths:
            r = per_len[str(n)]
            ci = r["ci95"]
            row.append(f"{r['ppl']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""))
        rows.append(row)
    note = (f"Perplexity (token-weighted; [95% interval of the per-document mean] with >= 2 documents), "
            f"{report['setup']['mode']} mode, model {report['setup']['model']} "
            f"(original context {report['setup']['original_context']}).")
    return note + "\n\n" + markdown_table(["method"] + [f"{n} tokens" for n in lengths], rows)


def ppl_plots(report: dict[str, Any], output: str) -> list[str]:
    setup, paths = report["setup"], []
    lengths = setup["lengths"]
    series = {m: (lengths, [r[str(n)]["ppl"] for n in lengths]) for m, r in report["results"].items()}
    paths.append(plot_lines(series, f"Perplexity vs context length ({setup['model']})", "context length (tokens)",
                            "perplexity", os.path.join(output, "ppl_vs_length.png"), logy=True,
                            vline=setup["original_context"]))
    for n in lengths:
        curves = {}
        for m, r in report["results"].items():
            pts = r[str(n)]["curve"]
            curves[m] = ([(p["from"] + p["to"]) / 2 for p in pts], [p["nll"] for p in pts])
        vline = setup["original_context"] if setup["original_context"] < n else None
        paths.append(plot_lines(curves, f"Loss by position, {n}-token windows", "position in window",
                                "mean NLL (nats)", os.path.join(output, f"loss_by_position_{n}.png"), vline=vline))
    return paths
