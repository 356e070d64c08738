"""Whether the queries and keys an attention module hands its attention function are still its RoPE's rotation: the
attention-level methods turn them further to remapped positions, and the re-rotated cache turns cached keys, both
where transformers hands them over. That is RoPE at the other position only where nothing after
``apply_rotary_pos_emb`` breaks the composition: a per-channel weight applied after it does (HunYuan's query and key
RMSNorm, Dory's query scale ``sqk``); a scalar per position or head does not (Llama 4's and Ministral 3's query
temperature). Found by running the module, not read from its source: its queries and keys at positions 0-3 and 5-8
must be those at 0-3 turned by 5."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .attention import register_attention
from .layout import RotarySlot, attention_modules, rotary_slots
from .narrow_twin import narrow_twin, spread_constant_weights
from .rotary_layout import CALL_ERRORS, call_attention, first_rotated, turn

PROBE = "hf_posenc_probe"
SHIFT = 5


class _Captured(Exception):
    """Raised by the probe's attention function once it holds the queries and keys: nothing past it runs."""

    def __init__(self, query: torch.Tensor, key: torch.Tensor):
        super().__init__()
        self.query, self.key = query, key


def _capture(module, query, key, value, attention_mask, **kwargs):
    raise _Captured(query.detach(), key.detach())


@torch.no_grad()
def turns_at_attention(attn: nn.Module, slot: RotarySlot, config: Any, inv_freq: torch.Tensor, pairs: str,
                       parts: tuple[str, ...]) -> str | None:
    """The first of ``parts`` ("queries", "keys") whose values at the attention function are not the rotation a
    further turn in the ``pairs`` layout assumes, or None where every one is (or where the module cannot be run
    so: no answer, as in :func:`rotary_layout.rotates`). A module whose weights are not loaded (meta) is answered by
    the same layer of a narrow twin built from the config, its constant weights given a spread."""
    weight = next(attn.parameters(), None)
    if weight is None:
        return None
    if weight.device.type == "meta":
        return _on_twin(attn, slot, config, pairs, parts)
    got = [_at(attn, config, slot, start) for start in (0, SHIFT)]
    if got[0] is None or got[1] is None:
        return None
    rot, first = 2 * inv_freq.shape[-1], first_rotated(attn)
    delta = torch.full((4,), SHIFT, device=weight.device)
    for part, base, moved in zip(("queries", "keys"), got[0], got[1]):
        if part not in parts:
            continue
        exact = base.dtype == torch.float32 and weight.dtype == torch.float32  # (bf16 weights, fp32 q/k: not exact)
        tol = 1e-4 if exact else 3e-2
        base, moved = base.float(), moved.float()
        want = base.clone()
        want[..., first:first + rot] = turn(base[..., first:first + rot], delta, inv_freq.float(), pairs)
        if not torch.allclose(moved, want, atol=tol * max(1.0, want.abs().max().item()), rtol=tol):
            return part
    return None


def _on_twin(attn: nn.Module, slot: RotarySlot, config: Any, pairs: str, parts: tuple[str, ...]) -> str | None:
    """:func:`turns_at_attention` on layer ``attn.layer_idx`` of a narrow twin (its own frequencies: the question is
    what the module does after RoPE, not at which frequencies); None where there is no twin or no such layer."""
    layer, twin = getattr(attn, "layer_idx", None), narrow_twin(config)
    if layer is None or twin is None:
        return None
    try:
        modules, slots = attention_modules(twin), rotary_slots(twin)
    except ValueError:
        return None
    same = [s for s in slots if s.layer_type == slot.layer_type]
    if not 0 <= layer < len(modules) or not same or type(modules[layer]) is not type(attn):
        return None
    spread_constant_weights(twin)
    try:
        return turns_at_attention(modules[layer], same[0], twin.config, same[0].get("inv_freq"), pairs, parts)
    except CALL_ERRORS:  # (a twin whose rotary module keeps its frequencies elsewhere: no answer)
        return None


def _at(attn: nn.Module, config: Any, slot: RotarySlot, start: int):
    """(queries, keys) as ``attn`` hands them to its attention function for 4 random hidden states at positions
    ``start`` .. ``start + 3``; None where it cannot be called so."""
    try:
        call_attention(attn, slot, config, torch.arange(start, start + 4)[None], register_attention(PROBE, _capture))
    except _Captured as done:
        return done.query, done.key
    except CALL_ERRORS:
        return None
    return None


def check_turns(attn: nn.Module, slot: RotarySlot, config: Any, inv_freq: torch.Tensor, pairs: str,
                parts: tuple[str, ...], name: str) -> None:
    """Refuses, by name, turning ``parts`` of ``attn`` further where they are not its RoPE's rotation there."""
    broken = turns_at_attention(attn, slot, config, inv_freq, pairs, parts)
    if broken:
        raise ValueError(f"{name} turns the {broken} of {type(attn).__name__} further, where its attention function "
                         f"receives them; model_type={config.model_type!r} changes its {broken} after RoPE per "
                         "channel (a normalisation or scale after apply_rotary_pos_emb), so a further turn is not its "
                         "RoPE at the other position: this model is not supported.")
