"""``hf-posenc eval harness``: lm-evaluation-harness tasks (RULER) per length, variants side by side."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from .common import Run
from .harness import (RULER_THRESHOLD, aggregate_harness, check_lengths, check_tasks, harness_cell, require_lm_eval,
                      saved_tokenizer)
from .report import markdown_table, plot_lines


def run_harness(*, tasks: list[str], lengths: list[int], limit: int | None = None, max_gen_tokens: int | None = None,
                batch_size: int = 1, threshold: float = RULER_THRESHOLD, **run: Any) -> dict[str, Any]:
    """lm-eval ``tasks`` at each length for each variant; ``run``: the keywords of :class:`common.Run`. Each
    (task, length) of a variant is a cell: resumable, and shared between processes."""
    if not 0 < threshold <= 1:
        raise ValueError(f"--threshold is a mean score in (0, 1], got {threshold}")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be >= 1 (prompts per task and length), got {limit}")
    version = require_lm_eval()
    tasks = check_tasks(tasks)
    check_lengths(lengths, tasks)
    with Run(**run) as job:
        _, tok, _ = job.load()
        settings = {"tasks": tasks, "limit": limit, "max_gen_tokens": max_gen_tokens, "lm_eval": version,
                    "tokenizer": getattr(tok, "name_or_path", None), "vocabulary": len(tok)}
        keys = [[t, n] for n in lengths for t in tasks]
        with tempfile.TemporaryDirectory() as folder:
            where = saved_tokenizer(tok, folder)
            done = job.cells("harness", {**settings, "lengths": lengths}, {v.label: keys for v in job.variants},
                             lambda v, k: harness_cell(job.model_for(v, max(lengths) + (max_gen_tokens or 128)),
                                                       tok, where, k[0], k[1], limit=limit,
                                                       max_gen_tokens=max_gen_tokens, batch_size=batch_size,
                                                       seed=job.seed),
                             fields=dict.fromkeys(("scores", "metrics", "samples", "outputs"), dict))
        results = {label: aggregate_harness(lengths, [(t, n, c) for (t, n), c in zip(keys, values)], threshold)
                   for label, values in done.items()}
        settings.update(lengths=lengths, batch_size=batch_size, threshold=threshold)
        return job.report("harness", settings, results, harness_table, harness_plots)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def harness_table(report: dict[str, Any]) -> str:
    s = report["setup"]
    lengths = [str(n) for n in s["lengths"]]
    rows = []
    for label, r in report["results"].items():
        for task, by_length in r["scores"].items():
            rows.append([label, task, *(_pct(by_length.get(n)) for n in lengths), ""])
        rows.append([label, "**mean**", *(_pct(r["mean"][n]) for n in lengths), r["effective_length"] or "-"])
    limit = f"{s['limit']} prompts" if s["limit"] else "every prompt"
    note = (f"lm-evaluation-harness {s['lm_eval']} scores (x100; {limit} per task and length), model {s['model']} "
            f"(original context {s['original_context']}). Effective length: the longest length up to which the mean "
            f"stays >= {100 * s['threshold']:.1f} (RULER's threshold).")
    return note + "\n\n" + markdown_table(["variant", "task", *(f"{n} tokens" for n in lengths),
                                           "effective length"], rows)


def harness_plots(report: dict[str, Any], output: str) -> list[str]:
    s = report["setup"]
    series = {label: (s["lengths"], [r["mean"][str(n)] for n in s["lengths"]]) for label, r in report["results"].items()}
    return [plot_lines(series, f"lm-eval mean score vs length ({', '.join(s['tasks'])})", "context length (tokens)",
                       "mean score", os.path.join(output, "harness_vs_length.png"), vline=s["original_context"],
                       hline=(s["threshold"], "effective-length threshold"))]
