"""Where a transformers decoder keeps what hf_posenc changes: its body, its layers and their attention
modules, its rotary frequency sets, and the geometry of its RoPE. Read-only helpers that every adapter and
attention function imports (downward: nothing here imports them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..encodings import rope as R
from .base import text_config


def body(model: nn.Module) -> nn.Module:
    """The decoder body: ``base_model``, or ``model.model`` where ``base_model_prefix`` names another attribute
    (Llama 4's causal LM says ``language_model`` and holds its body as ``model``), or the base model's
    ``language_model`` (a vision-language model's: Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's)."""
    base = getattr(model, "base_model", model)
    for found in (base, getattr(model, "model", None), getattr(base, "language_model", None)):
        if isinstance(found, nn.Module) and hasattr(found, "layers"):
            return found
    return base


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(body(model), "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"{type(model).__name__} has no decoder layer list (model.layers) to attach attention to.")
    return list(layers)


def attention_module(layer: nn.Module) -> nn.Module:
    attn = getattr(layer, "self_attn", None)
    if not isinstance(attn, nn.Module):
        raise ValueError(f"{type(layer).__name__} has no self_attn module.")
    return attn


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention module of every decoder layer."""
    return [attention_module(layer) for layer in decoder_layers(model)]


def layer_modules(model: nn.Module) -> list[nn.Module | None]:
    """Per decoder layer, its self-attention module, None where it has none (Qwen3-Next's and OLMo Hybrid's
    linear-attention layers, LFM3's convolutions)."""
    out = []
    for layer in decoder_layers(model):
        attn = getattr(layer, "self_attn", None)
        out.append(attn if isinstance(attn, nn.Module) else None)
    return out


def nope_layers(config: Any, n: int) -> list[int]:
    """The indices of the layers without RoPE, from the config alone (``no_rope_layers``: 1 rotates, 0 does not)."""
    flags = getattr(config, "no_rope_layers", None)
    return [i for i, f in enumerate(flags[:n]) if not f] if isinstance(flags, (list, tuple)) else []


@dataclass(frozen=True)
class RotarySlot:
    """One set of rotary frequencies: a standard module's own (``layer_type`` None) or those of one layer
    type in a per-layer-type module (attributes ``{layer_type}_inv_freq``, ...)."""

    module: nn.Module
    layer_type: str | None = None

    def attr(self, name: str) -> str:
        return name if self.layer_type is None else f"{self.layer_type}_{name}"

    def get(self, name: str) -> Any:
        return getattr(self.module, self.attr(name))

    def rope_parameters(self, config: Any) -> dict[str, Any]:
        rp = config.rope_parameters
        return rp if self.layer_type is None else rp[self.layer_type]

    def set_default_type(self, record) -> None:
        """This slot's ``rope_type`` becomes ``"default"``, so that transformers' own dynamic update stays out."""
        m = self.module
        record.set_attr(m, "rope_type",
                        "default" if self.layer_type is None else {**m.rope_type, self.layer_type: "default"})


def rotary_slots(model: nn.Module) -> list[RotarySlot]:
    """The rotary frequency sets of the language model inside ``model``: standard modules, and each layer type of
    per-layer-type modules. A vision tower's own rotary module (Qwen2-VL's 2-D RoPE of image patches, built from
    ``vision_config``) is not one of them."""
    found = []
    towers = _other_towers(getattr(model, "config", None))
    for m in model.modules():
        if any(getattr(m, "config", None) is c for c in towers):
            continue
        if isinstance(m._buffers.get("inv_freq"), torch.Tensor) and hasattr(m, "attention_scaling") \
                and hasattr(m, "rope_type"):
            found.append(RotarySlot(m))
        elif isinstance(getattr(m, "rope_type", None), dict) and getattr(m, "layer_types", None):
            for lt in m.layer_types:
                if isinstance(m._buffers.get(f"{lt}_inv_freq"), torch.Tensor) and hasattr(m, f"{lt}_attention_scaling"):
                    found.append(RotarySlot(m, lt))
    return found


def _other_towers(config: Any) -> list[Any]:
    """The sub-configs of a composite model's config other than its language model's (vision_config, ...)."""
    if config is None:
        return []
    lm, _ = text_config(config)
    subs = [getattr(config, name, None) for name in getattr(config, "sub_configs", None) or {}]
    return [c for c in subs if c is not None and c is not lm]


def per_layer_type(rope_parameters: Any) -> bool:
    """Whether ``rope_parameters`` holds one RoPE per layer type (Gemma 3: ``{"full_attention": {...}, ...}``)."""
    return isinstance(rope_parameters, dict) and bool(rope_parameters) and all(
        isinstance(v, dict) for v in rope_parameters.values())


def default_layer_types(types: list[str]) -> list[str]:
    """The layer types a RoPE scaling changes when none are named: ``full_attention`` beside other (sliding-window)
    types -- a window never sees a position past its width -- else every type."""
    types = sorted(set(types))
    return ["full_attention"] if "full_attention" in types and len(types) > 1 else types


def check_uniform(hf_config: Any) -> None:
    """A ValueError where the config sets its attention geometry per layer (transformers' heterogeneous configs,
    ``per_layer_config``: Gemma 4's head widths): hf_posenc reads one geometry per language model."""
    if getattr(hf_config, "is_heterogeneous", False):
        raise ValueError(f"model_type={hf_config.model_type!r} sets its attention per layer (per_layer_config: "
                         f"{', '.join(_varied(hf_config)) or 'values'} differ between layers); hf_posenc reads one "
                         "geometry per language model and does not support such a model yet.")


def _varied(hf_config: Any) -> list[str]:
    """The fields a heterogeneous config sets per layer, as far as transformers' record of them can be read."""
    try:
        spec = hf_config._heterogeneity_spec
        return sorted(set(spec.explicit_per_layer_attributes) | {
            k for layer in spec.per_layer_overrides.values() for k in layer})
    except Exception:  # noqa: BLE001 (transformers' private record; the message does without it)
        return []


def head_dim(hf_config: Any, layer_type: str | None = None) -> int:
    """The attention head width; of the layers of ``layer_type`` where the config sets it per layer (Gemma 4: its
    sliding and full-attention layers differ), which must then be the same for every layer of that type."""
    if getattr(hf_config, "is_heterogeneous", False):
        if layer_type is None:
            check_uniform(hf_config)
        hf_config = _type_config(hf_config, layer_type)
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def _type_config(hf_config: Any, layer_type: str) -> Any:
    """The per-layer config of the layers of ``layer_type`` (a ValueError where their head widths differ)."""
    views = hf_config.per_layer_config
    widths = {views[i].head_dim for i, t in enumerate(hf_config.layer_types) if t == layer_type}
    if len(widths) != 1:
        raise ValueError(f"model_type={hf_config.model_type!r} gives its {layer_type!r} layers head widths "
                         f"{sorted(widths)}; hf_posenc reads one width per layer type and does not support it yet.")
    return views[layer_type]


def scaled_by(rp: dict[str, Any]) -> str | None:
    """The scaling a RoPE's ``rope_parameters`` already hold: their ``rope_type``, or None for an unscaled RoPE
    (``default``; ``proportional`` without a factor, as Gemma 4's full-attention layers ship)."""
    kind = rp.get("rope_type", "default")
    if kind == "default" or (kind == "proportional" and float(rp.get("factor") or 1.0) == 1.0):
        return None
    return kind


def current_context(max_position: int | None, rp: dict[str, Any]) -> int | None:
    """The context a checkpoint whose RoPE is ``rp`` serves now: its ``max_position``(_embeddings), or, for a YaRN
    scaling, its factor times its original context where that is more. Qwen2.5's and Qwen3's long-context recipe adds
    YaRN x4 over 32,768 tokens and leaves max_position_embeddings at the pretraining length (32,768; Qwen3: 40,960):
    transformers computes the x4 frequencies, made for 131,072 tokens, at every length. None: neither is stated."""
    factor, original = rp.get("factor"), rp.get("original_max_position_embeddings")
    if rp.get("rope_type") != "yarn" or not factor or not original:
        return max_position
    return max(max_position or 0, int(round(float(factor) * int(original))))


def served_context(hf_config: Any) -> int | None:
    """:func:`current_context` of a model's language model, from its config (per-layer-type RoPE: its
    ``max_position_embeddings``)."""
    lm = text_config(hf_config)[0]
    rope = getattr(lm, "rope_parameters", None)
    return current_context(getattr(lm, "max_position_embeddings", None), rope if isinstance(rope, dict) else {})


def checkpoint_context(lay: Layout) -> int | None:
    """:func:`current_context` of the first rotary slot ``lay`` changes."""
    return current_context(getattr(lay.config, "max_position_embeddings", None),
                           lay.selected[0].rope_parameters(lay.config))


def rope_geometry(hf_config: Any, original: int, rp: dict[str, Any] | None = None,
                  layer_type: str | None = None) -> R.RopeGeometry:
    """The geometry of the RoPE described by ``rp`` (default: the config's flat ``rope_parameters``), of the
    layers of ``layer_type`` (per-layer-type RoPE). A ``proportional`` RoPE turns its first head_dim x
    partial_rotary_factor / 2 pairs with exponents over the whole head (``RopeGeometry.turning``)."""
    rp = hf_config.rope_parameters if rp is None else rp
    partial = rp.get("partial_rotary_factor", None) or getattr(hf_config, "partial_rotary_factor", None) or 1.0
    width = head_dim(hf_config, layer_type)
    if rp.get("rope_type") == "proportional":
        return R.RopeGeometry(base=float(rp["rope_theta"]), dim=width, original_max_position_embeddings=original,
                              turning=int(partial * width // 2))
    return R.RopeGeometry(base=float(rp["rope_theta"]), dim=int(width * partial),
                          original_max_position_embeddings=original)


@dataclass(frozen=True)
class Layout:
    """Where one model keeps its RoPE, as a method sees it: every rotary slot, those the method changes,
    the language-model config and its path prefix in the model config, the hf_posenc block of the model config
    (what a patch saved into the checkpoint recorded; None: none) and the context under a saved composition that
    hf_posenc.from_pretrained kept on the model (``rope_compose.under_composition``; None: none)."""

    slots: list[RotarySlot]
    selected: list[RotarySlot]
    config: Any
    prefix: str
    block: Any = None
    under: int | None = None

    @property
    def layered(self) -> bool:
        return self.slots[0].layer_type is not None

    def chosen_types(self) -> list[str]:
        return sorted({s.layer_type for s in self.selected})
