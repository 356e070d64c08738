"""How each attention module applies RoPE, read from the module itself rather than from its family's name:

- whether it rotates at all (:func:`rotates`): a NoPE layer -- SmolLM3's and Llama 4's ``no_rope_layers``, EXAONE 4's
  and Cohere 2's full-attention layers beside sliding ones ("global NoPE") -- gives the same output whatever positions
  its position embeddings carry;
- where its rotated dimensions sit and how they pair (:func:`key_layout`): from dimension 0, or after MLA's
  ``qk_nope_head_dim`` position-free part; pairs ``(i, i + rot / 2)`` (rotate-half, Llama's) or ``(2i, 2i + 1)``
  (interleaved, Cohere's and GLM's), found by rotating a vector with the modeling file's own
  ``apply_rotary_pos_emb`` and comparing it with each layout's rotation.

Both are checks on a few random vectors at patch time (one attention forward over 4 tokens per layer for
:func:`rotates`), not a list of families."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..encodings import rope as R
from .cache_argument import forward_names
from .layout import RotarySlot, attention_modules, head_dim, rotary_slots
from .narrow_twin import narrow_twin

HALF, INTERLEAVED = "half", "interleaved"
CALL_ERRORS = (TypeError, ValueError, RuntimeError, KeyError, AttributeError)  # a forward that cannot be called so


@dataclass(frozen=True)
class KeyLayout:
    """Where a layer's rotated key dimensions sit in its KV cache: ``rot`` of them from ``first`` of the cached
    ``cached_in`` tensor (``"keys"``; ``"values"`` where MLA caches its latent: the compressed KV as keys and the
    rotated key part as values), paired as ``pairs``."""

    first: int = 0
    pairs: str = HALF
    cached_in: str = "keys"


def first_rotated(attn: nn.Module) -> int:
    """The first head dimension RoPE rotates: after MLA's ``qk_nope_head_dim`` position-free part, else 0."""
    return int(attn.qk_nope_head_dim) if hasattr(attn, "qk_rope_head_dim") else 0


def rotary_output(slot: RotarySlot, x: torch.Tensor, positions: torch.Tensor):
    """The (cos, sin) the slot's rotary module gives for ``positions`` (its layer type passed where it has one)."""
    return slot.module(x, positions, *(() if slot.layer_type is None else (slot.layer_type,)))


@torch.no_grad()
def rotates(attn: nn.Module, slot: RotarySlot, config: Any) -> bool:
    """Whether ``attn`` turns its queries and keys by the position embeddings of ``slot``: its (eager) attention
    weights and output on 4 random hidden states at positions 0, 1, 2, 3 and at 0, 3, 7, 12 differ (a NoPE layer
    gives the same bit for bit; the weights see the rotation even where the output projection is zero), run in eval
    mode (a model patched while training keeps its mode and its random state). A module whose weights are not
    loaded (meta, offloaded) is answered by a narrow twin built from the config (:func:`twin_rotates`), one whose
    forward cannot be called so, with a mask and position ids either (:func:`call_attention`), by its ``use_rope``
    attribute (True where it has none)."""
    declared = bool(getattr(attn, "use_rope", True))
    weight = next(attn.parameters(), None)
    if not declared or weight is None:
        return declared
    if weight.device.type == "meta":
        found = twin_rotates(config, getattr(attn, "layer_idx", None))
        return declared if found is None else found
    outs = []
    try:
        for pos in ([0, 1, 2, 3], [0, 3, 7, 12]):  # (eager: the method's own function may need a whole forward's state)
            out = call_attention(attn, slot, config, torch.tensor([pos]), "eager")
            outs.append([t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)])
    except CALL_ERRORS:
        return declared
    return any(not torch.equal(a, b) for a, b in zip(*outs))


def call_attention(attn: nn.Module, slot: RotarySlot, config: Any, positions: torch.Tensor, impl: str):
    """``attn``'s forward on 4 random hidden states (seeded: the caller's random state kept) at ``positions``, with
    the attention implementation ``impl`` set on the config it reads alone (not its sub-configs) and in eval mode (no
    dropout); both put back. Called with no mask first; where that raises, again with a causal mask and the positions
    as ids (Ministral 3's query temperature reads them, DeepSeek-V3.2's indexer the mask); the second error raised."""
    weight = next(attn.parameters())
    own = getattr(attn, "config", None) or config
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, int(own.hidden_size), generator=g).to(device=weight.device, dtype=weight.dtype)
    positions = positions.to(weight.device)
    saved, training = own._attn_implementation_internal, attn.training
    try:
        own._attn_implementation_internal = impl
        attn.eval()
        embeddings = rotary_output(slot, x, positions)
        try:
            return attn(hidden_states=x, position_embeddings=embeddings, attention_mask=None)
        except CALL_ERRORS:
            mask = causal_mask(4, x.dtype, x.device)
            return attn(hidden_states=x, position_embeddings=embeddings, attention_mask=mask,
                        **_position_kwargs(attn, positions))
    finally:
        own._attn_implementation_internal = saved
        attn.train(training)


def causal_mask(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive causal mask of ``n`` tokens, ``(1, 1, n, n)``, as transformers hands eager attention."""
    future = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(1, 1, n, n, dtype=dtype, device=device).masked_fill(future, torch.finfo(dtype).min)


def _position_kwargs(attn: nn.Module, positions: torch.Tensor) -> dict[str, torch.Tensor]:
    """``position_ids`` and ``cache_position`` for an attention forward that names them."""
    named = forward_names(attn)
    given = {"position_ids": positions, "cache_position": positions[0]}
    return {k: v for k, v in given.items() if k in named}


def twin_rotates(config: Any, layer: int | None) -> bool | None:
    """Whether layer ``layer`` of a model of ``config`` rotates, answered on its narrow twin (random weights, the
    config's layer pattern: :mod:`narrow_twin`); None where no twin can be built or the layer not found in it."""
    if layer is None:
        return None
    flags = twin_flags(config)
    return flags[layer] if flags is not None and 0 <= layer < len(flags) else None


_TWIN_FLAGS: dict[str, list[bool] | None] = {}  # per config (its JSON): a patch asks once per layer


def twin_flags(config: Any) -> list[bool] | None:
    """Per layer of a model of ``config``, whether it rotates, run on its narrow twin (:mod:`narrow_twin`; each layer
    with the RoPE of its own layer type); None where no twin can be built or no rotary module is found in it."""
    key = config.to_json_string(use_diff=False)
    if key not in _TWIN_FLAGS:
        if len(_TWIN_FLAGS) >= 8:
            _TWIN_FLAGS.clear()
        _TWIN_FLAGS[key] = _probe_twin(config)
    return _TWIN_FLAGS[key]


def _probe_twin(config: Any) -> list[bool] | None:
    twin = narrow_twin(config)
    if twin is None:
        return None
    try:
        modules, slots = attention_modules(twin), rotary_slots(twin)
    except ValueError:
        return None
    if not slots:  # (BioGPT: no rotary module)
        return None
    types = list(getattr(twin.config, "layer_types", None) or [])
    out = []
    for i, attn in enumerate(modules):
        own = [s for s in slots if s.layer_type in (None, types[i] if i < len(types) else None)]
        out.append(bool(own) and rotates(attn, own[0], twin.config))
    return out


def key_layout(attn: nn.Module, slot: RotarySlot, config: Any, inv_freq: torch.Tensor, name: str) -> KeyLayout:
    """The layout of ``attn``'s rotated dimensions (see the module docstring); a ValueError naming the module where
    its RoPE at position 3 turned further by 5 is its RoPE at 8 in neither layout, or the rotated part does not fit
    the head."""
    rot, first = 2 * inv_freq.shape[-1], first_rotated(attn)
    width = getattr(attn, "qk_head_dim", None) or getattr(attn, "head_dim", None) or head_dim(config)
    if first + rot > width:
        raise ValueError(f"{name}: {type(attn).__name__} rotates {rot} dimensions from {first} of a {width}-dimension "
                         "head; this layout is not supported.")
    what = "apply_rotary_pos_emb_interleave" if getattr(config, "rope_interleave", False) else "apply_rotary_pos_emb"
    apply = getattr(sys.modules.get(type(attn).__module__), what, None)
    if apply is None:
        raise ValueError(f"{name}: the modeling file of {type(attn).__name__} has no {what} to check its rotary layout "
                         "by; this model is not supported.")
    x = torch.randn(1, 1, 1, rot, generator=torch.Generator().manual_seed(0)).expand(1, 1, 2, rot).to(inv_freq.device)
    with torch.no_grad():
        cos, sin = rotary_output(slot, x, torch.tensor([[3, 8]], device=inv_freq.device))
        rotated = _applied(apply, x, cos, sin, f"{name}: the {what} of {type(attn).__name__}'s modeling file")
        at3, at8 = rotated[:, :, :1].float(), rotated[:, :, 1:].float()
        delta = torch.tensor([5], device=x.device)
        for pairs in (HALF, INTERLEAVED):
            if torch.allclose(turn(at3, delta, inv_freq.float(), pairs), at8, atol=1e-4, rtol=1e-4):
                latent = callable(getattr(attn, "expand_kv", None))  # MLA caching its latent (DeepSeek-V3)
                return KeyLayout(0 if latent else first, pairs, "values" if latent else "keys")
    raise ValueError(f"{name} turns queries and keys further with the model's own frequencies; "
                     f"{type(attn).__name__}'s RoPE ({what}) composes that way in neither the rotate-half nor the "
                     "interleaved layout: this model is not supported.")


def _applied(apply, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, what: str) -> torch.Tensor:
    """``x`` rotated by a modeling file's ``apply``: ``(queries, keys, cos, sin) -> (q, k)``, or one tensor at a time
    ``(x, cos, sin) -> x`` (Gemma 4); a ValueError naming ``what`` where it takes neither."""
    try:
        return apply(x, x, cos, sin)[0]
    except (TypeError, ValueError, RuntimeError) as err:
        try:
            out = apply(x, cos, sin)
        except (TypeError, ValueError, RuntimeError):
            out = None
        if isinstance(out, torch.Tensor) and out.shape == x.shape:
            return out
        raise ValueError(f"{what} takes neither (queries, keys, cos, sin) nor (x, cos, sin) ({type(err).__name__}: "
                         f"{err}); this model is not supported.") from err


def turn(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor, pairs: str) -> torch.Tensor:
    """``x`` (its last dimension the rotated part) turned further by ``delta`` positions, its pairs as ``pairs``."""
    if pairs == HALF:
        return R.apply_rotary(x, delta, inv_freq)
    half = as_half(x)
    return from_half(R.apply_rotary(half, delta, inv_freq))


def as_half(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs ``(2i, 2i + 1)`` reordered as rotate-half pairs ``(i, i + rot / 2)``."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def from_half(x: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`as_half`."""
    half = x.shape[-1] // 2
    return torch.stack((x[..., :half], x[..., half:]), dim=-1).flatten(-2)
