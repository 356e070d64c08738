"""Multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the language model rotates each head by three positions at
once -- temporal, height and width, one share of the frequencies each (``mrope_section``); a text token has the
same value in all three, an image token its place in the image grid (the model's ``get_rope_index``).

A RoPE scaling changes the frequencies and leaves both the split and the positions as they are, which is what
transformers computes from the same ``rope_parameters`` (``mrope_section`` kept in them). What is refused here,
before any compute: methods that remap or replace positions (attention-level methods, family swaps), which would
have to remap the 3-D positions of image tokens; and the cache modes of the length-dependent scalings that re-rotate
or re-encode cached keys from 1-D positions (``cache="stale"`` is taken: the cached keys keep their rotation, as
transformers keeps them)."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..config import PosEncConfig
from ..methods.rope import SCALINGS
from .layout import Layout

KINDS = ("rope", "none")  # the kinds of method that keep every position as the model computes it
WHAT = {"swap": "a family swap", "absolute": "a family swap", "attention": "an attention-level method"}


def is_mrope(lay: Layout) -> bool:
    """Whether the language model's RoPE is multimodal: a rotary module that splits its frequencies by
    ``mrope_section``, or rope_parameters that give one."""
    rp = getattr(lay.config, "rope_parameters", None)
    in_config = isinstance(rp, dict) and "mrope_section" in rp
    return in_config or any(hasattr(s.module, "mrope_section") for s in lay.slots)


def check_mrope(model: nn.Module, cfg: PosEncConfig, lay: Layout) -> None:
    """A ValueError, naming the method and what is allowed, where ``cfg`` cannot keep the model's 3-D positions."""
    if not is_mrope(lay):
        return
    model_type = model.config.model_type
    if cfg.spec.kind not in KINDS:
        what = WHAT.get(cfg.spec.kind, cfg.spec.kind)
        raise ValueError(
            f"{cfg.method!r} ({what}) on model_type={model_type!r}, whose multimodal RoPE (mrope_section="
            f"{_section(lay)}) rotates each token by 3-D positions (temporal, height, width): hf_posenc does not remap "
            "MRoPE's 3-D positions, so the positions of image tokens would be wrong. RoPE scalings are supported "
            "(pi, ntk, yarn, dynamic_ntk, llama3, longrope), and 'none'."
        )
    mode = cfg.params.get("cache")
    if SCALINGS.get(cfg.method) is not None and SCALINGS[cfg.method].dynamic and mode != "stale":
        raise ValueError(
            f"{cfg.method} with cache={mode!r} on model_type={model_type!r}: re-rotating or re-encoding cached keys "
            "follows 1-D positions, and this multimodal RoPE (mrope_section) rotates by 3-D ones. Pass "
            "cache='stale' (the cached keys keep their rotation, as transformers keeps them)."
        )


def _section(lay: Layout) -> Any:
    rp = getattr(lay.config, "rope_parameters", None)
    if isinstance(rp, dict) and "mrope_section" in rp:
        return rp["mrope_section"]
    return next((s.module.mrope_section for s in lay.slots if hasattr(s.module, "mrope_section")), None)
