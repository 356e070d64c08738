"""Multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the language model rotates each head by three positions at
once -- temporal, height and width, one share of the frequencies each (``mrope_section``); a text token has the
same value in all three, an image token its place in the image grid (the model's ``get_rope_index``).

A RoPE scaling changes the frequencies and leaves both the split and the positions as they are, which is what
transformers computes from the same ``rope_parameters`` (``mrope_section`` kept in them).

An attention-level method remaps text positions: where a call's three rows of positions are equal (text), MRoPE is
the 1-D RoPE of that position, which is the token's index, and the method computes exactly what it computes on a
text-only decoder. A call with images or videos is refused before the language model runs
(``multimodal_inputs.py``), and one whose positions differ between rows (given by the caller) before the language
model's layers run (:func:`check_text_positions`).

What is refused at patch time: family swaps, which would have to replace the 3-D positions of image tokens; and the
cache modes of the length-dependent scalings that re-rotate or re-encode cached keys from 1-D positions
(``cache="stale"`` is taken: the cached keys keep their rotation, as transformers keeps them)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import PosEncConfig
from ..methods.rope import SCALINGS
from .layout import Layout

# the kinds of method that keep every position as the model computes it, or remap text positions only (attention)
KINDS = ("rope", "none", "attention")
WHAT = {"swap": "a family swap", "absolute": "a family swap"}


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
            "(pi, ntk, yarn, dynamic_ntk, llama3, longrope), attention-level methods on text inputs (self_extend, "
            "dca, rerope, leaky_rerope, string), and 'none'."
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


def check_text_positions(position_ids: Any, method: str) -> None:
    """A ValueError where a call's multimodal positions (``[3 or 4, batch, tokens]``: an optional text row, then
    temporal, height, width) differ between rows: image or video tokens at grid positions, which ``method`` (it
    remaps each token's index) would place wrongly."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 3 or position_ids.shape[0] < 2:
        return
    if not bool((position_ids == position_ids[:1]).all()):
        raise ValueError(f"{method} (hf_posenc) remaps text positions, and this call's multimodal RoPE positions "
                         "differ between temporal, height and width: image or video tokens at grid positions, which "
                         "it would place wrongly. Run it on text inputs; for inputs with images use a RoPE scaling "
                         "(pi, ntk, yarn, ...), which keeps every position, or hf_posenc.unpatch(model).")
