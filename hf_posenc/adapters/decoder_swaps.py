"""Family swaps for RoPE decoders: ALiBi, no positions, absolute positions (sinusoid or learned).

Every swap first makes the rotary module of this instance the identity (``inv_freq`` = 0, so cos = 1
and sin = 0): the attention code of transformers stays as it is. Then:

- ``alibi``: with SDPA (the default), this instance's config selects the attention function
  ``hf_posenc_alibi`` (``alibi_attention.py``): SDPA with the ALiBi bias as a strided view (no
  ``L x L`` tensor) in causal query blocks, or with padding one additive mask per call shared by all
  layers (query blocks with their own masks for very long inputs). With eager attention, a forward
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

import torch
from torch import nn

from ..config import PosEncConfig
from ..encodings import absolute as A
from ..encodings.alibi import alibi_slopes
from .alibi_attention import STATE_ATTR as ALIBI_STATE, AlibiState, register
from .attention import check_attention, select
from .base import PatchRecord
from .layout import attention_modules, body, decoder_layers

TABLE_NAME = "hf_posenc_positions"  # the learned table's attribute on the model body
SWAPS = ("alibi", "nope", "sinusoidal", "learned")


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

    def positions(self, kwargs: dict, length: int, device) -> torch.Tensor:
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = kwargs.get("cache_position")
        if pos is None:
            cache = kwargs.get("past_key_values")
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
        ids = kwargs.pop("input_ids", None)
        if ids is None and args:
            ids, args = args[0], args[1:]
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            embeds = self.embed(ids)
        pos = self.positions(kwargs, embeds.shape[1], embeds.device)
        kwargs["inputs_embeds"] = embeds + self.vectors(pos, embeds.dtype)
        kwargs["input_ids"] = None
        return args, kwargs


def resolve_swap(model: nn.Module, cfg: PosEncConfig, original: int) -> PosEncConfig:
    params = dict(cfg.params)
    if cfg.method == "alibi":
        check_attention(model, "alibi")
        decoder_layers(model)
    n = params.get("max_position_embeddings")
    if n is not None and cfg.method in ("alibi", "nope") and n < original:
        raise ValueError(f"max_position_embeddings={n} is shorter than the model's context ({original}).")
    if cfg.method in ("sinusoidal", "learned") and params.get("scale") is None:
        params["scale"] = A.matching_scale(model.get_input_embeddings().weight)  # the token embeddings' RMS
    factor = cfg.factor if cfg.spec.uses_factor else None
    return PosEncConfig(cfg.method, factor, original, params)


def apply_swap(model: nn.Module, cfg: PosEncConfig, rotary: list, record: PatchRecord) -> None:
    neutralize_rope(rotary, record)
    n = cfg.params.get("max_position_embeddings")
    if n is not None and cfg.method in ("alibi", "nope"):
        record.set_config("max_position_embeddings", n)
    if cfg.method == "alibi":
        slopes = alibi_slopes(model.config.num_attention_heads)
        state = AlibiState(slopes)
        record.add_hook(body(model).register_forward_pre_hook(state.body_hook, with_kwargs=True))
        if check_attention(model, "alibi") == "sdpa":
            select(model, record, state, attention_modules(model), register(), ALIBI_STATE)
        else:  # eager: the same shared mask, handed to each layer as its attention mask
            for layer in decoder_layers(model):
                record.add_hook(layer.register_forward_pre_hook(state.eager_layer_hook, with_kwargs=True))
    elif cfg.method in ("sinusoidal", "learned"):
        table = None
        length = int(math.ceil(cfg.factor * cfg.original_max_position_embeddings))
        if cfg.method == "learned":
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
