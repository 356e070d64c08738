"""Moving an encoder's position information into attention: ALiBi, RoPE, or nothing.

BERT family (learned table): the table becomes zeros (frozen; resized with its buffers when
``max_position_embeddings`` is given), then
- ``alibi``: this instance's config selects the ``hf_posenc_alibi`` attention function with
  bidirectional biases ``-slope_h * |i - j|`` (SDPA with an additive mask);
- ``rope``: forward hooks on the ``query`` and ``key`` projections of every self-attention rotate each
  head's vectors by their position (RoPE, Su et al. 2021, the half-split layout of LLaMA);
- ``nope``: nothing more.

T5 family (relative buckets; cross-attention has no position term in T5 and gets none here):
- ``alibi``: each module that computes T5's bias gets its own ``compute_bias`` returning ALiBi biases
  (bidirectional in the encoder; in the decoder ``-slope * (i - j)``, future keys being masked anyway);
  the other layers reuse it as T5 does;
- ``rope``: ``compute_bias`` returns zeros, and the query/key projections of the encoder and decoder
  self-attention rotate by position (in the decoder, the position after the cached tokens).
All of these are starting points for training: the pretrained weights expect their own positions.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import PosEncConfig
from ..encodings import rope as R
from ..encodings.alibi import alibi_bias, alibi_slopes
from .alibi_attention import STATE_ATTR, AlibiState, register
from .attention import check_attention, select
from .base import PatchRecord
from .cache_argument import passed_cache


def rotate(x: torch.Tensor, positions: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """RoPE on ``x`` [batch, T, heads * head_dim] at ``positions`` [T] (float32 math, cast back)."""
    b, t, _ = x.shape
    heads = x.view(b, t, -1, head_dim).transpose(1, 2)  # [batch, heads, T, head_dim]
    out = R.apply_rotary(heads, positions, R.default_inv_freq(base, head_dim, x.device))
    return out.transpose(1, 2).reshape(b, t, -1)


class RotaryProjection:
    """A forward hook on a query/key projection: its output rotated at the current positions."""

    def __init__(self, head_dim: int, base: float, offset=None):
        self.head_dim, self.base = head_dim, base
        self.offset = offset  # a callable giving the number of tokens before this call (decoder cache)

    def __call__(self, module, inputs, output):
        start = self.offset() if self.offset is not None else 0
        pos = torch.arange(start, start + output.shape[1], device=output.device)
        return rotate(output, pos, self.head_dim, self.base)


# -- BERT family ------------------------------------------------------------------------------------
def bert_attention_modules(model: nn.Module) -> list[nn.Module]:
    out = []
    for m in model.modules():
        if isinstance(getattr(m, "query", None), nn.Linear) and isinstance(getattr(m, "key", None), nn.Linear):
            out.append(m)
        elif isinstance(getattr(m, "q_lin", None), nn.Linear) and isinstance(getattr(m, "k_lin", None), nn.Linear):
            out.append(m)
    return out


def _projections(m: nn.Module) -> tuple[nn.Linear, nn.Linear]:
    return (m.query, m.key) if hasattr(m, "query") else (m.q_lin, m.k_lin)


def _heads(model: nn.Module) -> tuple[int, int]:
    cfg = model.config
    heads = getattr(cfg, "num_attention_heads", None) or cfg.n_heads
    hidden = getattr(cfg, "hidden_size", None) or cfg.dim
    return heads, hidden // heads


def _bert_alibi(model: nn.Module, mods: list[nn.Module], heads: int, head_dim: int, cfg: PosEncConfig,
                record: PatchRecord) -> None:
    check_attention(model, "alibi")  # eager BERT runs through the SDPA-based function too
    select(model, record, AlibiState(alibi_slopes(heads), causal=False), mods, register(), STATE_ATTR)  # both ways


def _bert_rope(model: nn.Module, mods: list[nn.Module], heads: int, head_dim: int, cfg: PosEncConfig,
               record: PatchRecord) -> None:
    if head_dim % 2:
        raise ValueError(f"rope needs an even head dim, got {head_dim}.")
    for m in mods:
        for proj in _projections(m):
            record.add_hook(proj.register_forward_hook(RotaryProjection(head_dim, cfg.params["base"])))


# what each swap adds to BERT's self-attention once its position table is zero (nope: nothing)
BERT_SWAPS = {"alibi": _bert_alibi, "rope": _bert_rope, "nope": lambda *args: None}


def apply_bert_swap(model: nn.Module, cfg: PosEncConfig, record: PatchRecord) -> None:
    mods = bert_attention_modules(model)
    if not mods:
        raise ValueError(f"no self-attention with query/key projections found in {type(model).__name__}.")
    heads, head_dim = _heads(model)
    BERT_SWAPS[cfg.method](model, mods, heads, head_dim, cfg, record)


# -- T5 family ---------------------------------------------------------------------------------------
class AlibiBias:
    """A per-module ``compute_bias`` returning ALiBi biases ``[1, heads, q, k]``."""

    def __init__(self, module: nn.Module, slopes: torch.Tensor):
        self.module, self.slopes = module, slopes

    def __call__(self, query_length, key_length, device=None, past_seen_tokens=0):
        device = device if device is not None else self.module.relative_attention_bias.weight.device
        q = torch.arange(query_length, device=device) + past_seen_tokens
        k = torch.arange(key_length, device=device)
        return alibi_bias(self.slopes.to(device), q, k).to(self.module.relative_attention_bias.weight.dtype)


class ZeroBias:
    def __init__(self, module: nn.Module):
        self.module = module

    def __call__(self, query_length, key_length, device=None, past_seen_tokens=0):
        w = self.module.relative_attention_bias.weight
        return torch.zeros(1, self.module.n_heads, query_length, key_length, device=device or w.device, dtype=w.dtype)


class CachedLength:
    """The number of tokens cached for one self-attention module, read before its forward."""

    def __init__(self, module: nn.Module):
        self.module, self.value = module, 0

    def hook(self, module, args, kwargs) -> None:
        cache = passed_cache(module, args, kwargs)
        self.value = int(cache.get_seq_length(module.layer_idx)) if cache is not None else 0

    def __call__(self) -> int:
        return self.value


def t5_self_attention_modules(model: nn.Module) -> list[nn.Module]:
    """T5Attention modules used as self-attention (not a decoder's cross-attention)."""
    cross = [m.EncDecAttention for m in model.modules() if hasattr(m, "EncDecAttention")]
    return [m for m in model.modules()
            if hasattr(m, "relative_attention_num_buckets") and not any(m is c for c in cross)]


def _t5_rope(model: nn.Module, cfg: PosEncConfig, record: PatchRecord) -> None:
    head_dim = model.config.d_kv
    for m in t5_self_attention_modules(model):
        length = CachedLength(m) if m.is_decoder else None
        if length is not None:
            record.add_hook(m.register_forward_pre_hook(length.hook, with_kwargs=True))
        for proj in (m.q, m.k):
            record.add_hook(proj.register_forward_hook(RotaryProjection(head_dim, cfg.params["base"], length)))


def _alibi_biases(model: nn.Module):
    slopes = alibi_slopes(model.config.num_heads)  # one set, shared by every bias-holding module
    return lambda m: AlibiBias(m, slopes)


# per swap: (model -> the bias each of T5's bias-holding modules computes instead of its buckets), what else it adds
T5_SWAPS = {
    "alibi": (_alibi_biases, None),
    "rope": (lambda model: ZeroBias, _t5_rope),
    "nope": (lambda model: ZeroBias, None),
}


def apply_t5_swap(model: nn.Module, cfg: PosEncConfig, record: PatchRecord) -> None:
    biases, extra = T5_SWAPS[cfg.method]
    bias_of = biases(model)
    for m in [m for m in model.modules() if getattr(m, "has_relative_attention_bias", False)]:
        record.set_attr(m, "compute_bias", bias_of(m))
    if extra is not None:
        extra(model, cfg, record)
