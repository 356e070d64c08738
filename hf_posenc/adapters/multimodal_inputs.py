"""What an attention-level method on the language model of a multimodal model (Gemma 3 and 4, Qwen2/2.5/3-VL,
Qwen3.5, Llama 4, ...) computes: causal attention over text positions, a token's position its index. Images, videos
and audio take positions or attention it does not compute (3-D grid positions under MRoPE, attention in both
directions within an image in Gemma 3), so a call of the model, or of its base model, that gets them is refused
before its language model runs (a forward call: before its encoders too; ``generate`` encodes them first)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .cache_argument import forward_names

# the keyword arguments of transformers' multimodal models that carry images, videos, audio or their encodings
MEDIA_INPUTS = ("pixel_values", "pixel_values_videos", "input_features", "cross_attention_states",
                "mm_encoder_outputs")


def takes_media(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes one of :data:`MEDIA_INPUTS`."""
    return bool(set(forward_names(model)) & set(MEDIA_INPUTS))


def media_takers(model: nn.Module, language_model: nn.Module) -> list[nn.Module]:
    """The model and its base model, where each is not the language model and its forward takes media."""
    found = [model, getattr(model, "base_model", None), getattr(model, "model", None)]
    unique = [m for i, m in enumerate(found) if isinstance(m, nn.Module) and all(m is not o for o in found[:i])]
    return [m for m in unique if m is not language_model and takes_media(m)]


def _holds(value: Any) -> bool:
    """Whether an argument carries something: not None, not an empty mapping or one of None values."""
    if isinstance(value, Mapping):
        return any(v is not None for v in value.values())
    return value is not None


def check_text_call(module: nn.Module, args: tuple, kwargs: dict, method: str) -> None:
    """A ValueError where a call of ``module`` (the model, or its base model) gets images, videos or audio (an empty
    ``mm_encoder_outputs``, which ``generate`` passes with text alone, is none)."""
    given: dict[str, Any] = {**dict(zip(forward_names(module)[: len(args)], args)), **kwargs}
    media = [name for name in MEDIA_INPUTS if _holds(given.get(name))]
    if media:
        raise ValueError(f"{method} (hf_posenc) computes causal attention over text positions; this call has "
                         f"{' and '.join(media)} (images, videos or audio, whose tokens take positions or attention "
                         "it does not compute). Run it on text inputs; for inputs with media use a RoPE scaling "
                         "(pi, ntk, yarn, ...), which keeps every position, or hf_posenc.unpatch(model).")
