"""Attention plumbing shared by the methods that bring their own attention function (ALiBi, the remapped-position
methods): the cache offset of a forward call, grouped heads, and registration and per-instance selection of
an attention function in transformers' ``AttentionInterface``.

An added registry entry changes no existing function or class; only the configs that name it select it, and
a patched model's config is its own (``PatchRecord.isolate_config``).
"""

from __future__ import annotations

import torch

from .cache_argument import CACHE_NAMES, check_cache, passed_cache
from .layout import body

_registered: set[str] = set()  # names added to transformers' registries
SERVED = ("eager", "sdpa")  # the implementations a method's own attention function stands in for


class CacheOffset:
    """The number of tokens already cached when the current forward call started (``past``), read by a
    pre-hook on the model body: query ``t`` of the call is at cache index ``past + t``. The hook first checks
    what the call would compute with: the attention implementation the patch installed (``serves``: the
    implementations under which the method runs; None: any) and a KV cache whose indices are positions."""

    method = "this method"  # the method's name, for messages
    serves: tuple[str, ...] | None = None
    sliding_ok = False  # whether a sliding-window cache of the model's own window keeps it exact (only i - j
    # matters, and the cache drops only keys the model's attention masks anyway)
    layers: frozenset[int] | None = None  # the cache layers whose keys it reads (None: all)

    def __init__(self) -> None:
        self.past = 0
        self.cache_seen: bool | None = None  # whether the body's current call passed a KV cache (None: no call seen)

    def body_hook(self, module, args, kwargs) -> None:
        self.check_implementation(getattr(module, "config", None))
        cache = passed_cache(module, args, kwargs)
        window = getattr(getattr(module, "config", None), "sliding_window", None) if self.sliding_ok else None
        check_cache(cache, self.method, window, self.layers)
        self.past = int(cache.get_seq_length()) if cache is not None else 0  # a static cache's is a tensor
        self.cache_seen = cache is not None
        self.call_tokens = _call_length(args, kwargs)

    def check_implementation(self, config) -> None:
        impl = getattr(config, "_attn_implementation", None)
        if self.serves is not None and impl not in self.serves:
            raise RuntimeError(f"{self.method} (hf_posenc) runs through the attention implementation(s) "
                               f"{' or '.join(map(repr, self.serves))}, but this model's attention implementation "
                               f"is now {impl!r} (assigned to its config directly): computing would silently drop "
                               f"{self.method}. Use model.set_attn_implementation('eager' or 'sdpa'), which keeps the "
                               "method, or hf_posenc.unpatch(model) first.")

    def skipped(self, q: int) -> int:
        """How many of the call's tokens come before the ``q`` queries a layer got: 0, except where a layer computes
        the call's last queries only (Gemma 4's KV-shared layers under ``logits_to_keep``)."""
        call = getattr(self, "call_tokens", None)
        return call - q if call and q < call else 0

    def query_start(self, q: int, k_total: int) -> int:
        """The cache index of the first of ``q`` queries over ``k_total`` keys. More keys than the call's tokens in a
        call whose cache the body hook did not find is refused: the positions would be wrong (a silent wrong)."""
        skipped = self.skipped(q)
        if getattr(self, "cache_seen", None) is False and k_total > q + skipped:
            raise RuntimeError(f"attention got {k_total} keys for {q} queries, but the model's forward call passed no "
                               f"KV cache that hf_posenc recognises (keyword {' or '.join(CACHE_NAMES)}); the "
                               "positions of the queries would be wrong. Pass the cache to the model under one of "
                               "those names.")
        start = self.past + skipped
        return start if start + q <= k_total else k_total - q

    def keys_held(self, q: int, k_len: int) -> int:
        """How many of the ``k_len`` keys attention got are real: a static cache hands its whole buffer, whose
        slots from ``past`` + the call's tokens on are empty."""
        return min(k_len, self.past + q + self.skipped(q)) if getattr(self, "cache_seen", None) else k_len


def _call_length(args: tuple, kwargs: dict) -> int | None:
    """How many tokens a call of the model body gets (its ``input_ids`` or ``inputs_embeds``), None where unknown."""
    for name in ("input_ids", "inputs_embeds"):
        given = kwargs.get(name)
        if isinstance(given, torch.Tensor) and given.dim() >= 2:
            return int(given.shape[1])
    first = args[0] if args else None
    return int(first.shape[1]) if isinstance(first, torch.Tensor) and first.dim() >= 2 else None


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


def configs_read_by(model, modules) -> list:
    """The configs ``modules`` read their attention implementation from (each module's own, else the model's), and
    the one the model body builds its masks from, once each: a composite model's language model reads its text
    config; its vision or audio tower reads another."""
    found: dict[int, object] = {}
    read = [getattr(m, "config", None) or model.config for m in modules]
    for config in [*read, getattr(body(model), "config", None)]:
        if config is not None:
            found.setdefault(id(config), config)
    return list(found.values())


def select(model, record, state: CacheOffset, attention_modules, name: str, state_attr: str) -> None:
    """The (isolated) configs the attention modules read select the registered attention function ``name``, alone
    (transformers' setter would also set every sub-config: a VLM's vision tower would run the method); each
    attention module gets ``state`` as ``state_attr``. All recorded, so that ``unpatch`` restores them. A later
    ``set_attn_implementation`` keeps the method (:class:`KeepMethod`)."""
    for config in configs_read_by(model, attention_modules):
        record.assign(config, "_attn_implementation_internal", name)
    for m in attention_modules:
        record.set_attr(m, state_attr, state)
    state.method, state.serves = record.config.method, (name,)
    keep_method(model, record, follow=False)


def keep_method(model, record, follow: bool) -> None:
    """:class:`KeepMethod` as ``set_attn_implementation`` of the model and of every model inside it that shares
    its config (the body), recorded; ``follow``: the method's hooks serve eager and sdpa, the switch happens."""
    for m in model.modules():
        if getattr(m, "config", None) is model.config and callable(getattr(m, "set_attn_implementation", None)):
            record.set_attr(m, "set_attn_implementation", KeepMethod(m, record.config.method, follow))


class KeepMethod:
    """``set_attn_implementation`` of a model patched with a method that brings its own attention: 'eager' and
    'sdpa' keep the method (its function stands in for both; with ``follow`` the switch is made, and the
    method's hooks serve the new one); any other implementation (flash, flex, paged) would drop the method and
    is refused before anything changes. ``unpatch`` gives back the model (and config) as before the patch."""

    def __init__(self, owner, method: str, follow: bool):
        self.owner, self.method, self.follow = owner, method, follow

    def __call__(self, attn_implementation, allow_all_kernels: bool = False):
        asked = attn_implementation.get("", None) if isinstance(attn_implementation, dict) else attn_implementation
        method = self.method
        if asked is not None and asked not in SERVED:
            raise ValueError(f"{method} (hf_posenc) brings its own attention, which stands in for 'eager' or 'sdpa'; "
                             f"set_attn_implementation({asked!r}) would silently drop it. Choose 'eager' or 'sdpa', "
                             "or hf_posenc.unpatch(model) first.")
        if self.follow:
            return type(self.owner).set_attn_implementation(self.owner, attn_implementation, allow_all_kernels)
        return None  # the method's function keeps serving

