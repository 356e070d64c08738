"""Attention plumbing shared by the methods that bring their own attention function (ALiBi, the remapped-position
methods): the cache offset of a forward call, grouped heads, and registration and per-instance selection of
an attention function in transformers' ``AttentionInterface``.

An added registry entry changes no existing function or class; only the configs that name it select it, and
a patched model's config is its own (``PatchRecord.isolate_config``).
"""

from __future__ import annotations

import torch

from .cache_argument import CACHE_NAMES, passed_cache

_registered: set[str] = set()  # names added to transformers' registries


class CacheOffset:
    """The number of tokens already cached when the current forward call started (``past``), read by a
    pre-hook on the model body: query ``t`` of the call is at cache index ``past + t``."""

    def __init__(self) -> None:
        self.past = 0
        self.cache_seen: bool | None = None  # whether the body's current call passed a KV cache (None: no call seen)

    def body_hook(self, module, args, kwargs) -> None:
        cache = passed_cache(module, args, kwargs)
        self.past = cache.get_seq_length() if cache is not None else 0
        self.cache_seen = cache is not None

    def query_start(self, q: int, k_total: int) -> int:
        """The cache index of the first of ``q`` queries over ``k_total`` keys. More keys than queries in a call
        whose cache the body hook did not find is refused: the positions would be wrong (a silent wrong)."""
        if getattr(self, "cache_seen", None) is False and k_total > q:
            raise RuntimeError(f"attention got {k_total} keys for {q} queries, but the model's forward call passed no "
                               f"KV cache that hf_posenc recognises (keyword {' or '.join(CACHE_NAMES)}); the positions "
                               "of the queries would be wrong. Pass the cache to the model under one of those names.")
        return self.past if self.past + q <= k_total else k_total - q


def repeat_heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """Grouped key/value heads repeated ``n`` times along the head axis (as transformers' ``repeat_kv``)."""
    return x if n == 1 else x.repeat_interleave(n, dim=1)


def fold_groups(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``q`` ``[b, h, n, d]`` as ``[b, kv_heads, groups * n, d]``: the query heads that share a key/value head folded
    into the query axis, so that a kernel reads each key once (no repeated keys; not for a causal pattern)."""
    b, h, n, d = q.shape
    return q.reshape(b, kv_heads, h // kv_heads * n, d)


def unfold_groups(out: torch.Tensor, lse: torch.Tensor, heads: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`fold_groups` for a kernel's output ``[b, kv_heads, groups * n, dv]`` and its
    log-sum-exp ``[b, kv_heads, >= groups * n]`` (a kernel may pad it): ``[b, heads, n, dv]`` and ``[b, heads, n]``."""
    b, folded = out.shape[0], out.shape[2]
    return out.reshape(b, heads, n, -1), lse[..., :folded].reshape(b, heads, n)


def check_attention(model, method: str) -> str:
    """The model's attention implementation, if ``method``'s attention function can replace it (sdpa or eager)."""
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"{method} needs an attention implementation it can replace (sdpa or eager); this model "
                         f"uses {impl!r}. Load it with attn_implementation='sdpa'.")
    return impl


def register_attention(name: str, fn) -> str:
    """Add ``fn`` to transformers' attention registry as ``name``, with SDPA's mask builder (once per name)."""
    if name not in _registered:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        from transformers.modeling_utils import AttentionInterface

        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)
        _registered.add(name)
    return name


def select(model, record, state: CacheOffset, attention_modules, name: str, state_attr: str) -> None:
    """This instance's (isolated) config selects the registered attention function ``name``; each attention
    module gets ``state`` as ``state_attr``. Both recorded, so that ``unpatch`` restores them."""
    record.assign(model.config, "_attn_implementation", name)
    for m in attention_modules:
        record.set_attr(m, state_attr, state)
