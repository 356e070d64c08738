"""``cache="consistent"``: length-dependent RoPE (dynamic NTK, dynamic YaRN, LongRoPE) that agrees with the KV cache.

Those methods change their frequencies while generating (one step past the original context grows the
length, so the frequencies); the keys already in the cache keep the rotation they were stored with
(transformers issue #25104), and cached generation drifts from a forward over the whole sequence. With
``cache="consistent"`` the rotary module's hook re-rotates every cached key to the new frequencies whenever
they change (:func:`hf_posenc.encodings.rope.rerotate_keys`), so each step equals recomputing the sequence.

To reach the cache, a :class:`CacheWatcher` on the module that owns the rotary module (the decoder body)
holds the KV cache (``cache``, formerly ``past_key_values``) of the call in progress. The cached keys of a
row are taken to be the tokens just before the call's first position, rotated with the frequencies of that
many tokens (how ``generate`` and a cached loop fill a cache, left padding included: padded slots are masked,
whatever their rotation); each row is re-rotated from its own old to its own new frequencies, so nothing is
kept between calls. Supported: transformers' DynamicCache and StaticCache, their sliding-window layers and
offloaded form; a cache with other layers (quantized) is refused by the layer's class name.

What re-rotation reaches: every cached key is rotated as a forward over the whole sequence would rotate it,
so the first layer's cache is exactly the recomputed one. The keys and values of deeper layers were computed
from hidden states of earlier steps, when the frequencies were those of a shorter length; for the small
per-step changes of dynamic NTK and dynamic YaRN this stays several times closer to recomputing than stale keys
(how close depends on the model: 2.5e-4 to 1.1e-2 on the tiny test models, 5.8e-2 on SmolLM2 at 8k). This is
not exact, so ``cache="exact"`` does what exactness takes: ``generate`` drops the cache at each step whose
frequencies change for any row and encodes the whole sequence again (:class:`RecomputeOnChange`), so every
step equals recomputing the sequence, at the cost of a forward over it per step past the original context.
LongRoPE switches once, from its short to its long factors, a change too large for re-rotation: with
``"consistent"`` or ``"exact"``, ``generate`` encodes the sequence again at the switch (one prefill, as
transformers' Phi-3 does). A cached loop written by hand (``model(ids, cache=...)``) cannot be re-encoded: there
the keys are re-rotated and, where ``generate`` would have re-encoded, a warning says so once per patched model.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from transformers import cache_utils

from ..encodings import rope as R
from .attention_probe import check_turns
from .cache_argument import cache_keyword, holds_no_keys, passed_cache
from .layout import layer_modules
from .rotary_layout import INTERLEAVED, KeyLayout, first_rotated, key_layout, rotates


class CacheWatcher:
    """Forward pre- and post-hook of the rotary module's owner: ``cache`` is the running call's KV cache."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.warned = False

    def warn_once(self, message: str) -> None:
        """``message`` as a ``UserWarning``, the first time only (one watcher per patched model)."""
        if not self.warned:
            self.warned = True
            warnings.warn(message, UserWarning, stacklevel=2)

    def before(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.cache = passed_cache(module, args, kwargs)

    def after(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        self.cache = None  # no reference to a cache outlives its call


def owner_of(model: nn.Module, rotary: nn.Module) -> nn.Module:
    """The module holding ``rotary`` as a direct child (the decoder body, whose forward takes the cache)."""
    for m in model.modules():
        if any(child is rotary for child in m.children()):
            return m
    raise ValueError(f"cache='consistent': no module of {type(model).__name__} holds its {type(rotary).__name__}")


def watch(model: nn.Module, rotary: nn.Module, record, watchers: list[tuple[nn.Module, CacheWatcher]]) -> CacheWatcher:
    """The watcher of ``rotary``'s owner (one per owner in ``watchers``, the patch call's own (owner, watcher)
    list), registered (reversibly, through ``record``) the first time."""
    owner = owner_of(model, rotary)
    for held, w in watchers:
        if held is owner:
            return w
    w = CacheWatcher()
    watchers.append((owner, w))
    record.add_hook(owner.register_forward_pre_hook(w.before, with_kwargs=True))
    record.add_hook(owner.register_forward_hook(w.after, with_kwargs=True))
    return w


def rotated_layers(model: nn.Module, text_config: Any, slot, inv_freq: torch.Tensor,
                   mode: str = "consistent") -> dict[int, KeyLayout] | None:
    """The decoder layers whose cached keys a rotary slot's change of frequencies turns, each with where its rotated
    dimensions sit: those of the slot's layer type (per-layer-type RoPE), else all, never a layer whose attention
    rotates nothing (a NoPE layer: its keys carry no rotation to redo). None: every layer, from dimension 0 in
    the rotate-half layout (a model whose attention modules cannot be listed, with one RoPE for every layer; with
    one per layer type, which layers are whose is unknown: refused)."""
    try:
        modules = layer_modules(model)  # None for a layer without attention (LFM3's convolutions)
    except ValueError as err:
        if slot.layer_type is not None:
            raise ValueError(f"cache={mode!r} re-rotates the cached keys of the {slot.layer_type} layers, and {err} "
                             "Patch with cache='stale' (cached keys kept as stored, transformers' own "
                             "behaviour).") from None
        return None
    types = getattr(text_config, "layer_types", None) or [None] * len(modules)
    layouts: dict[tuple, KeyLayout] = {}  # one check per attention class and rotated part
    out = {}
    for i, attn in enumerate(modules):
        if attn is None:
            continue
        if (slot.layer_type is None or types[i] == slot.layer_type) and rotates(attn, slot, text_config):
            key = (type(attn), first_rotated(attn))
            if key not in layouts:
                layouts[key] = _layout(attn, slot, text_config, inv_freq, mode)
            out[i] = layouts[key]
    return out


def _layout(attn: nn.Module, slot, text_config: Any, inv_freq: torch.Tensor, mode: str) -> KeyLayout:
    name = f"cache={mode!r} (cached keys re-rotated)"
    try:
        layout = key_layout(attn, slot, text_config, inv_freq, name)
        check_turns(attn, slot, text_config, inv_freq, layout.pairs, ("keys",), name)
        return layout
    except ValueError as err:
        raise ValueError(f"{err} Patch with cache='stale' (cached keys kept as stored, transformers' own "
                         "behaviour).") from None


# transformers' cache layers that hold their keys in order in ``.keys`` (a hybrid layer's beside its linear-attention
# state: Falcon-H1's), where the release has them
IN_PLACE = tuple(t for t in (getattr(cache_utils, name, None) for name in (
    "DynamicLayer", "DynamicSlidingWindowLayer", "StaticLayer", "StaticSlidingWindowLayer",
    "LinearAttentionAndFullAttentionLayer", "LinearAttentionAndSlidingWindowAttentionLayer",
    "LinearAttentionAndStaticFullAttentionLayer", "LinearAttentionAndStaticSlidingWindowAttentionLayer")) if t)


def _check_layer(cache: Any, layer: Any) -> None:
    if type(layer) not in IN_PLACE:
        raise ValueError(f"hf_posenc re-rotates the cached keys when the frequencies change, and this "
                         f"{type(cache).__name__} has a {type(layer).__name__} layer, whose keys cannot be re-rotated "
                         "in place. Use transformers' DynamicCache or StaticCache (offloaded and sliding-window forms "
                         "included), or patch with cache='stale'.")


def rerotate_cache(cache: Any, layers: dict[int, KeyLayout] | None, position_ids: torch.Tensor,
                   old: tuple[torch.Tensor, Any], new: tuple[torch.Tensor, Any]) -> None:
    """Re-rotate the cached keys of ``layers`` (each with its :class:`KeyLayout`; None: all, rotate-half from
    dimension 0) from ``old`` to ``new`` (inv_freq ``[rot / 2]`` or
    ``[b, rot / 2]``, attention_scaling a number or ``[b]``); the call's first positions ``position_ids[:, 0]``
    follow the cached keys of each row. A layer holds its ``m`` cached tokens in order in its first ``m`` slots
    (a static layer's later slots are empty; a sliding-window layer holds the last ``m`` tokens)."""
    cache_layers = getattr(cache, "layers", None)
    if cache_layers is None:
        raise ValueError("hf_posenc re-rotates the keys of a transformers Cache with .layers, got "
                         f"{type(cache).__name__}")
    turns: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # one (cos, sin) per cache length, batch and device
    for i, layout in (((i, KeyLayout()) for i in range(len(cache_layers))) if layers is None else layers.items()):
        layer = cache_layers[i]
        if holds_no_keys(layer) or not int(layer.get_seq_length()):
            continue  # (a Gemma 4 KV-shared layer holds no keys: it reads another layer's, re-rotated there)
        _check_layer(cache, layer)  # before reading .keys: a quantized layer keeps its keys elsewhere
        keys = getattr(layer, layout.cached_in)
        b, m, device = keys.shape[0], min(int(layer.get_seq_length()), keys.shape[-2]), keys.device
        if (m, b, device) not in turns:
            first = position_ids[:, :1].to(device)
            positions = (first - m + torch.arange(m, device=device)).clamp(min=0).expand(b, m)
            turns[m, b, device] = R.rerotation(positions, old, new, device)
        R.rerotate_keys(keys[:, :, :m], *turns[m, b, device], first=layout.first,
                        interleaved=layout.pairs == INTERLEAVED)


def row_lengths(input_ids: torch.Tensor, attention_mask: Any) -> list[int]:
    """Each row's ``max(position_ids) + 1`` in ``generate``'s next forward: its length without its padding."""
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        return attention_mask.sum(-1).tolist()
    return [input_ids.shape[1]] * input_ids.shape[0]


class RecomputeOnChange:
    """``prepare_inputs_for_generation`` of one model instance: a step at which the frequencies change gets no
    cache, so the whole sequence is encoded again with the new frequencies (``generate`` keeps the new cache).
    LongRoPE (``cache="consistent"``): once, at the switch from the short to the long factors. Dynamic NTK and
    dynamic YaRN (``cache="exact"``): at every step that grows the length past the longest seen, i.e. each step
    past the original context costs a forward over the whole sequence, and every step equals recomputing it."""

    record = None  # (class default: an instance pickled by a release without it)

    def __init__(self, model: nn.Module, hooks: list, record: Any = None):
        self.model, self.hooks, self.record = model, hooks, record  # record: the patch whose hooks these are

    def __call__(self, input_ids: torch.Tensor, **kwargs: Any) -> dict:
        name = cache_keyword(kwargs)  # generate passes it as ``cache`` (transformers >= 5.24) or ``past_key_values``
        cached = int(kwargs[name].get_seq_length()) if name is not None else 0
        if cached > 0:
            after = row_lengths(input_ids, kwargs.get("attention_mask"))
            before = [n - (input_ids.shape[1] - cached) for n in after]
            if any(h.changes(before, after) for h in self.hooks):
                kwargs[name] = None
                kwargs["next_sequence_length"] = None
        return type(self.model).prepare_inputs_for_generation(self.model, input_ids, **kwargs)
