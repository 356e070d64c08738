"""``hf-posenc eval ppl``: compare methods by long-context perplexity, side by side on shared data."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from . import data as D
from .common import Run
from ..config import PosEncConfig
from ..context import original_context
from .perplexity import aggregate_length, doc_digest, plan_lengths, truncated_window_cell, window_cell
from .variants import Variant, grouped_by_config
from .cells import NUMBER
from .key_tokens import ALPHA, BETA, KEY_FIELDS, aggregate_key_tokens, key_token_cell
from .report import markdown_table, plot_lines

WINDOW_FIELDS = {"tokens": NUMBER, "nll_sum": NUMBER, "bucket_sum": list, "bucket_cnt": list}


def run_perplexity(*, lengths: list[int], docs: list[D.Document], mode: str = "windows", stride: int | None = None,
                   max_windows: int | None = None, buckets: int = 32, chunk_size: int = 1024,
                   truncated_stride: int | None = None, truncated_baseline: bool = True, key_tokens: bool = False,
                   **run: Any) -> dict[str, Any]:
    """Perplexity of each variant at each of ``lengths`` over ``docs``; ``run``: the keywords of
    :class:`common.Run` (model, methods or variants, output, ...). Each window is a cell: resumable, and
    shared between processes under ``accelerate launch``. Where a length exceeds the model's original context L
    (and ``truncated_baseline``), the unpatched model also scores the same tokens with at most L tokens before
    each (:func:`perplexity.truncated_nll`, moved by ``truncated_stride``, default L / 4): the baseline of every
    method's context gain past L. ``key_tokens``: also each method's perplexity over its key tokens
    (:mod:`eval.key_tokens`, LongPPL), in cells of their own."""
    with Run(**run) as job:
        if not lengths or any(n < 2 for n in lengths):
            raise ValueError(f"--lengths must be token counts >= 2, got {lengths}")
        if stride is not None and mode != "sliding":
            raise ValueError(f"--stride {stride} applies to --mode sliding; windows mode scores non-overlapping windows "
                             "(drop --stride, or add --mode sliding)")
        lm, tok, _ = job.load()
        original = original_context(lm)
        baseline = truncated_variant(original, truncated_stride, lengths) if truncated_baseline or key_tokens else None
        if key_tokens and baseline is None:
            raise ValueError(f"--key-tokens needs a length past the original context ({original}), got {lengths}")
        need = None
        if max_windows and mode == "windows":
            need = max(lengths) * max_windows
        elif max_windows:
            need = max(lengths) + (stride or max(lengths)) * max_windows
        token_docs = D.tokenize_documents(tok, docs, need)
        names = [d.name for d in docs]
        plans = plan_lengths(token_docs, lengths, mode, stride, max_windows)
        digests = [doc_digest(t) for t in token_docs]
        cells = [(n, w) for n in lengths for w in plans[n]]
        keys = [[n, names[w.doc], digests[w.doc], w.begin] for n, w in cells]
        settings = {"mode": mode, "stride": stride, "buckets": buckets}
        window_of = {json.dumps(k): w for k, (_, w) in zip(keys, cells)}

        def compute(variant, key):
            w, model = window_of[json.dumps(key[:4])], job.model_for(variant, max(lengths))
            if len(key) > 4:  # [..., "key_tokens", stride, alpha, beta]
                return key_token_cell(model, token_docs[w.doc], w, original, key[5], key[6], key[7], chunk_size)
            if baseline is not None and variant.label == baseline.variant.label:
                return truncated_window_cell(model, token_docs[w.doc], w, buckets, original, baseline.stride, chunk_size)
            return window_cell(model, token_docs[w.doc], w, buckets, chunk_size)

        longer = [k for k in keys if baseline is not None and k[0] > original]
        marks = ["key_tokens", baseline.stride, ALPHA, BETA] if key_tokens else None
        variants, wanted = list(job.variants), {v.label: keys + [k + marks for k in longer if marks]
                                                for v in job.variants}
        if baseline is not None and truncated_baseline:
            variants.append(baseline.variant)
            wanted[baseline.variant.label] = longer
        done = job.cells("perplexity", settings, wanted, compute, variants=grouped_by_config(variants),
                         fields=lambda key: KEY_FIELDS if len(key) > 4 else WINDOW_FIELDS)
        results = {}
        for label, values in ((v.label, done[v.label]) for v in variants):
            mine = dict(zip(map(json.dumps, wanted[label]), values))
            results[label] = {str(n): aggregate_length(n, plans[n], [mine[json.dumps(k)] for k, (m, _) in
                                                                      zip(keys, cells) if m == n], names, buckets,
                                                       original)
                              for n in lengths if any(k[0] == n for k in wanted[label])}
            if marks and label != (baseline.variant.label if truncated_baseline else None):
                for n in {k[0] for k in longer}:
                    results[label][str(n)]["key_tokens"] = aggregate_key_tokens(
                        [mine[json.dumps(k + marks)] for k in longer if k[0] == n])
        if marks:
            settings["key_tokens"] = {"evaluator": "each method's own model (the model under test, patched)",
                                      "alpha": ALPHA, "beta": BETA, "short_context": original,
                                      "stride": baseline.stride, "source": "LongPPL, Fang et al. 2024, arXiv:2410.23771"}
        settings.update(lengths=lengths, max_windows=max_windows, documents=names,
                        document_tokens=[len(t) for t in token_docs])
        if baseline is not None and truncated_baseline:
            settings["truncated_baseline"] = {"label": baseline.variant.label, "context": original,
                                              "stride": baseline.stride}
            add_context_gain(results, baseline.variant.label)
        return job.report("perplexity", settings, results, ppl_table, ppl_plots)


@dataclass(frozen=True)
class Baseline:
    variant: Variant
    stride: int


def truncated_variant(original: int | None, stride: int | None, lengths: list[int]) -> Baseline | None:
    """The truncated-context baseline of a run (None when no length exceeds the original context): the unpatched
    model, labelled with its context and stride (a cell computed with another stride is another cell)."""
    if original is None or max(lengths) <= original:
        return None
    stride = stride or max(1, original // 4)
    if not 1 <= stride < original:
        raise ValueError(f"--truncated-stride must be from 1 to the original context - 1 ({original - 1}: every "
                         f"scored token keeps at least one token before it), got {stride}")
    return Baseline(Variant(f"none-truncated-{original}-stride-{stride}", PosEncConfig("none")), stride)


def add_context_gain(results: dict[str, dict], baseline: str) -> None:
    """Per variant and length past the original context: ``context_gain`` = the baseline's perplexity of the tokens
    past L over the variant's (> 1: the longer context helped; < 1: it hurt)."""
    for label, per_len in results.items():
        for n, r in per_len.items():
            base = results[baseline].get(n, {}).get("past_original")
            if r.get("past_original") and base and label != baseline:
                r["context_gain"] = base["ppl"] / r["past_original"]["ppl"]


def _past(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    past = r.get("past_original")
    gain = r.get("context_gain")
    return "-" if past is None else f"{past['ppl']:.2f}" + (f" (x{gain:.3f})" if gain is not None else "")


def _key(r: dict[str, Any] | None) -> str:
    k = (r or {}).get("key_tokens")
    if k is None:
        return "-"
    return f"{k['ppl']:.2f} ({k['count']})" if k["ppl"] is not None else "- (0)"


def ppl_table(report: dict[str, Any]) -> str:
    setup = report["setup"]
    lengths, L = setup["lengths"], setup["original_context"]
    longer = [n for n in lengths if L is not None and n > L]
    keyed = setup.get("key_tokens")
    rows = []
    for method, per_len in report["results"].items():
        row: list[Any] = [method]
        for n in lengths:
            r = per_len.get(str(n))
            ci = r["ci95"] if r else None
            row.append("-" if r is None else f"{r['ppl']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""))
        row += [_past(per_len.get(str(n))) for n in longer]
        row += [_key(per_len.get(str(n))) for n in longer if keyed]
        rows.append(row)
    note = (f"Perplexity (token-weighted; [95% interval of the per-document mean] with >= 2 documents), "
            f"{setup['mode']} mode, model {setup['model']} (original context {L}).")
    base = setup.get("truncated_baseline")
    if longer:
        pasts = {n: (report["results"][next(iter(report["results"]))].get(str(n)) or {}).get("past_original") for n in longer}
        starts = ", ".join(f"{e['from']} at {n}" for n, e in pasts.items() if e)
        note += (f" 'past L': perplexity of the tokens past the original context, from the first position bucket "
                 f"starting at or after L = {L} ({starts})"
                 + (f", and (xG) the context gain: the truncated baseline's perplexity of the same tokens over the "
                    f"method's (> 1: the context past L helped; < 1: it hurt; about 1: the method only avoids breaking). "
                    f"Baseline {base['label']}: the unpatched model scoring each token with at most {base['context']} "
                    f"tokens before it (forwards of {base['context']} tokens moved by {base['stride']})."
                    if base else "."))
    if keyed:
        note += (f" Key tokens (LongPPL, Fang et al. 2024): tokens whose log-probability with the whole window exceeds "
                 f"that with at most {keyed['short_context']} tokens before them by more than {keyed['alpha']:g} and is more than "
                 f"{keyed['beta']:g}, judged by each method's own model (a stronger long-context evaluator is better); "
                 "the column gives the perplexity over them (and their count).")
    header = (["method"] + [f"{n} tokens" for n in lengths] + [f"{n}: past L" for n in longer]
              + [f"{n}: key-token ppl (count)" for n in longer if keyed])
    return note + "\n\n" + markdown_table(header, rows)


def ppl_plots(report: dict[str, Any], output: str) -> list[str]:
    setup, paths = report["setup"], []
    lengths = setup["lengths"]
    series = {m: ([n for n in lengths if str(n) in r], [r[str(n)]["ppl"] for n in lengths if str(n) in r])
              for m, r in report["results"].items()}
    paths.append(plot_lines(series, f"Perplexity vs context length ({setup['model']})", "context length (tokens)",
                            "perplexity", os.path.join(output, "ppl_vs_length.png"), logy=True,
                            vline=setup["original_context"]))
    for n in lengths:
        curves = {}
        for m, r in report["results"].items():
            if str(n) not in r:
                continue
            pts = r[str(n)]["curve"]
            curves[m] = ([(p["from"] + p["to"]) / 2 for p in pts], [p["nll"] for p in pts])
        vline = setup["original_context"] if setup["original_context"] < n else None
        paths.append(plot_lines(curves, f"Loss by position, {n}-token windows", "position in window",
                                "mean NLL (nats)", os.path.join(output, f"loss_by_position_{n}.png"), vline=vline))
    return paths
