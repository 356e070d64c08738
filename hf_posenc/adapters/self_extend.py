"""Self-Extend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning",
arXiv:2401.01325): training-free extension of a RoPE decoder by two attentions merged per score.

For query position ``i`` and key position ``j``:

- neighbour attention (``i - j < W``): the ordinary RoPE score at positions ``i`` and ``j``;
- grouped attention (``i - j >= W``): the RoPE score at positions ``floor(i / G) + W - W / G`` and
  ``floor(j / G)``, so that the relative distance seen, ``~ (i - j) / G + W - W / G``, continues the
  neighbour window at ``W`` and grows ``G`` times slower after it;

one softmax over the merged scores. A model trained on ``L`` tokens then keeps every relative distance
below ``L`` up to ``(L - W) * G + W`` tokens.

Transformers hands the attention function queries and keys already rotated at ``i`` and ``j``. A RoPE
rotation by ``a`` followed by one by ``b`` is the rotation by ``a + b``, so the grouped queries and keys
are the given ones rotated further by ``g(i) - i`` and ``g(j) - j`` with the model's own frequencies.
Queries run in blocks (each reading the keys up to its last position; the neighbour scores are
computed only for the keys inside some query's window, the grouped ones only for the keys outside),
so memory stays ``heads x block x keys``. Positions come from the KV cache (query ``t`` of a call is at ``past + t``), so
cached decoding gives the scores of the full forward.
"""

from __future__ import annotations

import torch

from ..encodings.rope import apply_rotary
from .alibi_attention import CacheOffset, register_attention, repeat_heads

NAME = "hf_posenc_self_extend"
STATE_ATTR = "_hf_posenc_self_extend"


class SelfExtendState(CacheOffset):
    def __init__(self, inv_freq: torch.Tensor, group_size: int, window: int, block: int = 512):
        super().__init__()
        self.inv_freq = inv_freq.detach().float().clone()
        self.group_size, self.window, self.block = group_size, window, block

    def grouped(self, positions: torch.Tensor, query: bool) -> torch.Tensor:
        """Grouped positions: ``floor(p / G)`` for keys, plus ``W - W / G`` for queries."""
        g = positions // self.group_size
        return g + (self.window - self.window // self.group_size) if query else g


def self_extend_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """An attention function with transformers' signature: returns ``([batch, q, heads, dim], None)``."""
    state: SelfExtendState = module.__dict__[STATE_ATTR]
    b, h, q, d = query.shape
    key, value = repeat_heads(key, h // key.shape[1]), repeat_heads(value, h // value.shape[1])
    k_total = key.shape[2]
    past = state.past if state.past + q <= k_total else k_total - q
    device = query.device
    pos_q = torch.arange(past, past + q, device=device)
    pos_k = torch.arange(k_total, device=device)
    query_g = apply_rotary(query, state.grouped(pos_q, True) - pos_q, state.inv_freq)
    key_g = apply_rotary(key, state.grouped(pos_k, False) - pos_k, state.inv_freq)
    scale = scaling if scaling is not None else d ** -0.5
    outs = []
    for s in range(0, q, state.block):
        e = min(q, s + state.block)
        k_end = min(k_total, past + e)
        rel = pos_q[s:e, None] - pos_k[None, :k_end]
        # keys before lo are grouped for every query of the block, keys from hi on neighbours for every one:
        # each score matrix is computed only where some query of the block uses it
        lo = min(k_end, max(0, past + s - state.window + 1))
        hi = min(k_end, max(0, past + e - state.window))
        scores = query.new_empty(b, h, e - s, k_end)
        scores[..., :hi] = torch.matmul(query_g[:, :, s:e], key_g[:, :, :hi].transpose(-1, -2))
        near = torch.matmul(query[:, :, s:e], key[:, :, lo:k_end].transpose(-1, -2))
        scores[..., lo:] = torch.where(rel[:, lo:] < state.window, near, scores[..., lo:])
        scores = scores.float() * scale
        allowed = (rel >= 0)[None, None]
        if attention_mask is not None:
            am = attention_mask[:, :, s:e, :k_end]
            if am.dtype == torch.bool:
                allowed = allowed & am
            else:
                scores = scores + am.float()
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(value.dtype)  # (fully masked rows: padding)
        if dropout and module.training:
            probs = torch.nn.functional.dropout(probs, p=dropout)
        outs.append(torch.matmul(probs, value[:, :, :k_end]))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """``hf_posenc_self_extend`` in transformers' attention and mask registries."""
    return register_attention(NAME, self_extend_attention)
