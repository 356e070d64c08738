"""Long-context perplexity: token-weighted NLL per evaluated length, per document, per position.

Two modes:
- ``windows``: non-overlapping windows of exactly ``length`` tokens; every token but the first of
  each window is scored, so the per-position curve shows the loss at each distance into the context.
- ``sliding``: windows of ``length`` tokens moved by ``stride``; only the tokens new to each window
  are scored (as in the Hugging Face perplexity guide), so each scored token sees at least
  ``length - stride`` tokens of context.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .scoring import input_device, token_nll
from .stats import mean_ci95


@dataclass(frozen=True)
class Window:
    doc: int
    begin: int
    end: int
    score_from: int  # index inside the window of the first scored token (>= 1)


def plan_windows(n_tokens: int, length: int, mode: str = "windows", stride: int | None = None,
                 max_windows: int | None = None, doc: int = 0) -> list[Window]:
    """The windows over one document of ``n_tokens`` tokens; empty when the document is too short."""
    if length < 2:
        raise ValueError(f"length must be at least 2 tokens, got {length}")
    out: list[Window] = []
    if mode == "windows":
        for begin in range(0, n_tokens - length + 1, length):
            out.append(Window(doc, begin, begin + length, 1))
    elif mode == "sliding":
        if n_tokens < length:
            return []
        stride = stride or length
        if not 1 <= stride <= length:
            raise ValueError(f"stride must be in [1, length={length}], got {stride}")
        prev_end = 0
        for begin in range(0, n_tokens, stride):
            end = min(begin + length, n_tokens)
            if end - begin < length:  # keep every window at the evaluated length
                break
            new = end - prev_end
            out.append(Window(doc, begin, end, max(1, (end - begin) - new)))
            prev_end = end
            if end == n_tokens:
                break
    else:
        raise ValueError(f"mode must be 'windows' or 'sliding', got {mode!r}")
    return out[:max_windows] if max_windows else out


def check_lengths(docs: list[torch.Tensor], lengths: list[int]) -> None:
    longest = max((len(d) for d in docs), default=0)
    for length in lengths:
        if longest < length:
            raise ValueError(
                f"too little text for length {length}: the longest document has {longest} tokens; "
                "pass more or longer text, or smaller --lengths."
            )


def plan_lengths(docs: list[torch.Tensor], lengths: list[int], mode: str = "windows", stride: int | None = None,
                 max_windows: int | None = None) -> dict[int, list[Window]]:
    """Every window to score, per length (documents in order, then windows in order)."""
    check_lengths(docs, lengths)
    return {n: [w for i, d in enumerate(docs) for w in plan_windows(len(d), n, mode, stride, max_windows, doc=i)]
            for n in lengths}


def bucket_edges(length: int, buckets: int) -> list[int]:
    n = max(1, min(buckets, length - 1))
    return [1 + round(k * (length - 1) / n) for k in range(n + 1)]


def doc_digest(doc: torch.Tensor) -> str:
    """A short digest of a document's token ids: a window's cell names the exact text it scored."""
    return hashlib.sha256(doc.to(torch.int64).numpy().tobytes()).hexdigest()[:16]


def window_cell(model, doc: torch.Tensor, window: Window, buckets: int = 32, chunk_size: int = 1024,
                original: int | None = None) -> dict:
    """One window's scored tokens: their count, NLL sum, and NLL sum and count per position bucket; with
    ``original`` (the model's original context L), also those of the tokens at positions >= L."""
    device = input_device(model)
    ids = doc[window.begin : window.end][None].to(device)
    nll = token_nll(model, ids, chunk_size=chunk_size, start=window.score_from)[0].double().cpu()
    return _window_result(nll, window, buckets, original)


def truncated_nll(model, ids: torch.Tensor, context: int, stride: int, chunk_size: int = 1024) -> torch.Tensor:
    """NLL of tokens ``1 .. T - 1`` of ``ids`` ``[1, T]``, each given at most ``context`` tokens before it: the first
    ``context`` tokens in one forward, then forwards over ``context`` tokens moved by ``stride``, each scoring its
    last ``stride`` tokens (which see ``context - stride`` to ``context - 1`` tokens before them). ``[1, T - 1]``."""
    T = ids.shape[1]
    parts = [token_nll(model, ids[:, : min(context, T)], chunk_size=chunk_size)]
    s = stride
    while s + context - stride < T:
        parts.append(token_nll(model, ids[:, s : min(s + context, T)], chunk_size=chunk_size, start=context - stride))
        s += stride
    return torch.cat(parts, dim=1)


def truncated_window_cell(model, doc: torch.Tensor, window: Window, buckets: int, original: int, stride: int,
                          chunk_size: int = 1024) -> dict:
    """:func:`window_cell` of the unpatched ``model`` given at most ``original`` tokens of context per token
    (:func:`truncated_nll`): what a method's longer context is measured against."""
    device = input_device(model)
    ids = doc[window.begin : window.end][None].to(device)
    nll = truncated_nll(model, ids, original, stride, chunk_size)[0, window.score_from - 1 :].double().cpu()
    return _window_result(nll, window, buckets, original)


def _window_result(nll: torch.Tensor, window: Window, buckets: int, original: int | None = None) -> dict:
    """The cell of a window from the NLL of its scored tokens (``window.score_from`` on); with ``original``, the
    NLL sum and count of those at positions >= ``original`` (``past_from``, ``past_sum``, ``past_cnt``: the tokens
    past L exactly, wherever the position buckets' edges fall)."""
    sums, counts = [], []
    edges = bucket_edges(window.end - window.begin, buckets)
    for a, b in zip(edges[:-1], edges[1:]):
        part = nll[max(a, window.score_from) - window.score_from : max(b, window.score_from) - window.score_from]
        sums.append(part.sum().item())
        counts.append(part.numel())
    got = {"tokens": nll.numel(), "nll_sum": nll.sum().item(), "bucket_sum": sums, "bucket_cnt": counts}
    if original is not None:
        past = nll[max(original, window.score_from) - window.score_from :]
        got.update(past_from=original, past_sum=past.sum().item(), past_cnt=past.numel())
    return got


def counted_past_exactly(cells: list[dict], original: int | None) -> bool:
    """Whether every cell counted its tokens past ``original`` exactly (``past_from``: cells of this release; those
    written before hold only the position buckets)."""
    return original is not None and all(c.get("past_from") == original for c in cells)


def past_original(curve_sum: list[float], curve_cnt: list[int], edges: list[int], original: int | None,
                  cells: list[dict] = ()) -> dict | None:
    """The loss of the tokens past the original context L over every window: exactly those at positions >= L
    (``from`` = L) when every cell counted them (cells of this release); else, for cells written before, those of the
    position buckets from the first bucket edge at or after L (``from``: that edge). None when no token is there."""
    if cells and counted_past_exactly(cells, original):
        total, count = sum(c["past_sum"] for c in cells), sum(c["past_cnt"] for c in cells)
        if not count:
            return None
        return {"from": original, "tokens": count, "nll": total / count, "ppl": math.exp(total / count)}
    firsts = [k for k, a in enumerate(edges[:-1]) if original is not None and a >= original]
    if not firsts or not sum(curve_cnt[firsts[0]:]):
        return None
    total, count = sum(curve_sum[firsts[0]:]), sum(curve_cnt[firsts[0]:])
    return {"from": edges[firsts[0]], "tokens": count, "nll": total / count, "ppl": math.exp(total / count)}


def aggregate_length(length: int, windows: list[Window], cells: list[dict], names: list[str], buckets: int,
                     original: int | None = None, exact_past: bool = True) -> dict:
    """The numbers of one length from its windows' cells (in the order of ``windows``); ``original``: the model's
    original context L, past which the loss is also given (:func:`past_original`; ``exact_past=False``: from the
    position buckets even where the cells counted the tokens past L exactly, as a run whose other cells did not
    must, to compare the same tokens)."""
    doc_sum, doc_cnt = [0.0] * len(names), [0] * len(names)
    edges = bucket_edges(length, buckets)
    curve_sum, curve_cnt = [0.0] * (len(edges) - 1), [0] * (len(edges) - 1)
    for w, c in zip(windows, cells):
        doc_sum[w.doc] += c["nll_sum"]
        doc_cnt[w.doc] += c["tokens"]
        for k in range(len(curve_sum)):
            curve_sum[k] += c["bucket_sum"][k]
            curve_cnt[k] += c["bucket_cnt"][k]
    total_nll, total_tok = sum(doc_sum), sum(doc_cnt)
    per_doc = [{"name": names[i], "tokens": doc_cnt[i], "nll": doc_sum[i] / doc_cnt[i],
                "ppl": math.exp(doc_sum[i] / doc_cnt[i])} for i in range(len(names)) if doc_cnt[i]]
    m, lo, hi = mean_ci95([d["nll"] for d in per_doc])
    curve = [{"from": a, "to": b, "nll": curve_sum[k] / curve_cnt[k]}
             for k, (a, b) in enumerate(zip(edges[:-1], edges[1:])) if curve_cnt[k]]
    return {
        "length": length, "ppl": math.exp(total_nll / total_tok), "nll": total_nll / total_tok, "tokens": total_tok,
        "windows": len(windows), "doc_mean_ppl": math.exp(m),
        "ci95": [math.exp(lo), math.exp(hi)] if lo is not None else None,
        "docs": per_doc, "skipped_docs": [names[i] for i in range(len(names)) if not any(w.doc == i for w in windows)],
        "curve": curve,
        "past_original": past_original(curve_sum, curve_cnt, edges, original, cells if exact_past else ()),
    }


def evaluate_perplexity(model, docs: list[torch.Tensor], lengths: list[int], names: list[str] | None = None,
                        mode: str = "windows", stride: int | None = None, max_windows: int | None = None,
                        buckets: int = 32, chunk_size: int = 1024, progress: bool = True, desc: str = "") -> dict:
    """Perplexity of ``model`` over tokenized ``docs`` (1-D LongTensors) at each of ``lengths``.

    Returns, per length: the token-weighted perplexity, the mean of per-document perplexities with a
    95% interval across documents, per-document numbers, and the loss curve by position (``buckets``
    equal position ranges). Documents shorter than a length are skipped for it and listed; a length
    that no document reaches raises ValueError naming the longest document. (``hf-posenc eval ppl``
    computes the same windows as resumable cells, see ``run_ppl``.)"""
    names = names or [f"doc{i}" for i in range(len(docs))]
    results = {}
    for length, windows in plan_lengths(docs, lengths, mode, stride, max_windows).items():
        cells = [window_cell(model, docs[w.doc], w, buckets, chunk_size)
                 for w in tqdm(windows, desc=f"{desc} ppl@{length}".strip(), disable=not progress, leave=False)]
        results[str(length)] = aggregate_length(length, windows, cells, names, buckets)
    return results
