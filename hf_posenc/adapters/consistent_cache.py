"""``cache="consistent"``: length-dependent RoPE (dynamic NTK, dynamic YaRN, LongRoPE) that agrees with the KV cache.

Those methods change their frequencies while generating (one step past the original context grows the
length, so the frequencies); the keys already in the cache keep the rotation they were stored with
(transformers issue #25104), and cached generation drifts from a forward over the whole sequence. With
``cache="consistent"`` the rotary module's hook re-rotates every cached key to the new frequencies whenever
they change (:func:`hf_posenc.encodings.rope.rerotate_keys`), so each step equals recomputing the sequence.

To reach the cache, a :class:`CacheWatcher` on the module that owns the rotary module (the decoder body)
holds the KV cache (``cache``, formerly ``past_key_values``) of the call in progress. The cached keys of a
row are taken to be the tokens just before the call's first position (how ``generate`` fills a cache, left
padding included: padded slots are masked, whatever their rotation). Supported: transformers' dynamic cache (``DynamicCache``, the default
of ``generate``), sliding-window layers included; another cache type is refused by name.

What re-rotation reaches: every cached key is rotated as a forward over the whole sequence would rotate it,
so the first layer's cache is exactly the recomputed one. The keys and values of deeper layers were computed
from hidden states of earlier steps, when the frequencies were those of a shorter length; for the small
per-step changes of dynamic NTK and dynamic YaRN this stays within 1e-4 of recomputing (tested). This is
not exact (the cached keys and values of deeper layers stay those of the shorter lengths), so
``cache="exact"`` does what exactness takes: ``generate`` drops the cache at each step whose frequencies
change and encodes the whole sequence again (:class:`RecomputeOnChange`), so every step equals recomputing
the sequence, at the cost of a forward over it per step past the original context. LongRoPE switches once,
from its short to its long factors, a change too large for re-rotation: with ``"consistent"`` or ``"exact"``,
``generate`` encodes the sequence again at the switch (one prefill, as transformers' Phi-3 does), after which
nothing changes any more. Without ``generate`` (a cache passed by hand), the keys are re-rotated.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..encodings import rope as R
from .cache_argument import cache_keyword, passed_cache


class CacheWatcher:
    """Forward pre- and post-hook of the rotary module's owner: ``cache`` is the running call's KV cache."""

    def __init__(self) -> None:
        self.cache: Any = None

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


def layers_of_type(text_config: Any, layer_type: str | None) -> list[int] | None:
    """The decoder layers a rotary slot serves: those of ``layer_type`` (per-layer-type RoPE), else all (None)."""
    if layer_type is None:
        return None
    return [i for i, t in enumerate(text_config.layer_types) if t == layer_type]


def _check_layer(layer: Any) -> None:
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
        raise ValueError(f"cache='consistent' re-rotates the keys of transformers' DynamicCache (generate's default); "
                         f"this cache has a {type(layer).__name__} layer. Generate with the default cache, or patch "
                         "with cache='stale'.")


def rerotate_cache(cache: Any, layers: list[int] | None, position_ids: torch.Tensor,
                   old: tuple[torch.Tensor, float], new: tuple[torch.Tensor, float]) -> None:
    """Re-rotate the cached keys of ``layers`` (None: all) from ``old`` to ``new`` (inv_freq, attention_scaling);
    the call's first positions ``position_ids[:, 0]`` follow the cached keys of each row."""
    cache_layers = getattr(cache, "layers", None)
    if cache_layers is None:
        raise ValueError(f"cache='consistent' needs a transformers Cache with .layers, got {type(cache).__name__}")
    turns: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # one (cos, sin) per cache length, batch and device
    for i in range(len(cache_layers)) if layers is None else layers:
        layer = cache_layers[i]
        keys = getattr(layer, "keys", None)
        if not isinstance(keys, torch.Tensor) or keys.numel() == 0:
            continue
        _check_layer(layer)
        (b, _, m, _), device = keys.shape, keys.device
        if (m, b, device) not in turns:
            first = position_ids[:, :1].to(device)
            positions = (first - m + torch.arange(m, device=device)).clamp(min=0).expand(b, m)
            turns[m, b, device] = R.rerotation(positions, old, new, device)
        R.rerotate_keys(keys, *turns[m, b, device])


def generated_length(input_ids: torch.Tensor, attention_mask: Any) -> int:
    """The ``max(position_ids) + 1`` that ``generate``'s next forward will have: the longest row without its
    padding."""
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        return int(attention_mask.sum(-1).max())
    return input_ids.shape[1]


class RecomputeOnChange:
    """``prepare_inputs_for_generation`` of one model instance: a step at which the frequencies change gets no
    cache, so the whole sequence is encoded again with the new frequencies (``generate`` keeps the new cache).
    LongRoPE (``cache="consistent"``): once, at the switch from the short to the long factors. Dynamic NTK and
    dynamic YaRN (``cache="exact"``): at every step that grows the length past the longest seen, i.e. each step
    past the original context costs a forward over the whole sequence, and every step equals recomputing it."""

    def __init__(self, model: nn.Module, hooks: list):
        self.model, self.hooks = model, hooks

    def __call__(self, input_ids: torch.Tensor, **kwargs: Any) -> dict:
        name = cache_keyword(kwargs)  # generate passes it as ``cache`` (transformers >= 5.24) or ``past_key_values``
        if name is not None and kwargs[name].get_seq_length() > 0:
            n = generated_length(input_ids, kwargs.get("attention_mask"))
            if any(h.would_change(n) for h in self.hooks):
                kwargs[name] = None
                kwargs["next_sequence_length"] = None
        return type(self.model).prepare_inputs_for_generation(self.model, input_ids, **kwargs)
