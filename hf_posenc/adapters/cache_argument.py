"""The KV cache argument of a transformers forward call, under either of its names: ``cache`` from
transformers 5.24, ``past_key_values`` before (and in models' remote code that still spells it so).

Every hook that reads the cache of a call, and every call this package makes with a cache, goes through
here: a hook that looked for one name only would see no cache under the other, and compute positions as if
nothing were cached (a silent wrong from the second decoding step on).
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn
from transformers import cache_utils

CACHE_NAMES = ("cache", "past_key_values")
# transformers' cache layers that hold no keys (where the release has them): a KV-shared layer's (Gemma 4: it reads
# another layer's keys) and a linear-attention layer's state
KEYLESS = tuple(t for t in (getattr(cache_utils, name, None) for name in ("DummyLayer", "LinearAttentionLayer")) if t)


def holds_no_keys(layer: Any) -> bool:
    """Whether a cache layer is one of :data:`KEYLESS` and holds no keys beside (a hybrid layer's
    ``LinearAttentionAndFullAttentionLayer`` is a linear-attention layer that holds keys too)."""
    return isinstance(layer, KEYLESS) and not isinstance(layer, (cache_utils.DynamicLayer, cache_utils.StaticLayer))


def forward_names(module: nn.Module) -> list[str]:
    """The parameter names of ``module.forward`` (through transformers' deprecation wrappers), in order."""
    try:
        return list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return []


def passed_argument(module: nn.Module, args: tuple, kwargs: dict, names: tuple[str, ...]) -> Any:
    """The argument ``module``'s forward was called with under one of ``names`` (by keyword, or by position), or
    None."""
    for name in names:
        if kwargs.get(name) is not None:
            return kwargs[name]
    if len(args) > 1:
        given = forward_names(module)[: len(args)]
        for name in names:
            if name in given:
                return args[given.index(name)]
    return None


def passed_cache(module: nn.Module, args: tuple, kwargs: dict) -> Any:
    """The KV cache ``module``'s forward was called with (by keyword under either name, or by position), or None."""
    return passed_argument(module, args, kwargs, CACHE_NAMES)


def _slides_over(layer: Any, window: int) -> bool:
    """Whether a sliding-window cache layer keeps the keys of a ``window``-token sliding window (a dynamic layer
    names its window; a static one holds ``min(window, length of the cache)`` slots)."""
    if getattr(layer, "sliding_window", None) is not None:
        return layer.sliding_window == window
    return getattr(layer, "max_cache_len", window + 1) <= window


def check_cache(cache: Any, method: str, window: int | None = None, layers: frozenset[int] | None = None) -> None:
    """Refuse, before compute, a KV cache whose indices are not the keys' positions for ``method`` (which reads
    positions from them): one with sliding-window layers (keys indexed from the window's start), unless their
    window is ``window``, the model's own sliding window, for a method where only ``i - j`` matters (the cache
    then drops only keys the model's attention masks anyway), or layers of a kind transformers' full-attention
    caches do not use. ``layers``: the indices of the cache layers the method reads (None: all; the others belong
    to layers it leaves to the model's own attention). A layer that holds no keys is passed over: the keys its
    attention reads are those of another layer, checked as that one."""
    from transformers.cache_utils import DynamicLayer, StaticLayer

    for index, layer in enumerate(getattr(cache, "layers", None) or ()):
        if layers is not None and index not in layers:
            continue
        if holds_no_keys(layer):
            continue  # (a Gemma 4 KV-shared layer reads its source layer's keys, checked as that one)
        sliding = getattr(layer, "is_sliding", False)
        if sliding and window is not None and _slides_over(layer, window):
            continue
        if sliding or not isinstance(layer, (DynamicLayer, StaticLayer)):
            raise ValueError(f"{method} reads each key's position from its index in the KV cache; this "
                             f"{type(cache).__name__} holds {type(layer).__name__} layers, whose indices are not "
                             "positions. Supported: DynamicCache, StaticCache (offloaded or not) and QuantizedCache "
                             "with full-attention layers (generate's cache_implementation 'dynamic', 'static', "
                             "'offloaded', 'offloaded_static', 'quantized').")


def cache_name(model: nn.Module) -> str:
    """The keyword under which ``model``'s forward takes its KV cache."""
    names = forward_names(model)
    return next((n for n in CACHE_NAMES if n in names), "past_key_values")


def with_cache(model: nn.Module, cache: Any) -> dict:
    """``{name: cache}`` for ``model(**inputs, **with_cache(model, cache))``, under the name its forward takes."""
    return {cache_name(model): cache}


def cache_keyword(kwargs: dict) -> str | None:
    """Which of the cache's names ``kwargs`` holds a cache under (``prepare_inputs_for_generation``'s), or None."""
    return next((n for n in CACHE_NAMES if kwargs.get(n) is not None), None)


def returned_cache(output: Any) -> Any:
    """The KV cache a model's output carries (its ``cache`` field, formerly ``past_key_values``), or None."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)
