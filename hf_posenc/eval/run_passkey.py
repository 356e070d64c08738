"""``hf-posenc eval passkey``: passkey retrieval accuracy per length and depth, methods side by side."""

from __future__ import annotations

import os
from typing import Any

from ..context import original_context
from .cells import NUMBER
from .common import Run
from .haystack import TEXT_NEEDLE, TextHaystack
from .passkey import FILLER, NEEDLE, PasskeyBuilder, aggregate_passkey, check_needle, check_scoring, grid, passkey_cell
from .report import markdown_table, plot_heatmap, plot_lines
from .tasks import EvalTask, Objective, per_length_entries, register_task
from .scoring import require_answering_lm
from ..flags import data_flags, depths, documents_of, ints, positive


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
        lm, tok, _ = job.load()
        require_answering_lm(lm)
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
        results = {label: aggregate_passkey(lengths, [(n, d, c) for (n, d, _), c in zip(cells, values)],
                                            original_context(lm)) for label, values in done.items()}
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


def passkey_flags(p) -> None:
    e = p.add_argument_group("evaluation")
    e.add_argument("--lengths", type=ints, default=[2048, 4096, 8192], help="prompt lengths in tokens.")
    e.add_argument("--depths", type=depths, default=[0.0, 0.25, 0.5, 0.75, 1.0],
                   help="needle depths, 0 = start of the filler, 1 = end.")
    e.add_argument("--trials", type=positive, default=5, help="random keys per (length, depth) cell.")
    e.add_argument("--digits", type=positive, default=5, help="digits of each key.")
    e.add_argument("--scoring", choices=["teacher_forced", "greedy"], default="teacher_forced",
                   help="teacher_forced: every key token must be the argmax (one forward pass); greedy: decode and "
                        "parse the first number.")
    e.add_argument("--batch-size", type=positive, default=1,
                   help="prompts of one token length scored together (same results, more memory; helps on GPU).")
    e.add_argument("--filler", default=None, help="filler text repeated around the needle (default: the landmark-attention filler).")
    e.add_argument("--needle", default=None, help="needle template with {key} (default: 'The pass key is {key}. Remember it. ...').")
    e.add_argument("--haystack", choices=["filler", "text"], default="filler",
                   help="filler: the key in repeated filler sentences; text: in real prose from the data flags (or the "
                        "default corpus), with RULER's needle and question wording.")
    e.add_argument("--needles", type=positive, default=1,
                   help="with --haystack text: needles per prompt, each with its own word and key; one is asked, the "
                        "others are distractors (RULER's multi-key).")
    d = data_flags(p, "test", "haystack ")
    d.add_argument("--corpus", choices=["python-docs"], default=None,
                   help="with --haystack text: a built-in corpus (python-docs: the Python Language Reference topics).")
    d.add_argument("--limit", type=positive, help="use at most this many documents.")


def passkey_keywords(args) -> dict[str, Any]:
    docs = None
    if args.haystack == "text":  # documents are read (and refused) before the model loads
        docs = documents_of(args)
    elif any([args.text_file, args.text_dir, args.dataset, args.corpus]):
        raise ValueError("the data flags give the haystack of --haystack text; add it (the filler haystack reads "
                         "no documents)")
    return dict(lengths=args.lengths, depths=args.depths, trials=args.trials, digits=args.digits, scoring=args.scoring,
                batch_size=args.batch_size, filler=args.filler or FILLER, needle=args.needle or NEEDLE,
                haystack=args.haystack, docs=docs, needles=args.needles)


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
    "filler, or needles in real text).", title="Passkey retrieval", run=run_passkey, flags=passkey_flags,
    keywords=passkey_keywords, default_methods=("none", "yarn"), engines=True, model_index=_passkey_entries,
    patch_keywords=lambda e: dict(lengths=e.lengths, depths=e.depths, trials=e.trials), lengths_flag="passkey",
    objective=Objective("passkey", higher_is_better=True)))
