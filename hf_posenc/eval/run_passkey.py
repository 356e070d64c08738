"""``hf-posenc eval passkey``: passkey retrieval accuracy per length and depth, methods side by side."""

from __future__ import annotations

import os
from typing import Any

from .cells import NUMBER
from .common import Run
from .passkey import FILLER, NEEDLE, PasskeyBuilder, aggregate_passkey, check_needle, check_scoring, grid, passkey_cell
from .report import markdown_table, plot_heatmap, plot_lines


def run_passkey(*, lengths: list[int], depths: list[float], trials: int = 5, digits: int = 5,
                scoring: str = "teacher_forced", batch_size: int = 1, filler: str = FILLER, needle: str = NEEDLE,
                **run: Any) -> dict[str, Any]:
    """Passkey accuracy of each variant per (length, depth); ``run``: the keywords of :class:`common.Run`
    (model, methods or variants, seed, output, ...). Each (length, depth) is a cell: resumable, and shared
    between processes under ``accelerate launch``."""
    with Run(**run) as job:
        if any(not 0 <= d <= 1 for d in depths):
            raise ValueError(f"--depths must lie in [0, 1], got {depths}")
        check_needle(needle)
        check_scoring(scoring, trials, digits, batch_size)
        lm, tok, _ = job.load()
        builder = PasskeyBuilder(tok, filler=filler, needle=needle)
        cells = grid(lengths, depths, job.seed)
        settings = {"trials": trials, "digits": digits, "scoring": scoring, "filler": filler, "needle": needle,
                    "tokenizer": getattr(tok, "name_or_path", None), "vocabulary": len(tok)}
        done = job.cells("passkey", settings, {v.label: [list(c) for c in cells] for v in job.variants},
                         lambda v, k: passkey_cell(lm, tok, builder, *k, trials, digits, scoring, batch_size),
                         fields={"hits": NUMBER, "trials": NUMBER, "samples": list})
        results = {label: aggregate_passkey(lengths, [(n, d, c) for (n, d, _), c in zip(cells, values)])
                   for label, values in done.items()}
        settings.update(lengths=lengths, depths=depths, batch_size=batch_size)
        return job.report("passkey", settings, results, passkey_table, passkey_plots)


def passkey_table(report: dict[str, Any]) -> str:
    s = report["setup"]
    rows = [[m, *(r["by_length"][str(n)] for n in s["lengths"]), r["accuracy"]] for m, r in report["results"].items()]
    note = (f"Passkey accuracy ({s['scoring']}, {s['trials']} trials x {len(s['depths'])} depths per length), "
            f"model {s['model']} (original context {s['original_context']}).")
    return note + "\n\n" + markdown_table(["method", *(f"{n} tokens" for n in s["lengths"]), "overall"], rows)


def passkey_plots(report: dict[str, Any], output: str) -> list[str]:
    s, paths = report["setup"], []
    for m, r in report["results"].items():
        matrix = [[r["cells"][f"{n}@{d}"]["accuracy"] for n in s["lengths"]] for d in s["depths"]]
        paths.append(plot_heatmap(matrix, [f"{d:g}" for d in s["depths"]], [str(n) for n in s["lengths"]],
                                  f"Passkey accuracy: {m}", os.path.join(output, f"passkey_heatmap_{m}.png")))
    series = {m: (s["lengths"], [r["by_length"][str(n)] for n in s["lengths"]]) for m, r in report["results"].items()}
    paths.append(plot_lines(series, "Passkey accuracy vs length", "context length (tokens)", "accuracy",
                            os.path.join(output, "passkey_vs_length.png"), vline=s["original_context"]))
    return paths
