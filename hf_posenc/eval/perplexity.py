"""Long-context perplexity: token-weighted NLL per evaluated length, per document, per position.

Two modes:
- ``windows``: non-overlapping windows of exactly ``length`` tokens; every token but the first of
  each window is scored, so the per-position curve shows the loss at each distance into the context.
- ``sliding``: windows of ``length`` tokens moved by ``stride``; only the tokens new to each window
  are scored (as in the Hugging Face perplexity guide), so each scored token sees at least
  ``length - stride`` tokens of context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .scoring import token_nll
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


def evaluate_perplexity(model, docs: list[torch.Tensor], lengths: list[int], names: list[str] | None = None,
                        mode: str = "windows", stride: int | None = None, max_windows: int | None = None,
                        buckets: int = 32, chunk_size: int = 1024, progress: bool = True, desc: str = "") -> dict:
    """Perplexity of ``model`` over tokenized ``docs`` (1-D LongTensors) at each of ``lengths``.

    Returns, per length: the token-weighted perplexity, the mean of per-document perplexities with a
    95% interval across documents, per-document numbers, and the loss curve by position (``buckets``
    equal position ranges). Documents shorter than a length are skipped for it and listed; a length
    that no document reaches raises ValueError naming the longest document."""
    names = names or [f"doc{i}" for i in range(len(docs))]
    longest = max((len(d) for d in docs), default=0)
    for length in lengths:
        if longest < length:
            raise ValueError(
                f"too little text for length {length}: the longest document has {longest} tokens; "
                "pass more or longer text, or smaller --lengths."
            )
    device = next(model.parameters()).device
    results = {}
    for length in lengths:
        plans = [plan_windows(len(d), length, mode, stride, max_windows, doc=i) for i, d in enumerate(docs)]
        windows = [w for p in plans for w in p]
        skipped = [names[i] for i, p in enumerate(plans) if not p]
        n_buckets = max(1, min(buckets, length - 1))
        edges = [1 + round(k * (length - 1) / n_buckets) for k in range(n_buckets + 1)]
        curve_sum = torch.zeros(length, dtype=torch.float64)
        curve_cnt = torch.zeros(length, dtype=torch.float64)
        doc_sum = [0.0] * len(docs)
        doc_cnt = [0] * len(docs)
        for w in tqdm(windows, desc=f"{desc} ppl@{length}".strip(), disable=not progress, leave=False):
            ids = docs[w.doc][w.begin : w.end][None].to(device)
            nll = token_nll(model, ids, chunk_size=chunk_size, start=w.score_from)[0].double()
            curve_sum[w.score_from :] += nll
            curve_cnt[w.score_from :] += 1
            doc_sum[w.doc] += nll.sum().item()
            doc_cnt[w.doc] += nll.numel()
        total_nll, total_tok = sum(doc_sum), sum(doc_cnt)
        per_doc = [
            {"name": names[i], "tokens": doc_cnt[i], "nll": doc_sum[i] / doc_cnt[i], "ppl": math.exp(doc_sum[i] / doc_cnt[i])}
            for i in range(len(docs)) if doc_cnt[i]
        ]
        m, lo, hi = mean_ci95([d["nll"] for d in per_doc])
        curve = []
        for a, b in zip(edges[:-1], edges[1:]):
            cnt = curve_cnt[a:b].sum().item()
            if cnt:
                curve.append({"from": a, "to": b, "nll": curve_sum[a:b].sum().item() / cnt})
        results[str(length)] = {
            "length": length,
            "ppl": math.exp(total_nll / total_tok),
            "nll": total_nll / total_tok,
            "tokens": total_tok,
            "windows": len(windows),
            "doc_mean_ppl": math.exp(m),
            "ci95": [math.exp(lo), math.exp(hi)] if lo is not None else None,
            "docs": per_doc,
            "skipped_docs": skipped,
            "curve": curve,
        }
    return results
