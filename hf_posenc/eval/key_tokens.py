"""Key-token perplexity (LongPPL: Fang et al. 2024, "What is Wrong with Perplexity for Long-context Language
Modeling?", arXiv:2410.23771): perplexity over the tokens whose prediction depends on long context.

For a token x_i of a window, with the evaluator's log-probabilities given the whole window before it (long) and
given at most the original context L before it (short, :func:`perplexity.truncated_nll`):

    LSD(x_i) = log P(x_i | long) - log P(x_i | short)     (long-short difference)
    LCL(x_i) = log P(x_i | long)                          (long-context likelihood)

x_i is a key token when LSD > ``alpha`` and LCL > ``beta`` (the paper's and its reference code's alpha = 2,
beta = -2, strict: the long context makes the token more than e^2 times likelier, and the token is predicted well
with it). The reference code's short context is a fixed 4,096 tokens plus up to 1,024; here it is the model's
original context L, less up to a stride (:func:`perplexity.truncated_nll`), so that "short" is what the model was
trained on. The key-token perplexity
of a method is exp(mean NLL of its long-context predictions over the key tokens). Here the evaluator is the model
under test, patched by the method being measured (so each method has its own key tokens: those its longer
context helps it predict); the paper recommends a strong long-context model as the evaluator, which makes the key
tokens the same for every method -- not implemented yet. Tokens within the first L of a window have the same
context both ways (LSD = 0): only tokens past L can be key tokens.
"""

from __future__ import annotations

import math
from typing import Any

from .cells import NUMBER
from .perplexity import Window, truncated_nll
from .scoring import input_device, token_nll

ALPHA, BETA = 2.0, -2.0
KEY_FIELDS = {"key_count": NUMBER, "key_nll_sum": NUMBER, "scored": NUMBER}


def key_token_cell(model, doc, window: Window, original: int, stride: int, alpha: float = ALPHA, beta: float = BETA,
                   chunk_size: int = 1024) -> dict[str, Any]:
    """One window's key tokens under ``model`` as it is: their count and the sum of their long-context NLL, and
    how many tokens were scored."""
    device = input_device(model)
    ids = doc[window.begin : window.end][None].to(device)
    long = token_nll(model, ids, chunk_size=chunk_size)[0].double()
    short = truncated_nll(model, ids, original, stride, chunk_size)[0].double()
    long, short = long[window.score_from - 1 :], short[window.score_from - 1 :]
    key = ((short - long) > alpha) & (-long > beta)
    return {"key_count": int(key.sum()), "key_nll_sum": long[key].sum().item(), "scored": long.numel()}


def aggregate_key_tokens(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The key tokens of one length over its windows: count, share of the scored tokens, perplexity (None when
    there are none)."""
    count, total, scored = (sum(c[k] for c in cells) for k in ("key_count", "key_nll_sum", "scored"))
    return {"count": count, "share": count / scored if scored else 0.0,
            "ppl": math.exp(total / count) if count else None}
