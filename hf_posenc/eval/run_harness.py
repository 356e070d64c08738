"""``hf-posenc eval harness``: lm-evaluation-harness tasks (RULER) per length, variants side by side."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

from ..io.reports import markdown_table, plot_lines
from .common import Run
from .harness import (
    RULER_THRESHOLD,
    aggregate_harness,
    check_lengths,
    check_tasks,
    harness_cell,
    require_lm_eval,
    saved_tokenizer,
)
from .params import ints, names, param, positive, positive_float
from .settings import RunSettings
from .tasks import EvalTask, PatchUse, register_task


@dataclass(frozen=True)
class HarnessParams:
    """What ``eval harness`` runs (its flags: ``--tasks``, ``--lengths``, ...; checked when made, lm-eval's tasks
    by lm-eval)."""

    tasks: list[str] = param(["niah_single_1", "niah_multikey_2", "ruler_vt", "ruler_cwe"],
                             "comma-separated lm-eval tasks, groups or tags; RULER's niah_single_1, niah_multikey_2, "
                             "niah_multikey_3, ruler_vt, ruler_cwe and ruler_fwe (vt, cwe, fwe for short) build their "
                             "prompts locally (the essay- and QA-based ones, and the ruler group, download data).",
                             read=names)
    lengths: list[int] = param([4096, 8192], "comma-separated lengths in tokens; RULER sizes every prompt (with 128 "
                               "tokens for the answer) to each.", read=ints)
    limit: int | None = param(None, "prompts per task and length (default: all; RULER builds 500).", read=positive)
    max_gen_tokens: int | None = param(None, "tokens generated per answer (default: the task's, 128 for RULER).",
                                       read=positive)
    batch_size: int = param(1, "prompts generated together.", read=positive)
    threshold: float = param(RULER_THRESHOLD, "mean score (0..1) a length must reach to count towards the effective "
                             "length (RULER: 0.856).", read=positive_float)

    def __post_init__(self):
        if not 0 < self.threshold <= 1:
            raise ValueError(f"--threshold is a mean score in (0, 1], got {self.threshold}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1 (prompts per task and length), got {self.limit}")


def harness_run(settings: RunSettings, params: HarnessParams) -> dict[str, Any]:
    """lm-eval's tasks at each length for each variant. Each (task, length) of a variant is a cell: resumable, and
    shared between processes."""
    p = params
    lengths, limit, max_gen_tokens, batch_size, threshold = (p.lengths, p.limit, p.max_gen_tokens, p.batch_size,
                                                             p.threshold)
    version = require_lm_eval()
    tasks = check_tasks(p.tasks)
    check_lengths(lengths, tasks)
    with Run(settings) as job:
        _, tok, _ = job.load()
        settings = {"tasks": tasks, "limit": limit, "max_gen_tokens": max_gen_tokens, "lm_eval": version,
                    **job.tokenizer_settings(tok)}
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
    series = {label: (s["lengths"], [r["mean"][str(n)] for n in s["lengths"]])
              for label, r in report["results"].items()}
    return [plot_lines(series, f"lm-eval mean score vs length ({', '.join(s['tasks'])})", "context length (tokens)",
                       "mean score", os.path.join(output, "harness_vs_length.png"), vline=s["original_context"],
                       hline=(s["threshold"], "effective-length threshold"))]


def _harness_entries(report: dict[str, Any], res: dict[str, Any]) -> list:
    """lm-eval scores: one entry per task and length (RULER's tasks are synthetic: the dataset is the task)."""
    version = report["setup"]["lm_eval"]
    out = []
    for task, by_length in res["scores"].items():
        fields = dict(task_type="text-generation", task_name=f"lm-eval {task}", dataset_type=task,
                      dataset_name=f"{task} (lm-evaluation-harness {version})", metric_type="score")
        out += [(fields, f"{task} @ {n} tokens", value, n) for n, value in by_length.items()]
    return out


HARNESS = register_task(EvalTask(
    name="harness", report="harness", summary="lm-evaluation-harness tasks (RULER: niah_single_1, vt, cwe, ...) per "
    "length on each patched model (needs the harness extra).", title="lm-evaluation-harness (RULER)",
    params=HarnessParams, run=harness_run, engines=True, model_index=_harness_entries,
    patch=PatchUse(lambda e: HarnessParams(tasks=e.arguments, lengths=e.lengths, limit=e.limit,
                                           max_gen_tokens=e.max_gen_tokens),
                   lengths_flag="harness", argument=("TASK", "an lm-eval task, e.g. harness:niah_single_1; repeatable"),
                   check_arguments=check_tasks, check_lengths=check_lengths)))


def run_harness(**keywords: Any) -> dict[str, Any]:
    """``eval harness`` from Python: :class:`HarnessParams`' keywords and the run's (:data:`settings.KEYWORDS`)."""
    return HARNESS(**keywords)
