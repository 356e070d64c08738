"""``hf-posenc eval ppl``: compare methods by long-context perplexity, side by side on shared data."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from ..io import documents as D
from ..io.reports import markdown_table, plot_lines
from ..methods.rope import SCALINGS
from ..patching import checkpoint_config
from .common import Run
from .key_tokens import (
    ALPHA,
    BETA,
    aggregate_key_positions,
    aggregate_key_tokens,
    evaluator_config,
    key_positions_cell,
    key_token_cell,
    load_evaluator,
    scored_key_cell,
)
from .params import documents, ints, number, param, positive
from .perplexity import (
    aggregate_length,
    counted_past_exactly,
    doc_digest,
    plan_lengths,
    truncated_window_cell,
    window_cell,
)
from .ppl_cells import (
    CELL_FIELDS,
    Baseline,
    KeyPositionsCell,
    KeyTokensCell,
    WindowCell,
    add_context_gain,
    ppl_cell,
    truncated_variant,
)
from .scoring import require_causal_lm
from .settings import RunSettings
from .tasks import Defaults, EvalTask, Objective, PatchUse, per_length_entries, register_task
from .variants import grouped_by_config


@dataclass(frozen=True)
class PplParams:
    """What ``eval ppl`` measures (its flags: ``--lengths``, ``--mode``, ...; checked when made)."""

    lengths: list[int] = param([2048, 4096, 8192], "comma-separated context lengths in tokens.", read=ints)
    docs: Any = documents()
    mode: str = param("windows", "windows: non-overlapping windows of each length; sliding: windows moved by "
                      "--stride, loss on the new tokens only.", choices=("windows", "sliding"))
    stride: int | None = param(None, "sliding-window stride in tokens (default: the length, i.e. no overlap).",
                               read=positive)
    max_windows: int | None = param(None, "at most this many windows per document and length.", read=positive)
    buckets: int = param(32, "position buckets of the loss-by-position curve.", read=positive)
    chunk_size: int = param(1024, "tokens per LM-head chunk: the full [length x vocab] logits are never "
                            "materialised.", read=positive)
    truncated_stride: int | None = param(
        None, "for lengths past the original context L: the unpatched model also scores the same tokens with at "
        "most L tokens before each (forwards of L tokens moved by this many; default L/4), the baseline of each "
        "method's context gain.", read=positive)
    truncated_baseline: bool = param(True, "skip that baseline (its forwards cost about (length - L) / stride "
                                     "forwards of L tokens per window).")
    key_tokens: bool = param(False, "also each method's perplexity over its key tokens (LongPPL: tokens the context "
                             "past L makes more than e^alpha times likelier and whose log-probability exceeds beta; "
                             "judged by the method's own model, or --evaluator); costs the truncated forwards again, "
                             "per method.")
    key_alpha: float = param(ALPHA, "with --key-tokens: the long-short difference (nats) a key token exceeds "
                             "(LongPPL: 2).", read=number)
    key_beta: float = param(BETA, "with --key-tokens: the long-context log-probability (nats) a key token exceeds "
                            "(LongPPL: -2).", read=number)
    evaluator: str | None = param(
        None, "with --key-tokens: the model that judges key tokens, the same for every method (Hub id, folder or "
        "alias sharing the tokenizer of --model; a strong long-context model is best); default: each method's own "
        "model.", metavar="MODEL")
    evaluator_method: str | None = param(
        None, "with --key-tokens: the evaluator patched by this method, e.g. self_extend:group_size=4 (without "
        "--evaluator: the model under test so patched judges for every method).", metavar="METHOD[:KEY=VALUE,...]")

    def __post_init__(self):
        if not self.lengths or any(n < 2 for n in self.lengths):
            raise ValueError(f"--lengths must be token counts >= 2, got {self.lengths}")
        for name in ("buckets", "chunk_size", "stride", "max_windows", "truncated_stride"):
            value = getattr(self, name)
            if (value is not None or name in ("buckets", "chunk_size")) and not (
                    isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if self.stride is not None and self.mode != "sliding":
            raise ValueError(f"--stride {self.stride} applies to --mode sliding; windows mode scores non-overlapping "
                             "windows (drop --stride, or add --mode sliding)")
        if self.mode not in ("windows", "sliding"):
            raise ValueError(f"--mode must be 'windows' or 'sliding', got {self.mode!r}")
        if (self.evaluator or self.evaluator_method or (self.key_alpha, self.key_beta) != (ALPHA, BETA)) \
                and not self.key_tokens:
            raise ValueError("--evaluator, --evaluator-method, --key-alpha and --key-beta choose how key tokens are "
                             "judged: add --key-tokens")
        evaluator_config(self.evaluator_method)  # a bad one is refused before the slow load
        if not (math.isfinite(self.key_alpha) and math.isfinite(self.key_beta)):
            raise ValueError(f"--key-alpha and --key-beta are finite numbers (nats), got {self.key_alpha} and "
                             f"{self.key_beta}")


def ppl_run(settings: RunSettings, params: PplParams) -> dict[str, Any]:
    """Perplexity of each variant at each of the lengths over the documents. Each window is a cell: resumable, and
    shared between processes under ``accelerate launch``. Where a length exceeds the model's original context L
    (and ``truncated_baseline``), the unpatched model also scores the same tokens with at most L tokens before
    each (:func:`perplexity.truncated_nll`, moved by ``truncated_stride``, default L / 4): the baseline of every
    method's context gain past L. ``key_tokens``: also each method's perplexity over its key tokens
    (:mod:`eval.key_tokens`, LongPPL), in cells of their own: judged by each method's own model, or with
    ``evaluator`` (a model sharing the tokenizer) and/or ``evaluator_method`` (its patch) by that one evaluator, the
    same key tokens for every method; ``key_alpha``/``key_beta``: the LongPPL thresholds (default the paper's)."""
    p = params
    with Run(settings) as job:
        docs = D.documents_of(p.docs)  # read (and a bad file refused) before the slow load
        lm, tok, _ = job.load()
        require_causal_lm(lm)  # before the documents are read and tokenized
        original = job.original(lm)
        # a context given past a scaled checkpoint's pretraining one is the checkpoint's own: truncated as it is
        own = checkpoint_config(lm) if settings.original_context else None
        baseline = truncated_variant(original, p.truncated_stride, p.lengths, own) \
            if p.truncated_baseline or p.key_tokens else None
        if p.key_tokens and baseline is None:
            raise ValueError(f"--key-tokens needs a length past the original context ({original}), got {p.lengths}")
        windows = PlannedWindows.of(tok, docs, p)
        judge = load_evaluator(job, p.evaluator, p.evaluator_method) if p.evaluator or p.evaluator_method else None
        run = _PplCells(job, p, windows, original, baseline, judge)
        cell_settings = {"mode": p.mode, "stride": p.stride, "buckets": p.buckets}  # the cells' fingerprint
        if judge is not None:  # the evaluator's cells first: every method's key-token cell reads them
            run.judge_key_tokens(cell_settings)
        variants, wanted = run.wanted()
        done = job.cells("perplexity", cell_settings, wanted, run.compute, variants=grouped_by_config(variants),
                         fields=run.fields)
        exact = counted_past_exactly([r for v in variants for k, r in zip(wanted[v.label], done[v.label])
                                      if isinstance(ppl_cell(k), WindowCell)], original)  # else buckets, for all
        results = {v.label: run.results_of(v.label, wanted[v.label], done[v.label], exact) for v in variants}
        if baseline is not None and p.truncated_baseline:
            add_context_gain(results, baseline.variant.label)
        return job.report("perplexity", {**cell_settings, **run.settings()}, results, ppl_table, ppl_plots)


@dataclass(frozen=True)
class PlannedWindows:
    """The documents' tokens (as many as the windows read) and the windows of each length: ``cells`` pairs
    (length, window), ``keys`` their :class:`ppl_cells.WindowCell`, in the same order."""

    tokens: list
    names: list[str]
    plans: dict
    cells: list
    keys: list

    @classmethod
    def of(cls, tok, docs, p: PplParams) -> "PlannedWindows":
        need = None
        if p.max_windows and p.mode == "windows":
            need = max(p.lengths) * p.max_windows
        elif p.max_windows:
            need = max(p.lengths) + (p.stride or max(p.lengths)) * p.max_windows
        tokens = D.tokenize_documents(tok, docs, need)
        names = [d.name for d in docs]
        plans = plan_lengths(tokens, p.lengths, p.mode, p.stride, p.max_windows)
        digests = [doc_digest(t) for t in tokens]
        cells = [(n, w) for n in p.lengths for w in plans[n]]
        keys = [WindowCell(n, names[w.doc], digests[w.doc], w.begin) for n, w in cells]
        return cls(tokens, names, plans, cells, keys)


class _PplCells:
    """What one ``eval ppl`` run computes: each variant's window cells, the truncated baseline's cells past L and,
    with key tokens, each method's key-token cells (and the evaluator's key positions); then the results."""

    def __init__(self, job: Run, p: PplParams, windows: PlannedWindows, original: int | None,
                 baseline: Baseline | None, judge):
        self.job, self.p, self.windows = job, p, windows
        self.original, self.baseline, self.judge = original, baseline, judge
        self.window_of = {k: w for k, (_, w) in zip(windows.keys, windows.cells)}
        self.longer = [k for k in windows.keys if baseline is not None and k.length > original]
        self.judged: dict[WindowCell, dict] = {}  # the evaluator's key tokens per window

    def compute(self, variant, key: list) -> dict[str, Any]:
        p, cell = self.p, ppl_cell(key)
        w = self.window_of[cell.window]
        doc = self.windows.tokens[w.doc]
        if isinstance(cell, KeyPositionsCell):  # the evaluator's own key tokens
            model = self.judge.model if self.judge.model is not None else self.job.loaded[0]
            return key_positions_cell(model, doc, w, self.original, cell.stride, cell.alpha, cell.beta, p.chunk_size)
        model = self.job.model_for(variant, max(p.lengths))
        if isinstance(cell, KeyTokensCell) and cell.evaluator is not None:  # the evaluator's key tokens, scored
            return scored_key_cell(model, doc, w, self.judged[cell.window]["positions"], p.chunk_size)
        if isinstance(cell, KeyTokensCell):
            return key_token_cell(model, doc, w, self.original, cell.stride, cell.alpha, cell.beta, p.chunk_size)
        if self.baseline is not None and variant.label == self.baseline.variant.label:
            return truncated_window_cell(model, doc, w, p.buckets, self.original, self.baseline.stride, p.chunk_size)
        return window_cell(model, doc, w, p.buckets, p.chunk_size, self.original)

    @staticmethod
    def fields(key: list) -> dict:
        return CELL_FIELDS[type(ppl_cell(key))]

    def key_cell(self, k: WindowCell) -> KeyTokensCell:
        """Window k's key-token cell, of every method."""
        return KeyTokensCell(k, self.baseline.stride, self.p.key_alpha, self.p.key_beta,
                             self.judge.ident if self.judge is not None else None)

    def judge_key_tokens(self, cell_settings: dict) -> None:
        """The evaluator's key positions in every window past L (its cells, computed first)."""
        judge, p = self.judge, self.p
        own = [KeyPositionsCell(k, self.baseline.stride, p.key_alpha, p.key_beta, judge.ident).as_list()
               for k in self.longer]
        got = self.job.cells("perplexity", cell_settings, {judge.variant.label: own}, self.compute,
                             variants=[judge.variant], fields=self.fields,
                             desc="key tokens (evaluator)")[judge.variant.label]
        self.judged.update(zip(self.longer, got))

    def wanted(self) -> tuple[list, dict[str, list]]:
        """The variants and the cell keys of each: the run's variants every window (and key-token cells), the
        truncated baseline the windows past L."""
        keys = [k.as_list() for k in self.windows.keys]
        scored = [self.key_cell(k).as_list() for k in self.longer] if self.p.key_tokens else []
        variants, wanted = list(self.job.variants), {v.label: keys + scored for v in self.job.variants}
        if self.baseline is not None and self.p.truncated_baseline:
            variants.append(self.baseline.variant)
            wanted[self.baseline.variant.label] = [k.as_list() for k in self.longer]
        return variants, wanted

    def results_of(self, label: str, wanted: list[list], values: list, exact_past: bool) -> dict[str, Any]:
        """One variant's results per length (with its key-token perplexity past L; ``exact_past``: every variant's
        cells counted the tokens past L exactly, see :func:`perplexity.aggregate_length`)."""
        p, w = self.p, self.windows
        mine = dict(zip(map(json.dumps, wanted), values))
        got = {str(n): aggregate_length(n, w.plans[n], [mine[json.dumps(k.as_list())] for k, (m, _) in
                                                        zip(w.keys, w.cells) if m == n], w.names, p.buckets,
                                        self.original, exact_past)
               for n in p.lengths if any(k[0] == n for k in wanted)}
        if p.key_tokens and label != (self.baseline.variant.label if p.truncated_baseline else None):
            for n in {k.length for k in self.longer}:
                got[str(n)]["key_tokens"] = aggregate_key_tokens(
                    [mine[json.dumps(self.key_cell(k).as_list())] for k in self.longer if k.length == n])
        return got

    def settings(self) -> dict[str, Any]:
        """The report's settings beside the cells'."""
        p, judge, out = self.p, self.judge, {}
        if p.key_tokens:
            out["key_tokens"] = {"evaluator": judge.description if judge else "each method's own model (the model "
                                 "under test, patched)", "alpha": p.key_alpha, "beta": p.key_beta,
                                 "short_context": self.original, "stride": self.baseline.stride,
                                 "source": "LongPPL, Fang et al. 2024, arXiv:2410.23771"}
            if judge is not None:
                out["key_tokens"]["evaluator_own"] = {
                    str(n): aggregate_key_positions([self.judged[k] for k in self.longer if k.length == n])
                    for n in sorted({k.length for k in self.longer})}
        out.update(lengths=p.lengths, max_windows=p.max_windows, documents=self.windows.names,
                   document_tokens=[len(t) for t in self.windows.tokens])
        if self.baseline is not None and p.truncated_baseline:
            out["truncated_baseline"] = {"label": self.baseline.variant.label, "context": self.original,
                                         "stride": self.baseline.stride}
            if self.baseline.variant.config.method != "none":  # a checkpoint truncated as it is: its scaling
                out["truncated_baseline"]["config"] = self.baseline.variant.config.to_dict()
        return out


def _baseline_model(base: dict[str, Any]) -> str:
    """What the truncated baseline is: the unpatched model, or a checkpoint with the RoPE scaling it was saved with."""
    method = (base.get("config") or {}).get("method", "none")
    return "the unpatched model" if method == "none" else f"the checkpoint as it is (its own {method} scaling)"


def _past(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    past = r.get("past_original")
    gain = r.get("context_gain")
    return "-" if past is None else f"{past['ppl']:.2f}" + (f" (x{gain:.3f})" if gain is not None else "")


def key_tokens_text(r: dict[str, Any] | None) -> str:
    """A method's key-token cell of the table: perplexity over its key tokens (count; LSD max where recorded)."""
    k = (r or {}).get("key_tokens")
    if k is None:
        return "-"
    top = f"; LSD max {k['lsd_max']:.2f}" if "lsd_max" in k else ""
    return (f"{k['ppl']:.2f}" if k["ppl"] is not None else "-") + f" ({k['count']}{top})"


def _judge(keyed: dict[str, Any]) -> str:
    if "evaluator_own" not in keyed:
        return "each method's own model (so each method has its own key tokens; a strong long-context evaluator, " \
               "--evaluator, makes them the same for every method and is better)"
    own = ", ".join(f"{v['count']} at {n}" + (f", LSD max {v['lsd_max']:.2f}" if "lsd_max" in v else "")
                    for n, v in keyed["evaluator_own"].items())
    return f"one evaluator for every method, {keyed['evaluator']} ({own})"


def ppl_table(report: dict[str, Any]) -> str:
    setup = report["setup"]
    lengths, L = setup["lengths"], setup["original_context"]
    longer = [n for n in lengths if L is not None and n > L]
    keyed = setup.get("key_tokens")
    rows, advertised = [], _advertised(setup)
    for method, per_len in report["results"].items():
        row: list[Any] = [method]
        for n in lengths:
            r = per_len.get(str(n))
            ci = r["ci95"] if r else None
            past = PAST_ADVERTISED if r is not None and n > advertised.get(method, n) else ""
            row.append("-" if r is None else f"{r['ppl']:.2f}{past}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""))
        row += [_past(per_len.get(str(n))) for n in longer]
        row += [key_tokens_text(per_len.get(str(n))) for n in longer if keyed]
        rows.append(row)
    note = (f"Perplexity (token-weighted; [95% interval of the per-document mean] with >= 2 documents), "
            f"{setup['mode']} mode, model {setup['model']} (original context {L}).")
    base = setup.get("truncated_baseline")
    if longer:
        pasts = {n: (report["results"][next(iter(report["results"]))].get(str(n)) or {}).get("past_original")
                 for n in longer}
        starts = ", ".join(f"{e['from']} at {n}" for n, e in pasts.items() if e)
        exact = all(e is None or e["from"] == L for e in pasts.values())
        note += (f" 'past L': perplexity of the tokens past the original context L = {L}, "
                 + ("every token from position L on" if exact else "from the first position bucket starting at or "
                    f"after L (cells of an older release: {starts})")
                 + (f", and (xG) the context gain: the truncated baseline's perplexity of the same tokens over the "
                    "method's (> 1: the context past L helped; < 1: it hurt; about 1: the method only avoids "
                    "breaking). "
                    f"Baseline {base['label']}: {_baseline_model(base)} scoring each token with at most "
                    f"{base['context']} tokens before it (forwards of {base['context']} tokens moved by "
                    f"{base['stride']})."
                    if base else "."))
    if any(n > advertised.get(m, n) for m, per_len in report["results"].items() for n in lengths
           if per_len.get(str(n))):
        note += (f" {PAST_ADVERTISED}: windows longer than the context the variant advertises (its "
                 "max_position_embeddings once patched, setup.applied): measured there all the same.")
    if keyed:
        note += (f" Key tokens (LongPPL, Fang et al. 2024): tokens whose log-probability with the whole window exceeds "
                 f"that with at most {keyed['short_context']} tokens before them by more than {keyed['alpha']:g} and "
                 "is more than "
                 f"{keyed['beta']:g}, judged by {_judge(keyed)}; the column gives the perplexity over them (and their "
                 "count; LSD max: the largest log-probability gain, in nats, that any token got from the context "
                 "before its last L tokens -- below alpha, no token is a key token).")
    header = (["method"] + [f"{n} tokens" for n in lengths] + [f"{n}: past L" for n in longer]
              + [f"{n}: key-token ppl (count)" for n in longer if keyed])
    return note + "\n\n" + markdown_table(header, rows)


PAST_ADVERTISED = "†"  # a cell longer than its variant's advertised context


def _advertised(setup: dict[str, Any]) -> dict[str, int]:
    """Each variant's advertised context (``setup.applied``: its max_position_embeddings once patched), by label."""
    applied, variants = setup.get("applied") or {}, setup.get("variants") or {}
    grows = {label for label, v in variants.items()  # (dynamic NTK: it keeps the original there, and takes any length)
             if v.get("method") in SCALINGS and SCALINGS[v["method"]].keeps_max_position}
    return {label: now["context"] for label, now in applied.items()
            if isinstance(now.get("context"), int) and label not in grows}


def ppl_plots(report: dict[str, Any], output: str) -> list[str]:
    setup, paths = report["setup"], []
    baseline = (setup.get("truncated_baseline") or {}).get("label")
    lengths = setup["lengths"]
    series = {m: ([n for n in lengths if str(n) in r], [r[str(n)]["ppl"] for n in lengths if str(n) in r])
              for m, r in report["results"].items()}
    paths.append(plot_lines(series, f"Perplexity vs context length ({setup['model']})", "context length (tokens)",
                            "perplexity", os.path.join(output, "ppl_vs_length.png"), logy=True,
                            vline=setup["original_context"], baseline=baseline))
    for n in lengths:
        curves = {}
        for m, r in report["results"].items():
            if str(n) not in r:
                continue
            pts = r[str(n)]["curve"]
            curves[m] = ([(p["from"] + p["to"]) / 2 for p in pts], [p["nll"] for p in pts])
        L = setup["original_context"]
        vline = L if L is not None and L < n else None
        paths.append(plot_lines(curves, f"Loss by position, {n}-token windows", "position in window",
                                "mean NLL (nats)", os.path.join(output, f"loss_by_position_{n}.png"), vline=vline,
                                baseline=baseline))
    return paths


PPL = register_task(EvalTask(
    name="ppl", report="perplexity", summary="perplexity at several context lengths, methods side by side.",
    title="Perplexity", params=PplParams, run=ppl_run, defaults=Defaults(methods=("none", "pi", "ntk", "yarn")),
    engines=True,
    model_index=per_length_entries(dict(task_type="text-generation", task_name="Long-context language modeling",
                                        dataset_type="text", metric_type="perplexity"),
                                   "perplexity @ {n} tokens", lambda res, n: (res.get(n) or {}).get("ppl")),
    patch=PatchUse(lambda e: PplParams(lengths=e.lengths, docs=e.docs, max_windows=e.max_windows)),
    objective=Objective("ppl_beyond", higher_is_better=False)))


def run_perplexity(**keywords: Any) -> dict[str, Any]:
    """``hf-posenc eval ppl`` from Python: perplexity per length, past L beside the truncated baseline.

    Args:
        **keywords: :class:`PplParams`' fields (``lengths``, ``docs``, ``max_windows``, ...) and the run's
            (``model``, ``methods``, ``factor``, ``output``, ``engine``, ...: :data:`hf_posenc.eval.settings.KEYWORDS`);
            an unknown one is refused before anything loads. ``output`` keeps the cells: the same call resumes.

    Returns:
        The report: ``{task, setup, results, table}`` (written to ``output`` as JSON, Markdown and plots).
    """
    return PPL(**keywords)
