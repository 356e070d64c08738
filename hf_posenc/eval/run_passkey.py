"""``hf-posenc eval passkey``: passkey retrieval accuracy per length and depth, methods side by side."""

from __future__ import annotations

import os
from typing import Any

from .cells import NUMBER
from .common import Run
from .haystack import TEXT_NEEDLE, TextHaystack
from .passkey import FILLER, NEEDLE, PasskeyBuilder, aggregate_passkey, check_needle, check_scoring, grid, passkey_cell
from .report import markdown_table, plot_heatmap, plot_lines


def run_passkey(*, lengths: list[int], depths: list[float], trials: int = 5, digits: int = 5,
                scoring: str = "teacher_forced", batch_size: int = 1, filler: str = FILLER, needle: str = NEEDLE,
                haystack: str = "filler", docs: list | None = None, needles: int = 1, **run: Any) -> dict[str, Any]:
    """Passkey accuracy of each variant per (length, depth); ``run``: the keywords of :class:`common.Run`
    (model, methods or variants, seed, output, ...). Each (length, depth) is a cell: resumable, and shared
    between processes under ``accelerate launch``. ``haystack="text"``: the needles hide in ``docs``' prose
    (:mod:`eval.haystack`, RULER's wording, ``needles`` of them: one asked, the rest distractors) instead of the
    repeated filler."""
    if haystack not in ("filler", "text"):
        raise ValueError(f"--haystack must be 'filler' or 'text', got {haystack!r}")
    if haystack == "text" and (filler != FILLER or needle != NEEDLE):
        raise ValueError("--filler and --needle shape the filler haystack; --haystack text uses documents and RULER's "
                         "needle wording (drop them, or use --haystack filler)")
    if haystack == "filler" and (docs or needles != 1):
        raise ValueError("documents and --needles apply to --haystack text (add it, or drop them)")
    with Run(**run) as job:
        if any(not 0 <= d <= 1 for d in depths):
            raise ValueError(f"--depths must lie in [0, 1], got {depths}")
        check_needle(needle)
        check_scoring(scoring, trials, digits, batch_size)
        _, tok, _ = job.load()
        settings = {"trials": trials, "digits": digits, "scoring": scoring, "filler": filler, "needle": needle,
                    "tokenizer": getattr(tok, "name_or_path", None), "vocabulary": len(tok)}
        if haystack == "text":
            builder = text_haystack(tok, docs, needles, settings)
        else:
            builder = PasskeyBuilder(tok, filler=filler, needle=needle)
        cells = grid(lengths, depths, job.seed)
        done = job.cells("passkey", settings, {v.label: [list(c) for c in cells] for v in job.variants},
                         lambda v, k: passkey_cell(job.model_for(v, max(lengths) + digits + 64), tok, builder,
                                                   *k, trials, digits, scoring, batch_size),
                         fields={"hits": NUMBER, "trials": NUMBER, "samples": list})
        results = {label: aggregate_passkey(lengths, [(n, d, c) for (n, d, _), c in zip(cells, values)])
                   for label, values in done.items()}
        settings.update(lengths=lengths, depths=depths, batch_size=batch_size)
        return job.report("passkey", settings, results, passkey_table, passkey_plots)


def text_haystack(tok, docs: list | None, needles: int, settings: dict[str, Any]) -> TextHaystack:
    """The text-haystack builder over ``docs`` (default: the default corpus); records what it reads in
    ``settings`` (the cells' fingerprint)."""
    import hashlib

    from .data import corpus_stream, gather_documents

    docs = docs or gather_documents()
    stream = corpus_stream(tok, docs)
    settings.update(haystack="text", needles=needles, documents=[d.name for d in docs],
                    corpus=hashlib.sha256(str(stream).encode()).hexdigest()[:16], filler=None, needle=TEXT_NEEDLE)
    return TextHaystack(tok, stream, needles)


def passkey_table(report: dict[str, Any]) -> str:
    s = report["setup"]
    rows = [[m, *(r["by_length"][str(n)] for n in s["lengths"]), r["accuracy"]] for m, r in report["results"].items()]
    hay = (f"needles in the prose of {', '.join(s['documents'])} ({s['needles']} per prompt, RULER's wording)"
           if s.get("haystack") == "text" else "needle in repeated filler")
    note = (f"Passkey accuracy ({hay}; {s['scoring']}, {s['trials']} trials x {len(s['depths'])} depths per length), "
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
