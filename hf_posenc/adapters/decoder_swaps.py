"""Family swaps for RoPE decoders: ALiBi, no positions, absolute positions (sinusoid or learned).

Every swap first makes the rotary module of this instance the identity (``inv_freq`` = 0, so cos = 1
and sin = 0): the attention code of transformers stays as it is. Then:

- ``alibi``: the layers that rotated get ALiBi; a layer without RoPE (SmolLM3's ``no_rope_layers``, EXAONE 4's
  global layers: found by running each attention module, :func:`rotary_layout.rotates`) stays without
  positions: the model's own attention with its own mask. With SDPA (the default), this instance's config
  selects the attention function ``hf_posenc_alibi`` (``alibi_attention.py``): SDPA with the ALiBi bias as a
  strided view (no ``L x L`` tensor) in causal query blocks, or with padding one additive mask per call shared
  by all layers (query blocks with their own masks for very long inputs). With eager attention, a forward
  pre-hook on each decoder layer hands it the same shared mask ``[batch or 1, heads, q, k]`` (the
  causal/padding mask, ``finfo.min`` where masked, plus the biases) as its attention mask. Either way
  grouped-query attention, padding masks, the KV cache and ``generate`` work, because positions are
  those of the cache and masks are those transformers made. Attention kernels that take no additive
  mask (flash-attention, flex) are refused.
- ``nope``: nothing more.
- ``sinusoidal`` / ``learned``: a forward pre-hook on the model body adds the position table to the
  input embeddings at each token's position (``position_ids`` as given, else the cache positions). The
  sinusoid is computed on the fly for any position; the learned table (``hf_posenc_positions``, a
  submodule of the model body, saved with the weights) has ``max_position_embeddings`` rows,
  initialised from the scaled sinusoid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..config import PosEncConfig
from ..encodings import absolute as A
from ..encodings.alibi import alibi_slopes
from .alibi_attention import STATE_ATTR as ALIBI_STATE
from .alibi_attention import AlibiState, register
from .attention import SERVED, check_attention, keep_method, select
from .base import PatchRecord
from .cache_argument import passed_cache
from .held_checks import HeldChecks
from .layout import Layout, attention_modules, body, decoder_layers, rotary_slots
from .rope_native import softmax_rescalers
from .rotary_layout import rotates
from .rotary_probe import check_reads_frequencies

TABLE_NAME = "hf_posenc_positions"  # the learned table's attribute on the model body
_ROTATED = HeldChecks()  # the swap's check's flags of which layers rotate, for the apply that follows it


def neutralize_rope(slots, record: PatchRecord) -> None:
    """Each rotary slot (``layout.RotarySlot``: a module's frequencies, or one layer type's) rotates by
    nothing: ``inv_freq`` = 0, so cos = 1 and sin = 0."""
    for s in slots:
        m = s.module
        zero = torch.zeros_like(s.get("inv_freq"))
        record.set_attr(m, s.attr("inv_freq"), zero)
        if isinstance(m._buffers.get(s.attr("original_inv_freq")), torch.Tensor):
            record.set_attr(m, s.attr("original_inv_freq"), zero.clone())
        record.set_attr(m, s.attr("attention_scaling"), 1.0)
        s.set_default_type(record)


class AbsolutePositions:
    """Adds absolute position vectors to the input embeddings, in a pre-hook on the model body."""

    def __init__(self, model: nn.Module, cfg: PosEncConfig, table: nn.Embedding | None):
        self.embed = model.get_input_embeddings()
        self.cfg = cfg
        self.table = table
        self.dim = self.embed.weight.shape[1]
        self.scale = cfg.params["scale"]

    def positions(self, kwargs: dict, cache: Any, length: int, device) -> torch.Tensor:
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = kwargs.get("cache_position")
        if pos is None:
            past = cache.get_seq_length() if cache is not None else 0
            pos = torch.arange(past, past + length, device=device)
        return pos if pos.dim() == 2 else pos[None]

    def vectors(self, pos: torch.Tensor, dtype) -> torch.Tensor:
        if self.table is not None:
            limit = self.table.num_embeddings
            if int(pos.max()) >= limit:
                raise ValueError(f"position {int(pos.max())} is past the learned table ({limit} positions, "
                                 f"max_position_embeddings); patch with a larger factor.")
            return self.table(pos).to(dtype)
        return (A.sinusoid(pos, self.dim, self.cfg.params["base"]) * self.scale).to(dtype)

    def __call__(self, module, args, kwargs):
        cache = passed_cache(module, args, kwargs)
        ids = kwargs.pop("input_ids", None)
        if ids is None and args:
            ids, args = args[0], args[1:]
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            embeds = self.embed(ids)
        pos = self.positions(kwargs, cache, embeds.shape[1], embeds.device)
        kwargs["inputs_embeds"] = embeds + self.vectors(pos, embeds.dtype)
        kwargs["input_ids"] = None
        return args, kwargs


def _install_alibi(model: nn.Module, cfg: PosEncConfig, record: PatchRecord, rotated: list[bool]) -> None:
    state = AlibiState(alibi_slopes(model.config.num_attention_heads))
    record.add_hook(body(model).register_forward_pre_hook(state.body_hook, with_kwargs=True))
    if check_attention(model, "alibi") == "sdpa":
        select(model, record, state, attention_modules(model), register(), ALIBI_STATE)
        flat = AlibiState(state.slopes)
        flat.flat = True  # NoPE layers: the model's own SDPA attention
        for attn, r in zip(attention_modules(model), rotated):
            if not r:
                record.set_attr(attn, ALIBI_STATE, flat)
    else:  # eager: the same shared mask, handed to each layer as its attention mask (which sdpa takes too)
        for layer, r in zip(decoder_layers(model), rotated):
            if r:  # a NoPE layer keeps the model's own mask
                record.add_hook(layer.register_forward_pre_hook(state.eager_layer_hook, with_kwargs=True))
        state.method, state.serves = cfg.method, SERVED
        keep_method(model, record, follow=True)


def _check_alibi(model: nn.Module) -> None:
    check_attention(model, "alibi")
    bare = [i for i, layer in enumerate(decoder_layers(model)) if not isinstance(getattr(layer, "self_attn", None),
                                                                                 nn.Module)]
    if bare:
        kinds = sorted({t for i, t in enumerate(getattr(model.config, "layer_types", None) or []) if i in bare})
        raise ValueError(f"'alibi' swaps RoPE for ALiBi in each layer's self-attention; layers {bare} of "
                         f"model_type={model.config.model_type!r} have none (layer types {kinds or 'not declared'}: "
                         "linear attention or another mixer), which it does not serve. Use another method or "
                         "another model.")
    rotated = rotating_layers(model, rotary_slots(model))
    _ROTATED.hold(model, "rotated", rotated)  # what apply_swap installs on, probed once
    if not any(rotated):
        raise ValueError(f"'alibi' swaps RoPE for ALiBi on the layers that rotate; no layer of "
                         f"model_type={model.config.model_type!r} rotates (every one is NoPE), so there is no RoPE "
                         "to swap. Use another method or another model.")


def _install_absolute(model: nn.Module, cfg: PosEncConfig, record: PatchRecord, learned: bool) -> None:
    table = None
    length = int(math.ceil(cfg.factor * cfg.original_max_position_embeddings))
    if learned:
        w = model.get_input_embeddings().weight
        init = A.sinusoid_table(length, w.shape[1], cfg.params["base"]) * cfg.params["scale"]
        table = nn.Embedding(length, w.shape[1], device=w.device, dtype=w.dtype)
        with torch.no_grad():
            table.weight.copy_(init)
        record.set_attr(body(model), TABLE_NAME, table)
    hook = AbsolutePositions(model, cfg, table)
    record.add_hook(body(model).register_forward_pre_hook(hook, with_kwargs=True))
    if length != model.config.max_position_embeddings:
        record.set_config("max_position_embeddings", length)


def _matching_scale(model: nn.Module, params: dict[str, Any]) -> dict[str, Any]:
    if params.get("scale") is None:
        params["scale"] = A.matching_scale(model.get_input_embeddings().weight)  # the token embeddings' RMS
    return params


@dataclass(frozen=True)
class Swap:
    """One family swap on RoPE decoders: what it installs once the rotary embedding is the identity.
    ``advertises_length``: its ``max_position_embeddings`` knob is the length the model then advertises
    (at least the original); ``per_layer_type``: on per-layer-type RoPE it changes the chosen types only;
    ``keeps_nope_layers``: it installs per layer and leaves the layers without RoPE as they are (``install``
    gets, per attention module, whether it rotated)."""

    install: Callable[[nn.Module, PosEncConfig, PatchRecord, list[bool]], None]
    check: Callable[[nn.Module], None] = lambda model: None
    defaults: Callable[[nn.Module, dict[str, Any]], dict[str, Any]] = lambda model, params: params
    advertises_length: bool = False
    per_layer_type: bool = False
    keeps_nope_layers: bool = False


SWAPS: dict[str, Swap] = {
    "alibi": Swap(_install_alibi, check=_check_alibi, advertises_length=True, keeps_nope_layers=True),
    "nope": Swap(lambda model, cfg, record, rotated: None, advertises_length=True, per_layer_type=True),
    "sinusoidal": Swap(lambda m, c, r, _: _install_absolute(m, c, r, learned=False), defaults=_matching_scale),
    "learned": Swap(lambda m, c, r, _: _install_absolute(m, c, r, learned=True), defaults=_matching_scale),
}


def resolve_swap(model: nn.Module, cfg: PosEncConfig, original: int) -> PosEncConfig:
    swap = SWAPS[cfg.method]
    check_reads_frequencies(rotary_slots(model), model.config, cfg.method)
    swap.check(model)
    params = swap.defaults(model, dict(cfg.params))
    n = params.get("max_position_embeddings")
    if n is not None and swap.advertises_length and n < original:
        raise ValueError(f"max_position_embeddings={n} is shorter than the model's context ({original}).")
    factor = cfg.factor if cfg.spec.uses_factor else None
    return PosEncConfig(cfg.method, factor, original, params)


def apply_swap(model: nn.Module, cfg: PosEncConfig, rotary: list, record: PatchRecord) -> None:
    swap = SWAPS[cfg.method]
    rotated = _ROTATED.take(model, "rotated", lambda: rotating_layers(model, rotary)) if swap.keeps_nope_layers else []
    neutralize_rope(rotary, record)
    n = cfg.params.get("max_position_embeddings")
    if n is not None and swap.advertises_length:
        record.set_config("max_position_embeddings", n)
    swap.install(model, cfg, record, rotated)


def rotating_layers(model: nn.Module, rotary: list) -> list[bool]:
    """Per attention module, whether it turns its queries and keys by the model's RoPE (False: a NoPE layer)."""
    return [rotates(attn, rotary[0], model.config) for attn in attention_modules(model)]


class Swapped:
    """A swap to another family (``decoder_swaps``): the rotary embedding becomes the identity."""

    def per_type(self, spec) -> bool:
        return SWAPS[spec.name].per_layer_type

    def on_layered(self, spec) -> bool:
        return SWAPS[spec.name].per_layer_type

    def resolve(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, L: int) -> PosEncConfig:
        model_type = lay.config.model_type
        if lay.layered and not self.on_layered(cfg.spec):
            raise ValueError(f"{cfg.method!r} (a family swap) on per-layer-type RoPE (model_type={model_type!r}) is "
                             "not supported yet; RoPE scalings and nope are.")
        if softmax_rescalers(model):
            raise ValueError(f"{cfg.method!r} (a family swap) on model_type={model_type!r}, whose attention scale "
                             "depends on its RoPE parameters, is not supported yet; RoPE scalings are.")
        if lay.prefix:
            raise ValueError(f"{cfg.method!r} (a family swap) on a composite model ({model.config.model_type!r} with "
                             f"its language model in {lay.prefix[:-1]}) is not supported yet; RoPE scalings are.")
        resolved = resolve_swap(model, cfg, L)
        if lay.layered:  # nope: the chosen types, recorded explicitly
            resolved.params["layer_types"] = lay.chosen_types()
        return resolved

    def apply(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, record: PatchRecord) -> bool:
        apply_swap(model, cfg, lay.selected, record)
        return False
