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
tokens the same for every method: ``--evaluator MODEL`` (:func:`key_positions_cell` finds them once per window
with the evaluator, :func:`scored_key_cell` scores each method on them). The evaluator must share the tokenizer of the
model under test (the key tokens are token positions; the reference code's alignment of two tokenizers by character
offsets is not implemented). Tokens within the first L of a window have the same context both ways (LSD = 0): only
tokens past L can be key tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from ..checkpoints import runtime
from ..config import PosEncConfig
from ..patching import patch
from .cells import NUMBER
from .common import model_identity
from .perplexity import Window, truncated_nll
from .scoring import input_device, require_causal_lm, token_nll
from .variants import Variant

ALPHA, BETA = 2.0, -2.0
KEY_FIELDS = {"key_count": NUMBER, "key_nll_sum": NUMBER, "scored": NUMBER}
POSITION_FIELDS = {"positions": list, "scored": NUMBER, "nll_sum": NUMBER}


def _long_short(model, doc, window: Window, original: int, stride: int, chunk_size: int):
    """The NLL of the window's scored tokens under ``model`` with the whole window before each, and with at most
    ``original`` tokens before each (float64, on the CPU)."""
    ids = doc[window.begin : window.end][None].to(input_device(model))
    long = token_nll(model, ids, chunk_size=chunk_size)[0].double().cpu()
    short = truncated_nll(model, ids, original, stride, chunk_size)[0].double().cpu()
    return long[window.score_from - 1 :], short[window.score_from - 1 :]


def key_mask(long, short, alpha: float = ALPHA, beta: float = BETA):
    """Key tokens from NLLs: LSD = short - long > alpha and LCL = -long > beta."""
    return ((short - long) > alpha) & (-long > beta)


def key_token_cell(model, doc, window: Window, original: int, stride: int, alpha: float = ALPHA, beta: float = BETA,
                   chunk_size: int = 1024) -> dict[str, Any]:
    """One window's key tokens under ``model`` as it is (its own evaluator): their count and the sum of their
    long-context NLL, and how many tokens were scored."""
    long, short = _long_short(model, doc, window, original, stride, chunk_size)
    key = key_mask(long, short, alpha, beta)
    return {"key_count": int(key.sum()), "key_nll_sum": long[key].sum().item(), "scored": long.numel(),
            "lsd_max": (short - long).max().item()}


def key_positions_cell(evaluator, doc, window: Window, original: int, stride: int, alpha: float = ALPHA,
                       beta: float = BETA, chunk_size: int = 1024) -> dict[str, Any]:
    """One window's key tokens as the ``evaluator`` model judges them: their indices among the scored tokens,
    how many were scored, and the evaluator's own long-context NLL over them."""
    long, short = _long_short(evaluator, doc, window, original, stride, chunk_size)
    key = key_mask(long, short, alpha, beta)
    return {"positions": key.nonzero()[:, 0].tolist(), "scored": long.numel(), "nll_sum": long[key].sum().item(),
            "lsd_max": (short - long).max().item()}


def scored_key_cell(model, doc, window: Window, positions: list[int], chunk_size: int = 1024) -> dict[str, Any]:
    """``model``'s long-context NLL over the evaluator's key tokens ``positions`` of one window (the fields of
    :func:`key_token_cell`); no forward when there is no key token."""
    if not positions:
        return {"key_count": 0, "key_nll_sum": 0.0, "scored": window.end - window.begin - window.score_from}
    ids = doc[window.begin : window.end][None].to(input_device(model))
    long = token_nll(model, ids, chunk_size=chunk_size)[0].double().cpu()[window.score_from - 1 :]
    return {"key_count": len(positions), "key_nll_sum": long[positions].sum().item(), "scored": long.numel()}


def aggregate_key_tokens(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The key tokens of one length over its windows: count, share of the scored tokens, perplexity (None when
    there are none), and the largest long-short difference of any scored token (``lsd_max``, nats: how close the
    likeliest-helped token came to ``alpha``; judged by the cells' own model, absent from cells that predate it)."""
    count, total, scored = (sum(c[k] for c in cells) for k in ("key_count", "key_nll_sum", "scored"))
    out = {"count": count, "share": count / scored if scored else 0.0,
           "ppl": math.exp(total / count) if count else None}
    if cells and all("lsd_max" in c for c in cells):
        out["lsd_max"] = max(c["lsd_max"] for c in cells)
    return out


def aggregate_key_positions(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluator's own key tokens of one length (:func:`key_positions_cell` cells), as :func:`aggregate_key_tokens`
    gives a method's."""
    return aggregate_key_tokens([{"key_count": len(c["positions"]), "key_nll_sum": c["nll_sum"], "scored": c["scored"],
                                  **({"lsd_max": c["lsd_max"]} if "lsd_max" in c else {})} for c in cells])


@dataclass(frozen=True)
class Evaluator:
    """The model that judges which tokens are key tokens, for every method alike: ``variant`` is patched onto the model
    under test (when ``model`` is None) or names a separate ``model`` already patched; ``ident`` names both in the
    cells' keys; ``description`` says it in the report."""

    variant: Variant
    model: Any | None
    ident: str
    description: str


def evaluator_config(method: str | None):
    """The PosEncConfig of ``--evaluator-method METHOD[:KEY=VALUE,...]`` (none when not given), checked before any
    model loads."""
    if not method:
        return PosEncConfig("none")
    try:
        return PosEncConfig.parse(method)
    except ValueError as err:
        raise ValueError(f"--evaluator-method: {err}") from None


def load_evaluator(job, model: str | None, method: str | None) -> Evaluator:
    """The evaluator of ``--evaluator MODEL`` (default: the model under test) patched by ``--evaluator-method
    METHOD[:KEY=VALUE,...]`` (default: none); a model whose tokenizer differs from the one under test is refused."""

    config = evaluator_config(method)
    tok = job.loaded[1]
    if model is None:
        ident = {"model": "under test", "config": config.to_dict()}
        separate, name = None, f"the model under test ({job.model})"
    else:
        separate, ev_tok, ev_src = runtime.load_model_and_tokenizer(model, job.dtype, job.device,
                                                                    tokenizer=job.tokenizer)
        require_causal_lm(separate)
        if ev_tok.get_vocab() != tok.get_vocab():
            raise ValueError(f"--evaluator {model}: its tokenizer differs from the model under test's ({len(ev_tok)} "
                             f"vs {len(tok)} tokens); key tokens are token positions, so the evaluator must share the "
                             "tokenizer (aligning two tokenizers is not implemented)")
        patch(separate, config)
        ident = {"model": model_identity(model, separate, ev_src), "config": config.to_dict()}
        name = model
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    said = name + (f" patched by {method}" if method else " (unpatched)")
    # a separate model is patched already: the model under test takes no patch for its cells
    variant = Variant(f"key-token-evaluator-{digest[:8]}", config if separate is None else PosEncConfig("none"))
    return Evaluator(variant, separate, digest, said)
