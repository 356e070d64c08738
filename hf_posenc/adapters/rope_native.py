"""What plain transformers can rebuild from a RoPE patch: the native ``rope_parameters`` of each method, the
check that a reload really rebuilds our frequencies, and the attention scales that transformers derives
from the RoPE parameters (DeepSeek-style MLA models)."""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from torch import nn

from ..config import PosEncConfig
from ..encodings import rope as R
from ..io.logs import errors_only
from ..methods.rope import SCALINGS

# what a scaling keeps of the checkpoint's rope_parameters: how the rotation is laid out, not its frequencies (the
# rotated share of the head; MRoPE's split of the frequencies between temporal, height and width positions)
LAYOUT_KEYS = ("partial_rotary_factor", "mrope_section", "mrope_interleaved")
# what it keeps besides: keys the attention reads at every forward (Ministral 3 scales its queries by
# 1 + beta ln(1 + floor(position / original_max_position_embeddings)), Llama 4's temperature, from these parameters)
ATTENTION_KEYS = ("llama_4_scaling_beta",)


def native_rope_parameters(cfg: PosEncConfig, geom: R.RopeGeometry, base_rp: dict[str, Any]) -> dict[str, Any] | None:
    """The transformers ``rope_parameters`` equal to ``cfg``, or None when transformers has no such type."""
    native = SCALINGS[cfg.method].native
    if native is None:
        return None
    common = {"rope_theta": geom.base}
    common.update({k: base_rp[k] for k in LAYOUT_KEYS + ATTENTION_KEYS if k in base_rp})
    out = {**common, **native(cfg.factor, cfg.original_max_position_embeddings, cfg.params, geom)}
    if geom.turning is not None and out.get("rope_type") in ("linear", "default"):
        out["rope_type"] = "proportional"  # transformers' proportional RoPE takes a PI factor and any rope_theta (NTK)
    return out


def softmax_rescalers(model: nn.Module) -> list[tuple[nn.Module, Any]]:
    """(attention module, its modeling file's ``yarn_apply_mscale``) for models whose attention scale depends on
    the RoPE parameters. A module with such a function but without ``qk_head_dim`` and ``scaling`` is refused:
    its scale could not be set as transformers sets it."""
    found = []
    for m in model.modules():
        fn = getattr(sys.modules.get(type(m).__module__), "yarn_apply_mscale", None)
        if fn is None or not type(m).__name__.endswith("Attention"):
            continue
        if not (hasattr(m, "qk_head_dim") and isinstance(getattr(m, "scaling", None), float)):
            raise ValueError(f"{type(m).__name__} scales its attention from the RoPE parameters in a way hf_posenc "
                             "does not know; this model is not supported yet.")
        found.append((m, fn))
    return found


def native_mismatch(config: Any, changes: dict[str, Any], ours: dict[Any, tuple[torch.Tensor, float]]) -> str:
    """Why transformers would not rebuild our frequencies from the config fields in ``changes`` ("" when it
    would): the config is rebuilt as a reload from config.json rebuilds it (``from_dict``: its own
    standardisation runs, e.g. Phi-3 turns ``yarn`` into ``longrope``), each patched rotary module is
    built afresh from it, and its frequencies and attention scaling are compared with ours."""
    data = {**config.to_dict(), **changes}
    try:
        with errors_only("transformers.modeling_rope_utils"):  # (keys only engines read: vLLM's short_mscale)
            rebuilt = type(config).from_dict(data)
    except Exception as err:  # a config class that refuses the values: not native (its error's first sentence)
        return f"{type(config).__name__} does not accept them ({type(err).__name__}: {str(err).split('. ')[0]})"
    modules = {}
    for slot, (inv_freq, attention) in ours.items():
        cls = type(slot.module)
        if cls not in modules:
            try:
                modules[cls] = cls(rebuilt)
            except Exception as err:
                return f"{cls.__name__} cannot be built from them ({type(err).__name__}: {err})"
        fresh = modules[cls]
        theirs = getattr(fresh, slot.attr("inv_freq")).float().cpu()
        mine = inv_freq.float().cpu()
        if theirs.shape != mine.shape or not bool(((theirs - mine).abs() <= 1e-6 * mine.abs() + 1e-12).all()):
            return f"{cls.__name__} would compute other frequencies from them"
        if not math.isclose(float(getattr(fresh, slot.attr("attention_scaling"))), float(attention), rel_tol=1e-6):
            return f"{cls.__name__} would compute another attention scaling from them"
    return ""
