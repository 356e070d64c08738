"""Swaps of the positional-encoding family (RoPE decoders: ALiBi, none, learned absolute; the
sinusoid is registered with the absolute-table methods)."""

from __future__ import annotations

from typing import Any

from .absolute import check_sinusoid
from .spec import MIN_ORIGINAL_CONTEXT, MethodSpec, check_layer_types, positive_number, register_method

MAX_LENGTH = 1 << 24  # 16M tokens: the longest context a swapped model may advertise (and size buffers for)


def _check_length(factor: float, p: dict[str, Any]) -> None:
    n = p.get("max_position_embeddings")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not MIN_ORIGINAL_CONTEXT <= n <= MAX_LENGTH):
        raise ValueError(f"max_position_embeddings must be an integer from {MIN_ORIGINAL_CONTEXT} to {MAX_LENGTH} (the "
                         f"context the swapped model advertises), or None (unchanged), got {n!r}.")
    if "base" in p:
        positive_number("base", p["base"])
    check_layer_types(p.get("layer_types"))


# ``max_position_embeddings``: the length the swapped model advertises, and sizes the buffers of models
# that keep length-sized ones (BERT's position_ids); None keeps the model's.
register_method(MethodSpec(
    "alibi", "swap", "ALiBi (Press et al. 2022): the model's positions removed, per-head linear distance biases "
    "added to attention scores.", uses_factor=False, params={"max_position_embeddings": None}, check=_check_length,
    own_attention=True))
register_method(MethodSpec(
    "nope", "swap", "No positional encoding: the model's positions removed (for decoders, causal attention alone "
    "orders the tokens); on per-layer-type RoPE, from layer_types only (default: the global layers, as "
    "interleaved RoPE/NoPE models do).", aliases=("no_pos", "none_pos"), uses_factor=False,
    params={"max_position_embeddings": None, "layer_types": None}, check=_check_length, positions_by_id=True))
register_method(MethodSpec(
    "rope", "swap", "RoPE (Su et al. 2021) on queries and keys of self-attention, in place of an encoder's learned "
    "table or relative buckets.", aliases=("rotary",), uses_factor=False,
    params={"base": 10000.0, "max_position_embeddings": None}, check=_check_length))
register_method(MethodSpec(
    "learned", "swap",
    "Learned absolute positions added to the input embeddings (table of factor x original length, initialised "
    "from the sinusoid), RoPE removed.",
    aliases=("learned_absolute",), params={"base": 10000.0, "scale": None}, check=check_sinusoid, default_factor=1.0))
