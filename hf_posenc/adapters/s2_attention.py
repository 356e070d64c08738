"""Shifted sparse attention (S²-Attn; Chen et al., "LongLoRA: Efficient Fine-tuning of Long-Context Large Language
Models", ICLR 2024, arXiv:2309.12307, Sec. 3.2), a training-time attention for long sequences: the sequence is cut
into groups of G tokens and each query attends causally within its group only; half of the heads use groups
shifted by G/2, so that information flows between neighbouring groups. At inference the model attends in full.

One departure from the paper's pseudo-code: there the shifted half is rolled by G/2, so that the first G/2 tokens
wrap around into the last group and attend to the last tokens of the sequence (a look at the future). Here the
shifted groups are [0, G/2), [G/2, 3G/2), ..., [T - G/2, T): the same groups without the wrap, so the attention
stays causal. Cost: the shifted half computes one group more.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..methods import resolve_method
from .attention import configs_read_by, register_attention, repeat_heads
from .layout import attention_modules

NAME = "hf_posenc_s2_attn"
GROUP_ATTR = "_hf_posenc_s2_group"  # per attention module, while training with S²-Attn: (G, the implementation before)


def check_group(group: int, length: int) -> None:
    if isinstance(group, bool) or not isinstance(group, int) or group < 2 or group % 2:
        raise ValueError(f"--s2-attn-group must be an even whole number >= 2 (half of it is the shift), got {group!r}")
    if length % group:
        raise ValueError(f"S²-Attn cuts the sequence into groups of {group} tokens: the training length ({length}) "
                         f"must be a multiple of it")


def _grouped_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention within consecutive groups of ``group`` tokens of ``[b, h, T, d]`` (T a multiple of it)."""
    b, h, t, d = q.shape
    n = t // group

    def split(x):
        return x.reshape(b, h, n, group, x.shape[-1])

    if mask is None:
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True, scale=scale)
    else:
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask, scale=scale)
    return out.reshape(b, h, t, -1)


def s2_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float) -> torch.Tensor:
    """S²-Attn of ``[b, h, T, d]`` queries, keys and values (key/value heads already repeated): heads ``[0, h/2)``
    in groups ``[0, G), [G, 2G), ...``, heads ``[h/2, h)`` in the groups shifted by G/2 (module docstring)."""
    b, h, t, _ = q.shape
    check_group(group, t)
    half, shift = h // 2, group // 2
    plain = _grouped_causal(q[:, :half], k[:, :half], v[:, :half], group, scale)
    # shifted: pad G/2 in front and G/2 behind, so that the groups [0, G/2), [G/2, 3G/2), ... line up
    pad = (0, 0, shift, shift)
    qs, ks, vs = (F.pad(x[:, half:], pad) for x in (q, k, v))
    keep = torch.ones(t // group + 1, group, group, dtype=torch.bool, device=q.device).tril()
    keep[0, :, :shift] = False  # the padding in front is no key
    keep[0, :shift, :shift] = True  # (its own rows, discarded, keep one key so that no row is empty)
    shifted = _grouped_causal(qs, ks, vs, group, scale, keep)[:, :, shift : shift + t]
    return torch.cat([plain, shifted], dim=1)


def s2_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention signature: S²-Attn while the module trains with a group size set (by
    :func:`hf_posenc.training.finetune.finetune` around its training, on packed batches without padding; no attention
    dropout), else full attention by SDPA (the mask this name is registered with is SDPA's)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    group = getattr(module, GROUP_ATTR, None)
    if group is None or not module.training:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    # the training batches hf_posenc packs have no padding: the causal pattern is the groups' own (the mask unread)
    reps = query.shape[1] // key.shape[1]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = s2_attention(query, repeat_heads(key, reps), repeat_heads(value, reps), group, scale)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    return register_attention(NAME, s2_attention_forward)


class S2Training:
    """``with S2Training(model, group):`` -- the model's attention modules train with S²-Attn in groups of
    ``group`` tokens (evaluation inside the block attends in full); afterwards the model is as before."""

    def __init__(self, model, group: int | None):
        self.model, self.group = model, group

    def __enter__(self):
        if self.group is None:
            return self

        inner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # peft
        self.modules = attention_modules(inner)
        self.before = [(c, c._attn_implementation_internal) for c in configs_read_by(inner, self.modules)]
        for m in self.modules:
            setattr(m, GROUP_ATTR, self.group)
        for config, _ in self.before:  # (those configs alone: not a VLM's vision tower)
            config._attn_implementation_internal = register()
        return self

    def __exit__(self, *exc) -> None:
        if self.group is None:
            return
        for config, impl in self.before:
            config._attn_implementation_internal = impl
        for m in self.modules:
            delattr(m, GROUP_ATTR)


def check_s2_method(method: str, kind: str) -> None:
    """S²-Attn replaces the attention function while training: refused, by name, for a method that brings its
    own (the attention-level methods, ALiBi)."""
    if kind == "attention" or resolve_method(method).own_attention:
        raise ValueError(f"--s2-attn-group replaces the attention function while training, and {method!r} brings its "
                         "own attention (it would train without it): use S²-Attn with a RoPE scaling, none, or a "
                         "swap that leaves attention alone (nope, learned, sinusoidal)")


def check_s2_implementation(impl: str | None) -> None:
    """S²-Attn stands in for the model's SDPA or eager attention only (a loaded model's implementation)."""
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"--s2-attn-group stands in for 'sdpa' or 'eager' attention; this model uses {impl!r}")
