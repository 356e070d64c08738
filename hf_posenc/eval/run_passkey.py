"""``hf-posenc eval passkey``: passkey retrieval accuracy per length and depth, methods side by side."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from ..io.documents import corpus_stream, documents_of, gather_documents, given_documents
from ..io.reports import markdown_table, plot_heatmap, plot_lines
from .cells import NUMBER
from .common import Run
from .haystack import TEXT_NEEDLE, TextHaystack
from .params import depths, documents, ints, param, positive
from .passkey import FILLER, NEEDLE, PasskeyBuilder, aggregate_passkey, check_needle, check_scoring, grid, passkey_cell
from .scoring import require_answering_lm
from .settings import RunSettings
from .tasks import EvalTask, Objective, PatchUse, per_length_entries, register_task


@dataclass(frozen=True)
class PasskeyParams:
    """What ``eval passkey`` measures (its flags: ``--lengths``, ``--depths``, ...; checked when made)."""

    lengths: list[int] = param([2048, 4096, 8192], "prompt lengths in tokens.", read=ints)
    depths: list[float] = param([0.0, 0.25, 0.5, 0.75, 1.0], "needle depths, 0 = start of the filler, 1 = end.",
                                read=depths)
    trials: int = param(5, "random keys per (length, depth) cell.", read=positive)
    digits: int = param(5, "digits of each key.", read=positive)
    scoring: str = param("teacher_forced", "teacher_forced: every key token must be the argmax (one forward pass); "
                         "greedy: decode and parse the first number.", choices=("teacher_forced", "greedy"))
    batch_size: int = param(1, "prompts of one token length scored together (same results, more memory; helps on "
                            "GPU).", read=positive)
    filler: str = param(FILLER, "filler text repeated around the needle (default: the landmark-attention filler).")
    needle: str = param(NEEDLE, "needle template with {key} (default: 'The pass key is {key}. Remember it. ...').")
    haystack: str = param("filler", "filler: the key in repeated filler sentences; text: in real prose from the data "
                          "flags (or the default corpus), with RULER's needle and question wording.",
                          choices=("filler", "text"))
    needles: int = param(1, "with --haystack text: needles per prompt, each with its own word and key; one is asked, "
                         "the others are distractors (RULER's multi-key).", read=positive)
    docs: Any = documents("haystack ")

    def __post_init__(self):
        if self.haystack not in ("filler", "text"):
            raise ValueError(f"--haystack must be 'filler' or 'text', got {self.haystack!r}")
        if not str(self.filler).strip():
            raise ValueError("--filler is empty: give filler text, or leave the flag out for the default filler")
        if self.haystack == "text" and (self.filler != FILLER or self.needle != NEEDLE):
            raise ValueError("--filler and --needle shape the filler haystack; --haystack text uses documents and "
                             "RULER's needle wording (drop them, or use --haystack filler)")
        if self.haystack == "filler" and given_documents(self.docs):
            raise ValueError("the data flags give the haystack of --haystack text; add it (the filler haystack reads "
                             "no documents)")
        if self.haystack == "filler" and self.needles != 1:
            raise ValueError("--needles applies to --haystack text (add it, or drop --needles)")
        if not self.lengths or any(n < 1 for n in self.lengths):
            raise ValueError(f"--lengths must be token counts >= 1, got {self.lengths}")
        if any(not 0 <= d <= 1 for d in self.depths):
            raise ValueError(f"--depths must lie in [0, 1], got {self.depths}")
        check_needle(self.needle)
        check_scoring(self.scoring, self.trials, self.digits, self.batch_size)


def passkey_run(settings: RunSettings, params: PasskeyParams) -> dict[str, Any]:
    """Passkey accuracy of each variant per (length, depth). Each (length, depth) is a cell: resumable, and shared
    between processes under ``accelerate launch``. ``haystack="text"``: the needles hide in the documents' prose
    (:mod:`eval.haystack`, RULER's wording, ``needles`` of them: one asked, the rest distractors) instead of the
    repeated filler."""
    p = params
    lengths, depths, trials, digits, scoring, batch_size = (p.lengths, p.depths, p.trials, p.digits, p.scoring,
                                                            p.batch_size)
    filler, needle, needles = p.filler, p.needle, p.needles
    with Run(settings) as job:
        docs = documents_of(p.docs) if p.haystack == "text" else None  # read before the slow load
        lm, tok, _ = job.load()
        require_answering_lm(lm)
        settings = {"trials": trials, "digits": digits, "scoring": scoring, "filler": filler, "needle": needle,
                    **job.tokenizer_settings(tok)}
        if p.haystack == "text":
            builder = text_haystack(tok, docs, needles, settings)
        else:
            builder = PasskeyBuilder(tok, filler=filler, needle=needle)
        cells = grid(lengths, depths, job.seed)
        done = job.cells("passkey", settings, {v.label: [list(c) for c in cells] for v in job.variants},
                         lambda v, k: passkey_cell(job.model_for(v, max(lengths) + digits + 64), tok, builder,
                                                   *k, trials, digits, scoring, batch_size),
                         fields={"hits": NUMBER, "trials": NUMBER, "samples": list})
        results = {label: aggregate_passkey(lengths, [(n, d, c) for (n, d, _), c in zip(cells, values)],
                                            job.original(lm)) for label, values in done.items()}
        settings.update(lengths=lengths, depths=depths, batch_size=batch_size)
        return job.report("passkey", settings, results, passkey_table, passkey_plots)


def text_haystack(tok, docs: list | None, needles: int, settings: dict[str, Any]) -> TextHaystack:
    """The text-haystack builder over ``docs`` (default: the default corpus); records what it reads in
    ``settings`` (the cells' fingerprint)."""
    docs = docs or gather_documents()
    stream = corpus_stream(tok, docs)
    settings.update(haystack="text", needles=needles, documents=[d.name for d in docs],
                    corpus=hashlib.sha256(str(stream).encode()).hexdigest()[:16], filler=None, needle=TEXT_NEEDLE)
    return TextHaystack(tok, stream, needles)


def passkey_table(report: dict[str, Any]) -> str:
    s = report["setup"]
    longer = [n for n in s["lengths"] if s["original_context"] and n > s["original_context"]]  # T5: no L
    rows = [[m, *(r["by_length"][str(n)] for n in s["lengths"]), r["accuracy"],
             *(_beyond(r.get("beyond_reach", {}).get(str(n))) for n in longer)] for m, r in report["results"].items()]
    hay = (f"needles in the prose of {', '.join(s['documents'])} ({s['needles']} per prompt, RULER's wording)"
           if s.get("haystack") == "text" else "needle in repeated filler")
    note = (f"Passkey accuracy ({hay}; {s['scoring']}, {s['trials']} trials x {len(s['depths'])} depths per length), "
            f"model {s['model']} (original context {s['original_context']}).")
    if longer:
        note += (f" Beyond L: the accuracy (and count) of the prompts whose needle lies wholly before the last "
                 f"{s['original_context']} tokens, where the unpatched model truncated to its original context cannot "
                 "see it: a hit there is retrieved from past L (–: no needle there, or cells of a run that did not "
                 "record the needle's place).")
    header = ["method", *(f"{n} tokens" for n in s["lengths"]), "overall", *(f"{n}: beyond L" for n in longer)]
    return note + "\n\n" + markdown_table(header, rows)


def _beyond(got: dict | None) -> str:
    return "–" if not got or got["accuracy"] is None else f"{got['accuracy']:.2f} ({got['trials']})"


def passkey_plots(report: dict[str, Any], output: str) -> list[str]:
    s, paths = report["setup"], []
    what = "Needle-in-text accuracy" if s.get("haystack") == "text" else "Passkey accuracy"
    for m, r in report["results"].items():
        matrix = [[r["cells"][f"{n}@{d}"]["accuracy"] for n in s["lengths"]] for d in s["depths"]]
        paths.append(plot_heatmap(matrix, [f"{d:g}" for d in s["depths"]], [str(n) for n in s["lengths"]],
                                  f"{what}: {m}", os.path.join(output, f"passkey_heatmap_{m}.png")))
    series = {m: (s["lengths"], [r["by_length"][str(n)] for n in s["lengths"]]) for m, r in report["results"].items()}
    paths.append(plot_lines(series, f"{what} vs length", "context length (tokens)", "accuracy",
                            os.path.join(output, "passkey_vs_length.png"), vline=s["original_context"]))
    return paths


def _passkey_entries(report: dict[str, Any], res: dict[str, Any]) -> list:
    text = report["setup"].get("haystack") == "text"
    fields = dict(task_type="text-generation", task_name="Needle in text" if text else "Passkey retrieval",
                  dataset_type="needle-in-text" if text else "passkey", metric_type="accuracy")
    if not text:
        fields["dataset_name"] = "synthetic passkey retrieval"
    name = "needle-in-text accuracy @ {n} tokens" if text else "passkey accuracy @ {n} tokens"
    return per_length_entries(fields, name, lambda r, n: r["by_length"].get(n))(report, res)


PASSKEY = register_task(EvalTask(
    name="passkey", report="passkey", summary="passkey retrieval accuracy per length and depth (a key in repeated "
    "filler, or needles in real text).", title="Passkey retrieval", params=PasskeyParams, run=passkey_run,
    engines=True, model_index=_passkey_entries,
    patch=PatchUse(lambda e: PasskeyParams(lengths=e.lengths, depths=e.depths, trials=e.trials),
                   lengths_flag="passkey"),
    objective=Objective("passkey", higher_is_better=True)))


def run_passkey(**keywords: Any) -> dict[str, Any]:
    """``eval passkey`` from Python: :class:`PasskeyParams`' keywords and the run's (:data:`settings.KEYWORDS`)."""
    return PASSKEY(**keywords)
