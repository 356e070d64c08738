"""A RoPE scaling on a checkpoint whose RoPE is already scaled (Llama 3.1's llama3 x8, gpt-oss's YaRN x32, a Qwen
with YaRN x4): it extends from what the checkpoint is now, never from its pretraining length.

The method acts on the checkpoint's own frequencies -- those its rotary module computes, for any static scaling
transformers implements -- with L = the context the checkpoint advertises now (``max_position_embeddings``), by its
rule in :mod:`hf_posenc.encodings.rope` (``compose_*``): ``yarn`` x2 on a 128k Llama 3.1 gives 256k, keeps the
dimensions that turn often within 128k and halves the slowest; ``pi`` x2 halves every one. The result is one
LongRoPE configuration, which transformers and hf_posenc compute natively (vLLM reads longrope otherwise: it picks
the short or the long factors once, by ``--max-model-len``, and derives its own temperature): ``short_factor`` =
the checkpoint's own per-dimension factors (inputs up to its current context keep its frequencies), ``long_factor``
= the composed ones (past it), ``original_max_position_embeddings`` = its current context, ``attention_factor`` =
its own times what the method adds (YaRN's 0.1 ln s + 1, at every length as YaRN applies it;
``attention_factor=1.0`` keeps inputs up to the current context exactly as the checkpoint computed them).

On a LongRoPE checkpoint (Phi-3's 128k) the method acts on its long frequencies over the context it advertises, its
short factors stay for inputs up to its recorded original context, where it switches (:func:`_on_longrope`).

Replacing the checkpoint's scaling instead stays possible: give ``original_max_position_embeddings`` (its
pretraining context), and the method scales from there, as on an unscaled model.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..config import PosEncConfig
from ..encodings import rope as R
from ..methods.rope import SCALINGS
from .layout import Layout, rope_geometry
from .rope_native import softmax_rescalers

logger = logging.getLogger(__name__)

# rope types whose frequencies transformers recomputes with the length: their "own frequencies" are not one set
LENGTH_DEPENDENT_TYPES = ("dynamic", "longrope")


def scaled_type(lay: Layout) -> str | None:
    """The checkpoint's own scaling (its ``rope_type``) when any rotary slot the method changes is scaled, else None."""
    types = {s.rope_parameters(lay.config).get("rope_type", "default") for s in lay.selected}
    scaled = sorted(t for t in types if t != "default")
    return scaled[0] if scaled else None


def composed_config(model: nn.Module, cfg: PosEncConfig, lay: Layout) -> PosEncConfig:
    """``cfg`` (a RoPE scaling, no original context given) on the checkpoint of ``lay``, whose RoPE is scaled: the
    LongRoPE configuration that computes it (module doc); refused by name where it cannot be composed."""
    own_type = scaled_type(lay)
    context = getattr(lay.config, "max_position_embeddings", None)
    _check_composable(model, cfg, lay, own_type, context)
    if own_type in ON_LENGTH_DEPENDENT:
        return ON_LENGTH_DEPENDENT[own_type](cfg, lay, int(context))
    base, own = _base_and_own(lay, int(context))
    scaling = SCALINGS[cfg.method]
    params = scaling.defaults(dict(cfg.params), own.shape[-1], cfg.factor) if scaling.defaults else dict(cfg.params)
    new, added = scaling.compose(own.float(), int(context), cfg.factor, params)
    attention = float(lay.selected[0].get("attention_scaling")) * float(added)
    composed = PosEncConfig("longrope", cfg.factor, int(context), {
        "short_factor": (base / own).tolist(), "long_factor": (base / new.double()).tolist(),
        "attention_factor": attention})
    logger.warning("the checkpoint's RoPE is already scaled (rope_type=%r, context %d): hf_posenc extends it from "
                   "there -- %s on top gives %d tokens, computed as longrope (inputs up to %d keep the checkpoint's "
                   "frequencies). To replace its scaling instead, give original_max_position_embeddings=%s.",
                   own_type, context, cfg.to_text(), scaling.max_position(cfg.factor, int(context)), context,
                   recorded_original(lay))
    return composed


def _on_longrope(cfg: PosEncConfig, lay: Layout, context: int) -> PosEncConfig:
    """``cfg`` on a LongRoPE checkpoint (Phi-3's 128k): its short factors stay for inputs up to its recorded original
    context, the method acts on its long frequencies over the context it advertises (what they are trained for),
    and the attention factor is its own times what the method adds. One LongRoPE configuration over its original
    context, advertising the method's length from the current context."""
    slot = lay.selected[0]
    rp = slot.rope_parameters(lay.config)
    original = rp.get("original_max_position_embeddings") or getattr(lay.config, "original_max_position_embeddings",
                                                                      None)
    if not isinstance(original, int) or not 0 < original <= context:
        raise ValueError(f"the checkpoint's RoPE is LongRoPE but states no original_max_position_embeddings (where it "
                         f"switches from its short to its long factors), got {original!r}: {cfg.method!r} cannot be "
                         "put on top of it")
    geom = rope_geometry(lay.config, context, rp)
    base = R.default_inv_freq(geom.base, geom.dim).double()
    own_long = base / torch.tensor(rp["long_factor"], dtype=torch.float64)
    scaling = SCALINGS[cfg.method]
    params = scaling.defaults(dict(cfg.params), base.shape[-1], cfg.factor) if scaling.defaults else dict(cfg.params)
    new, added = scaling.compose(own_long.float(), context, cfg.factor, params)
    target = scaling.max_position(cfg.factor, context)
    composed = PosEncConfig("longrope", target / original, original, {
        "short_factor": [float(f) for f in rp["short_factor"]], "long_factor": (base / new.double()).tolist(),
        "attention_factor": float(slot.get("attention_scaling")) * float(added)})
    logger.warning("the checkpoint's RoPE is LongRoPE (context %d, short factors up to %d tokens): hf_posenc extends "
                   "it from there -- %s on its long factors gives %d tokens (inputs up to %d keep its short factors). "
                   "To replace its scaling instead, give original_max_position_embeddings=%d.",
                   context, original, cfg.to_text(), target, original, original)
    return composed


# the length-dependent own types a scaling is put on top of, each by its rule (the others are refused)
ON_LENGTH_DEPENDENT = {"longrope": _on_longrope}


def _base_and_own(lay: Layout, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain RoPE frequencies of the checkpoint's base and the ones its rotary module computes now (float64):
    a longrope's factors of them are ``base / frequencies``."""
    slot = lay.selected[0]
    geom = rope_geometry(lay.config, context, slot.rope_parameters(lay.config))
    return R.default_inv_freq(geom.base, geom.dim).double(), slot.get("inv_freq").detach().double().cpu()


def recorded_original(lay: Layout) -> int | None:
    """The original context a scaled checkpoint records (its rope_parameters', else max_position_embeddings): the
    original_max_position_embeddings a replacement of its scaling is given."""
    rp = lay.selected[0].rope_parameters(lay.config)
    recorded = rp.get("original_max_position_embeddings") or getattr(lay.config, "max_position_embeddings", None)
    return int(recorded) if recorded else None


def own_scaling(block: dict[str, Any], prefix: str, original: int | None) -> dict[str, Any] | None:
    """The scaling a patched checkpoint had before its patch, read from its hf_posenc ``block`` (``prefix``: the
    language model's sub-config path): None when its RoPE was not scaled (or is one per layer type), else its
    ``rope_type``, the ``pretrained_context`` it records, the ``context`` it advertised, and whether the patch
    ``replaced`` it (scaled from ``original``, the patch's original context, equal to the pretraining one) rather
    than extended it from that context (a composed longrope)."""
    before = block.get("original") or {}
    own = before.get(prefix + "rope_parameters") or {}
    if not isinstance(own, dict) or own.get("rope_type", "default") == "default":
        return None
    pretrained = own.get("original_max_position_embeddings")
    return {"rope_type": own["rope_type"], "pretrained_context": pretrained,
            "context": before.get(prefix + "max_position_embeddings"),
            "replaced": pretrained is not None and pretrained == original}


def restates_checkpoint(cfg: PosEncConfig, lay: Layout) -> bool:
    """Whether ``cfg`` is a composed configuration of this checkpoint, restated (as ``hf_posenc.from_pretrained``
    re-applies one): per-dimension factors over its current context whose short ones give its own frequencies."""
    scaling = SCALINGS.get(cfg.method)
    short = cfg.params.get("short_factor")
    if scaling is None or not scaling.per_dimension or short is None or lay.layered:
        return False
    if cfg.original_max_position_embeddings != getattr(lay.config, "max_position_embeddings", None):
        return False
    base, own = _base_and_own(lay, cfg.original_max_position_embeddings)
    return len(short) == own.shape[-1] and bool(torch.allclose(base / torch.tensor(short, dtype=torch.float64), own,
                                                               rtol=1e-5, atol=0))


def _check_composable(model: nn.Module, cfg: PosEncConfig, lay: Layout, own_type: str, context) -> None:
    replace = (f"give original_max_position_embeddings={recorded_original(lay)} (the original context it records) to "
               "replace its scaling instead")
    what = f"the checkpoint's RoPE is already scaled (rope_type={own_type!r})"
    if softmax_rescalers(model):
        raise ValueError(f"{what}, and {type(model).__name__} derives its attention's softmax scale from those RoPE "
                         f"parameters (MLA: YaRN's mscale_all_dim), which a longrope configuration cannot carry: "
                         f"putting {cfg.method!r} on top of it is not supported yet; {replace}.")
    if SCALINGS[cfg.method].compose is None:
        raise ValueError(f"{what}, and {cfg.method!r} follows the sequence length, which hf_posenc does not put on "
                         f"top of another scaling; use a static one (pi, ntk, yarn, llama3, longrope), which extends "
                         f"from the checkpoint's current context, or {replace}.")
    if own_type in LENGTH_DEPENDENT_TYPES and own_type not in ON_LENGTH_DEPENDENT:
        raise ValueError(f"{what}, whose frequencies change with every input's length: hf_posenc does not put "
                         f"{cfg.method!r} on top of it yet; {replace}.")
    if lay.layered:
        raise ValueError(f"{what} on a model with per-layer-type RoPE: putting {cfg.method!r} on top of it is not "
                         f"supported yet; {replace}.")
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"{what}, and its config states no max_position_embeddings (the context it has now) to "
                         f"extend from; {replace}.")

