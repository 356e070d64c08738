"""What an attention-level method on the language model of a multimodal model (Gemma 3 and 4, Qwen2/2.5/3-VL,
Qwen3.5, Llama 4, ...) computes: causal attention over text positions, a token's position its index. Images, videos
and audio take positions or attention it does not compute (3-D grid positions under MRoPE, attention in both
directions within an image in Gemma 3), so a call that gets them is refused before its encoders run."""

from __future__ import annotations

from typing import Any

from torch import nn

from .cache_argument import forward_names

# the keyword arguments of transformers' multimodal models that carry images, videos, audio or their encodings
MEDIA_INPUTS = ("pixel_values", "pixel_values_videos", "input_features", "cross_attention_states",
                "mm_encoder_outputs")


def takes_media(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes one of :data:`MEDIA_INPUTS`."""
    return bool(set(forward_names(model)) & set(MEDIA_INPUTS))


def check_text_call(module: nn.Module, args: tuple, kwargs: dict, method: str) -> None:
    """A ValueError where a call of ``module`` (the whole model) gets images, videos or audio."""
    given: dict[str, Any] = {**dict(zip(forward_names(module)[: len(args)], args)), **kwargs}
    media = [name for name in MEDIA_INPUTS if given.get(name) is not None]
    if media:
        raise ValueError(f"{method} (hf_posenc) computes causal attention over text positions; this call has "
                         f"{' and '.join(media)} (images, videos or audio, whose tokens take positions or attention "
                         "it does not compute). Run it on text inputs; for inputs with images use a RoPE scaling "
                         "(pi, ntk, yarn, ...), which keeps every position, or hf_posenc.unpatch(model).")
