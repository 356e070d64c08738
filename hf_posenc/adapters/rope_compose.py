"""A RoPE scaling on a checkpoint whose RoPE is already scaled (Llama 3.1's llama3 x8, gpt-oss's YaRN x32, a Qwen
with YaRN x4): it extends from what the checkpoint is now, never from its pretraining length.

The method acts on the checkpoint's own frequencies -- those its rotary module computes, for any static scaling
transformers implements -- with L = the context the checkpoint advertises now (``max_position_embeddings``), by its
rule in :mod:`hf_posenc.encodings.rope` (``compose_*``): ``yarn`` x2 on a 128k Llama 3.1 gives 256k, keeps the
dimensions that turn often within 128k and halves the slowest; ``pi`` x2 halves every one. The result is one
LongRoPE configuration, which transformers and hf_posenc compute natively (vLLM reads longrope otherwise: it picks
the short or the long factors once, by ``--max-model-len``, with ``short_mscale`` / ``long_mscale`` as the
temperature, which hf_posenc writes: ``hf-posenc serve-config`` says which inputs a launch matches): ``short_factor`` =
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
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import PosEncConfig, SavedBlock
from ..encodings import rope as R
from ..methods import METHODS
from ..methods.rope import DEFAULT_CACHE, SCALINGS
from .base import text_config
from .layout import (
    Layout,
    checkpoint_context,
    current_context,
    default_layer_types,
    per_layer_type,
    rope_geometry,
    scaled_by,
)
from .mrope import is_mrope
from .rope_native import softmax_rescalers

logger = logging.getLogger(__name__)

# rope types whose frequencies transformers recomputes with the length: their "own frequencies" are not one set
LENGTH_DEPENDENT_TYPES = ("dynamic", "longrope")
# where hf_posenc.from_pretrained keeps, on the model it loads, the context under a saved composition (its block
# comes off the config before the block is re-applied): composed_over_config, under_composition
UNDER_KEY = "_hf_posenc_composed_over"


def kept_scaling(block: Any) -> PosEncConfig | None:
    """The RoPE scaling a checkpoint was saved with by hf_posenc (``block``: its config.json's hf_posenc block) when
    that scaling is what the checkpoint is -- one with fixed frequencies (pi, ntk, yarn, llama3, and longrope, whose
    two fixed lists include a composition's) that plain transformers computes from the saved config (``native``) --
    so that later patches start from it, as on that folder loaded by plain transformers (a patch on top covers its
    per-length switch: :attr:`PatchRecord.covered`); else None: one whose frequencies grow with the length (dynamic
    NTK) or one transformers does not compute is replaced by a later patch, which starts from the model without it."""
    if not isinstance(block, dict) or block.get("native") is not True:
        return None
    try:
        cfg = SavedBlock.from_dict(block).config
    except ValueError:
        return None
    scaling = SCALINGS.get(cfg.method)
    return cfg if cfg.spec.kind == "rope" and scaling is not None and scaling.dynamic in (None, "switch") else None


def scaled_type(lay: Layout) -> str | None:
    """The checkpoint's own scaling (its ``rope_type``) when any rotary slot the method changes is scaled, else None."""
    types = {scaled_by(s.rope_parameters(lay.config)) for s in lay.selected}
    scaled = sorted(t for t in types if t is not None)
    return scaled[0] if scaled else None


@dataclass(frozen=True)
class OwnRope:
    """What a composition reads of the checkpoint's RoPE (one rotary slot, or its config alone): the language-model
    ``config``, the slot's ``rope_parameters``, the frequencies it computes now and its attention scaling, and the
    layer types it belongs to (per-layer-type RoPE; None: one RoPE for all layers)."""

    config: Any
    rope: dict[str, Any]
    inv_freq: torch.Tensor
    attention: float
    layer_types: list[str] | None = None
    pretrained: int | None = None


def own_rope(lay: Layout) -> OwnRope:
    """The RoPE of the first rotary slot ``lay`` changes (a composition requires them alike: :func:`_uniform`)."""
    slot = lay.selected[0]
    return OwnRope(lay.config, slot.rope_parameters(lay.config), _held_frequencies(slot, lay.config),
                   float(slot.get("attention_scaling")), lay.chosen_types() if lay.layered else None,
                   under_composition(lay))


def _held_frequencies(slot, config: Any) -> torch.Tensor:
    """The frequencies the slot's rotary module holds (float64), which a composition writes its factors from: where
    the module was cast to a half-precision dtype (``model.to(torch.bfloat16)``), those transformers' initialisation
    computes from the config, checked against the held ones to their precision (the saved factors stay fp32's)."""
    held = slot.get("inv_freq").detach()
    if held.dtype in (torch.float32, torch.float64) or \
            slot.rope_parameters(config).get("rope_type") in LENGTH_DEPENDENT_TYPES:  # (a longrope's long factors
        return held.double().cpu()  # are read from its config: _on_longrope)
    computed = own_rope_of_config(config, slot.layer_type).inv_freq
    if computed.shape != held.shape or not torch.allclose(computed, held.double().cpu(), rtol=2 ** -7, atol=0):
        raise ValueError(f"the rotary module holds its frequencies in {held.dtype}, and they are not the ones its "
                         "config gives: hf_posenc cannot tell the checkpoint's own frequencies to fp32 to compose on "
                         "them; load the model with its rotary buffers in float32 (from_pretrained with dtype=... "
                         "keeps them so) and patch it before casting it.")
    return computed


def own_rope_of_config(config: Any, layer_type: str | None = None, block: Any = None, prefix: str = "") -> OwnRope:
    """The RoPE a checkpoint's ``config`` describes (its ``layer_type``'s, per-layer-type RoPE), computed by
    transformers' own initialisation, as its rotary module computes it at load: no weights needed (``block``,
    ``prefix``: the model config's hf_posenc block and the language model's path in it, :func:`composed_over`)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rp = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
    init = ROPE_INIT_FUNCTIONS[rp.get("rope_type", "default")] if rp.get("rope_type", "default") != "default" else None
    kwargs = {"layer_type": layer_type} if layer_type is not None else {}
    if init is None:
        geom = rope_geometry(config, getattr(config, "max_position_embeddings", 1), rp, layer_type)
        inv, attention = R.default_inv_freq(geom.base, geom.dim), 1.0
    else:  # a longrope: its long frequencies, those past its switch, where a method on top acts
        past = int(getattr(config, "max_position_embeddings", 0)) + 1
        long = {"seq_len": past} if rp.get("rope_type") in ON_LENGTH_DEPENDENT else {}
        inv, attention = init(config, "cpu", **kwargs, **long)
    return OwnRope(config, rp, inv.double(), float(attention), [layer_type] if layer_type else None,
                   composed_over(block, prefix, rp))


def composed_config(cfg: PosEncConfig, lay: Layout) -> PosEncConfig:
    """``cfg`` (a RoPE scaling, no original context given) on the checkpoint of ``lay``, whose RoPE is scaled: the
    LongRoPE configuration that computes it (module doc); refused by name where it cannot be composed."""
    own_type = scaled_type(lay)
    context = checkpoint_context(lay)
    _check_composable(cfg, lay, own_type, context)
    composed = compose(cfg, own_rope(lay), int(context))
    composed = composed.replace(params={**composed.params, "cache": composed_cache(cfg, lay)})
    composed.asked = cfg
    return composed


def composed_cache(cfg: PosEncConfig, lay: Layout) -> str:
    """What the composed longrope does to the KV cache at its switch: the ``cache`` asked (longrope's), else
    ``stale`` on multimodal RoPE (re-encoding or re-rotating follows 1-D positions: :mod:`.mrope`), else the
    length-dependent scalings' default."""
    if "cache" in cfg.params:
        return cfg.params["cache"]
    return "stale" if is_mrope(lay) else DEFAULT_CACHE


def kept_softmax_scale(model: nn.Module, cfg: PosEncConfig, lay: Layout) -> dict[str, float]:
    """On a model whose attention's softmax scale transformers derives from the RoPE parameters (DeepSeek-V2/V3 MLA:
    qk_head_dim^-0.5 x (0.1 mscale_all_dim ln factor + 1)^2, for any scaled rope_type), the key a composed
    longrope (``cfg``, over the checkpoint's current context) carries so that transformers gives back the
    checkpoint's own scale at the composed factor: ``{"mscale_all_dim": ...}`` ({} elsewhere, or when that scale is
    the plain one). The method's temperature rides on its attention_factor, as on any model."""
    rescalers = softmax_rescalers(model)
    own = lay.selected[0].rope_parameters(lay.config)
    over = (checkpoint_context(lay),  # a composition over the current context, or
            own.get("original_max_position_embeddings") if own.get("rope_type") in ON_LENGTH_DEPENDENT else None)
    composed = scaled_type(lay) is not None and cfg.original_max_position_embeddings in over  # (^ over its switch)
    if not rescalers or not composed or not SCALINGS[cfg.method].per_dimension:
        return {}
    m, _ = rescalers[0]
    ratio = float(m.scaling) / float(m.qk_head_dim) ** -0.5  # the checkpoint's mscale^2
    if math.isclose(ratio, 1.0, rel_tol=1e-12):
        return {}
    return {"mscale_all_dim": (math.sqrt(ratio) - 1) / (0.1 * math.log(cfg.factor))}


def compose(cfg: PosEncConfig, own: OwnRope, context: int) -> PosEncConfig:
    """``cfg`` on the scaled RoPE ``own`` of a checkpoint advertising ``context`` tokens: the LongRoPE configuration
    that computes it (module doc); the checks are the caller's (:func:`composed_config`)."""
    own_type = own.rope.get("rope_type", "default")
    if own_type == "proportional":  # its still pairs have no frequency a longrope's factors could divide
        raise ValueError("the checkpoint's RoPE is already scaled (rope_type='proportional'): a proportional RoPE "
                         f"with factor={own.rope.get('factor')}, whose pairs past partial_rotary_factor never turn; a "
                         "longrope cannot hold them, so hf_posenc does not compose on it; give "
                         f"original_max_position_embeddings={replacing_original(own)} (the context its scaling is "
                         "computed from) to replace its scaling instead.")
    if own_type in ON_LENGTH_DEPENDENT:
        return ON_LENGTH_DEPENDENT[own_type](cfg, own, context)
    geom = rope_geometry(own.config, context, own.rope, own.layer_types[0] if own.layer_types else None)
    base = R.default_inv_freq(geom.base, geom.dim).double()
    scaling = SCALINGS[cfg.method]
    params = scaling.defaults(dict(cfg.params), base.shape[-1], cfg.factor) if scaling.defaults else dict(cfg.params)
    new, added = scaling.compose(own.inv_freq.float(), context, cfg.factor, params)
    composed = PosEncConfig("longrope", cfg.factor, context, {
        "short_factor": (base / own.inv_freq).tolist(), "long_factor": (base / new.double()).tolist(),
        "attention_factor": own.attention * float(added), **_layer_types(own)})
    logger.warning("the checkpoint's RoPE is already scaled (rope_type=%r, context %d): hf_posenc extends it from "
                   "there -- %s on top gives %d tokens, computed as longrope (inputs up to %d keep the checkpoint's "
                   "frequencies%s). To replace its scaling instead, give original_max_position_embeddings=%s.",
                   own_type, context, cfg.to_text(), scaling.max_position(cfg.factor, context), context,
                   _temperature_note(float(added)), replacing_original(own))
    return composed


def _on_longrope(cfg: PosEncConfig, own: OwnRope, context: int) -> PosEncConfig:
    """``cfg`` on a LongRoPE checkpoint (Phi-3's 128k): its short factors stay for inputs up to its recorded original
    context, the method acts on its long frequencies over the context it advertises (what they are trained for),
    and the attention factor is its own times what the method adds. One LongRoPE configuration over its original
    context, advertising the method's length from the current context."""
    rp = own.rope
    original = rp.get("original_max_position_embeddings") or getattr(own.config, "original_max_position_embeddings",
                                                                     None)
    if not isinstance(original, int) or not 0 < original <= context:
        raise ValueError(f"the checkpoint's RoPE is LongRoPE but states no original_max_position_embeddings (where it "
                         f"switches from its short to its long factors), got {original!r}: {cfg.method!r} cannot be "
                         "put on top of it")
    geom = rope_geometry(own.config, context, rp)
    base = R.default_inv_freq(geom.base, geom.dim).double()
    own_long = base / torch.tensor(rp["long_factor"], dtype=torch.float64)
    scaling = SCALINGS[cfg.method]
    params = scaling.defaults(dict(cfg.params), base.shape[-1], cfg.factor) if scaling.defaults else dict(cfg.params)
    new, added = scaling.compose(own_long.float(), context, cfg.factor, params)
    target = scaling.max_position(cfg.factor, context)
    composed = PosEncConfig("longrope", target / original, original, {
        "short_factor": [float(f) for f in rp["short_factor"]], "long_factor": (base / new.double()).tolist(),
        "attention_factor": own.attention * float(added), **_layer_types(own)})
    logger.warning("the checkpoint's RoPE is LongRoPE (context %d, short factors up to %d tokens): hf_posenc extends "
                   "it from there -- %s on its long factors gives %d tokens (inputs up to %d keep its short "
                   "factors%s). To replace its scaling instead, give original_max_position_embeddings=%d.",
                   context, original, cfg.to_text(), target, original, _temperature_note(float(added)),
                   replacing_original(own))
    return composed


def _temperature_note(added: float) -> str:
    """What a composition's added temperature does to the inputs keeping the checkpoint's frequencies ('': none)."""
    if math.isclose(added, 1.0, rel_tol=1e-12):
        return ""
    return (f"; the method's attention factor x{added:.4g} applies at every length, so their logits move too: "
            "attention_factor=1.0 keeps them exactly")


def _layer_types(own: OwnRope) -> dict[str, Any]:
    """The ``layer_types`` knob of a composition on per-layer-type RoPE (Gemma 3: the scaled global layers), else
    nothing."""
    return {"layer_types": own.layer_types} if own.layer_types else {}


# the length-dependent own types a scaling is put on top of, each by its rule (the others are refused)
ON_LENGTH_DEPENDENT = {"longrope": _on_longrope}


def _base_and_own(lay: Layout, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain RoPE frequencies of the checkpoint's base and the ones its rotary module computes now (float64):
    a longrope's factors of them are ``base / frequencies``."""
    slot = lay.selected[0]
    geom = rope_geometry(lay.config, context, slot.rope_parameters(lay.config), slot.layer_type)
    return R.default_inv_freq(geom.base, geom.dim).double(), slot.get("inv_freq").detach().double().cpu()


def recorded_original(lay: Layout) -> int | None:
    """:func:`replacing_original` of the first rotary slot ``lay`` changes."""
    return replacing_original(own_rope(lay))


def replacing_original(own: OwnRope) -> int | None:
    """The original context a scaled checkpoint records (its rope_parameters', else max_position_embeddings; under
    a composition hf_posenc saved, the one its own scaling records: :func:`composed_over`): the
    original_max_position_embeddings a replacement of its scaling is given."""
    if own.pretrained is not None:
        return own.pretrained
    rp, context = own.rope, getattr(own.config, "max_position_embeddings", None)
    recorded = rp.get("original_max_position_embeddings") or context  # (a linear scaling records none: its context)
    return int(recorded) if recorded else None


def own_scaling(block: dict[str, Any], prefix: str, rope: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The scaling a patched checkpoint had before its patch, read from its hf_posenc ``block`` (``prefix``: the
    language model's sub-config path), else from ``rope``, its language model's ``rope_parameters`` now (a patch not
    saved as native rope_parameters leaves the checkpoint's there and records none). None when its RoPE was not
    scaled (per-layer-type RoPE: the one layer type the patch changed was not), else its ``rope_type``, the
    ``pretrained_context`` it records (None: it states none), the ``context`` it served (:func:`current_context`),
    and whether the patch ``replaced`` it (scaled from the original context given) rather than extended it from that
    context (a composition, whose block records what was ``asked``)."""
    before = block.get("original") or {}
    spec = METHODS.get(block.get("method"))
    scaling = spec is not None and spec.kind == "rope"  # (none and the attention-level methods keep the checkpoint's)
    own = before.get(prefix + "rope_parameters") or (rope if scaling else None) or {}
    if per_layer_type(own):
        chosen = (block.get("params") or {}).get("layer_types") or []
        own = own.get(chosen[0], {}) if len(chosen) == 1 else {}  # the one type the patch changed
    if not isinstance(own, dict) or scaled_by(own) is None:
        return None
    pretrained = block.get("pretrained_context") or own.get("original_max_position_embeddings")  # (linear: none)
    return {"rope_type": own["rope_type"], "pretrained_context": pretrained,
            "context": current_context(before.get(prefix + "max_position_embeddings"), own),
            "replaced": block.get("asked") is None}  # (a composition records what was asked on top)


def composed_over(block: Any, prefix: str, rp: dict[str, Any]) -> int | None:
    """Where ``rp`` (a rotary slot's rope_parameters) is a composition hf_posenc saved into the checkpoint (its
    ``block`` records what was asked and the longrope computed, ``prefix``: the language model's path), the context
    the checkpoint's own scaling under it is computed from (Llama 3.1's 8,192 under a yarn x2 on its llama3): what a
    replacement of the scaling starts from, the composed longrope's original context being the one it extended.
    A block written over such a composition (a composition on it, an attention-level method keeping it, a scaling
    replacing it) records that context itself (``pretrained_context``: ``RopeDecoderAdapter.resolve``), read where
    ``rp`` is still a longrope. None elsewhere."""
    if not isinstance(block, dict) or rp.get("rope_type") != "longrope":
        return None
    if isinstance(block.get("pretrained_context"), int):
        return block["pretrained_context"]
    if block.get("asked") is None or block.get("method") != "longrope" or \
            rp.get("long_factor") != (block.get("params") or {}).get("long_factor"):
        return None
    own = own_scaling(block, prefix)
    return None if own is None else own["pretrained_context"] or own["context"]


def under_composition(lay: Layout) -> int | None:
    """:func:`composed_over` of ``lay``'s model as it is: read from its config's hf_posenc block, else from what
    :func:`hf_posenc.from_pretrained` kept of the block it loaded (``lay.under``: it takes the block off the config
    before re-applying it), where the RoPE is still a longrope."""
    rp = lay.selected[0].rope_parameters(lay.config) if lay.selected else {}
    found = composed_over(lay.block, lay.prefix, rp)
    return found if found is not None or rp.get("rope_type") != "longrope" else lay.under


def composed_over_config(hf_config: Any, block: Any) -> int | None:
    """:func:`composed_over` of a checkpoint's config given its original fields back (the model without its patch:
    the layer type a patch changes, on per-layer-type RoPE) and its hf_posenc ``block``: what
    :func:`hf_posenc.from_pretrained` keeps on the model it loads (:data:`UNDER_KEY`)."""
    if not isinstance(block, dict):
        return None
    lm, prefix = text_config(hf_config)
    rope = getattr(lm, "rope_parameters", None) or {}
    if per_layer_type(rope):
        chosen = (block.get("params") or {}).get("layer_types") or default_layer_types(sorted(rope))
        rope = rope.get(chosen[0]) or {}
    return composed_over(block, prefix, rope)


def check_replacing_composition(cfg: PosEncConfig, lay: Layout) -> bool:
    """Whether ``cfg`` (its original context given) replaces a composition hf_posenc saved into the checkpoint,
    from the context the checkpoint's own scaling under it is computed from (:func:`composed_over`): a RoPE
    scaling computed from the plain frequencies, as on the checkpoint before the composition. Any other original
    context for such a scaling is refused by name (the composed longrope's own original context is no pretraining
    context: plain RoPE never served it); False where no composition is there, or for a configuration stating its
    per-dimension factors (a longrope) over another context (the composition restated over its switch)."""
    pretrained = under_composition(lay)
    scaling = SCALINGS.get(cfg.method)
    if pretrained is None or cfg.spec.kind != "rope" or scaling is None:
        return False
    L = cfg.original_max_position_embeddings
    if L == pretrained:
        return True
    if scaling.per_dimension:
        return False
    block = lay.block if isinstance(lay.block, dict) else {}
    own = own_scaling(block, lay.prefix) or {}
    what = (f"composition of {block['asked']} on its own {own.get('rope_type')!r} scaling"
            if block.get("asked") else "composition on its own scaling")  # (kept under another method)
    raise ValueError(
        f"original_max_position_embeddings={L} does not fit this checkpoint: its longrope is hf_posenc's {what}, "
        f"computed from {pretrained} tokens; pass original_max_position_embeddings={pretrained} to replace its "
        f"scaling from there (the plain RoPE frequencies), or omit it to extend from its current context "
        f"({checkpoint_context(lay)}).")


def shrink_refusal(cfg: PosEncConfig, now: int, own: str) -> str | None:
    """Why ``cfg`` (a RoPE scaling from its original context) may not replace a checkpoint's own scaling (rope_type
    ``own``) advertising ``now`` tokens: it would advertise fewer (the start of the sentence naming the least
    factor that would not); None where it does not shrink it."""
    scaling = SCALINGS[cfg.method]
    L = cfg.original_max_position_embeddings
    after = scaling.max_position(cfg.factor, L)
    if after >= now or scaling.keeps_max_position:
        return None
    return (f"{cfg.method} x{cfg.factor:g} from the original context {L} replaces the checkpoint's own scaling "
            f"(rope_type={own!r}) and would advertise {after:,} tokens, fewer than the {now:,} it advertises now: "
            f"give a factor of at least {now / L:g}")


def restates_checkpoint(cfg: PosEncConfig, lay: Layout) -> bool:
    """Whether ``cfg`` is a composed configuration of this checkpoint, restated (as ``hf_posenc.from_pretrained``
    re-applies one): per-dimension factors over its current context whose short ones give its own frequencies."""
    scaling = SCALINGS.get(cfg.method)
    short = cfg.params.get("short_factor")
    if scaling is None or not scaling.per_dimension or short is None or not _uniform(lay):
        return False
    if cfg.original_max_position_embeddings != checkpoint_context(lay):
        return False
    base, own = _base_and_own(lay, cfg.original_max_position_embeddings)
    return len(short) == own.shape[-1] and bool(torch.allclose(base / torch.tensor(short, dtype=torch.float64), own,
                                                               rtol=1e-5, atol=0))


def _uniform(lay: Layout) -> bool:
    """Whether every rotary slot a method changes has the same RoPE (one composition computes them all)."""
    first = lay.selected[0].rope_parameters(lay.config)
    return all(s.rope_parameters(lay.config) == first for s in lay.selected[1:])


def _type_list(lay: Layout) -> str:
    return ", ".join(f"{s.layer_type}: rope_type={s.rope_parameters(lay.config).get('rope_type', 'default')!r}"
                     for s in lay.selected)


def _scaled_types(lay: Layout) -> list[str]:
    return sorted(s.layer_type for s in lay.selected
                  if scaled_by(s.rope_parameters(lay.config)) is not None)


def check_rule(cfg: PosEncConfig, own_type: str, replace: str) -> None:
    """Refuses, by name, a method or an own scaling no composition rule covers (``replace``: how to replace the
    checkpoint's scaling instead)."""
    what = f"the checkpoint's RoPE is already scaled (rope_type={own_type!r})"
    if SCALINGS[cfg.method].compose is None:
        raise ValueError(f"{what}, and {cfg.method!r} follows the sequence length, which hf_posenc does not put on "
                         f"top of another scaling; use a static one (pi, ntk, yarn, llama3, longrope), which extends "
                         f"from the checkpoint's current context, or {replace}.")
    if own_type in LENGTH_DEPENDENT_TYPES and own_type not in ON_LENGTH_DEPENDENT:
        raise ValueError(f"{what}, whose frequencies change with every input's length: hf_posenc does not put "
                         f"{cfg.method!r} on top of it yet; {replace}.")


def _check_composable(cfg: PosEncConfig, lay: Layout, own_type: str, context) -> None:
    replace = (f"give original_max_position_embeddings={recorded_original(lay)} (the context its scaling is computed "
               "from) to replace its scaling instead")
    what = f"the checkpoint's RoPE is already scaled (rope_type={own_type!r})"
    check_rule(cfg, own_type, replace)
    if cfg.params.get("short_factor") is not None:  # (the composition's short factors give the checkpoint's RoPE)
        raise ValueError(f"{what}: {cfg.method!r} on top of it keeps the checkpoint's own frequencies for inputs up to "
                         f"its context of {context}, so its short factors are the checkpoint's and short_factor cannot "
                         f"be given; drop short_factor (long_factor then acts on the checkpoint's frequencies), or "
                         f"{replace}.")
    beta = lay.selected[0].rope_parameters(lay.config).get("llama_4_scaling_beta")
    if beta is not None:  # the composed longrope's original context is the current one: the temperature would move
        raise ValueError(f"{what}, and model_type={lay.config.model_type!r} scales its queries by position from it "
                         f"(llama_4_scaling_beta={beta}: 1 + beta ln(1 + floor(position / {recorded_original(lay)}))); "
                         f"a composition over its {context} tokens would compute that from {context} instead and "
                         f"change every input past {recorded_original(lay)}; {replace} (the temperature kept).")
    if lay.layered and not _uniform(lay):
        raise ValueError(f"{what} on a model with per-layer-type RoPE, and the layer types {cfg.method!r} would "
                         f"change ({_type_list(lay)}) differ: one composition acts on one RoPE; give layer_types="
                         f"{_scaled_types(lay)!r} (the scaled ones), or {replace}.")
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"{what}, and its config states no max_position_embeddings (the context it has now) to "
                         f"extend from; {replace}.")

