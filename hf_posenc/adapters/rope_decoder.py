"""Decoders with rotary position embeddings: LLaMA, Qwen2, Qwen3, Mistral, and any transformers
decoder whose config carries flat ``rope_parameters`` and whose rotary module follows the standard
layout (an ``inv_freq`` buffer, an ``attention_scaling`` factor and a ``rope_type``).

Per-layer-type RoPE (Gemma 3, OLMo 3, ...: ``rope_parameters`` keyed by layer type, one rotary module
holding ``{type}_inv_freq`` / ``{type}_attention_scaling`` and a ``rope_type`` dict): each type is a
``RotarySlot`` with its own geometry. A scaling changes the types in its ``layer_types`` knob; by
default only ``full_attention`` when the model also has other (sliding-window) types -- a window
never sees a position past its width, so its RoPE has nothing to extend (Gemma 3's own long-context
recipe scales the global layers only) -- else every type.

The adapter serves four kinds of method through one handler each (``HANDLERS``): ``none`` (the
checkpoint as it is), RoPE scalings (``rope_scaling``), swaps to another family (``decoder_swaps``) and
attention-level methods (``remapped``). A handler says whether the method changes chosen layer types
only, whether it works on per-layer-type RoPE, how it resolves and how it applies.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..config import CONFIG_KEY, PosEncConfig
from ..methods.remapped import KIND as ATTENTION
from ..methods.remapped import REMAPPED
from ..methods.rope import SCALINGS
from .base import Adapter, PatchRecord, text_config
from .decoder_swaps import SWAPS, TABLE_NAME, Swapped
from .family_census import takes
from .layout import Layout, RotarySlot, checkpoint_context, default_layer_types, rotary_slots, scaled_by
from .mrope import check_mrope
from .remapped import Remapped
from .rope_compose import (
    LENGTH_DEPENDENT_TYPES,
    UNDER_KEY,
    check_replacing_composition,
    restates_checkpoint,
    under_composition,
)
from .rope_scaling import Scaled


class Unchanged:
    """``none``: the checkpoint as it is, its own scaling (Llama 3.1's, a YaRN config's) included."""

    def per_type(self, spec) -> bool:
        return False

    def on_layered(self, spec) -> bool:
        return True

    def resolve(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, L: int) -> PosEncConfig:
        return PosEncConfig("none", None, L, dict(cfg.params))

    def apply(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, record: PatchRecord) -> bool:
        return True


# how the adapter serves each kind of method it takes ("absolute": the sinusoid, a swap here)
HANDLERS = {"none": Unchanged(), "swap": Swapped(), "absolute": Swapped(), ATTENTION: Remapped(), "rope": Scaled()}


# Decoders beyond the tested list on which each scaling of PROVEN_SCALINGS is proven (tests/test_generic_families.py:
# patched, saved, loaded back by plain transformers where the block says native, else by hf_posenc, the same logits;
# unpatched bit for bit). Those whose own config is already scaled (gpt_oss: yarn x32, apertus: llama3) take the
# static scalings on top of it, not the length-dependent ones.
GENERIC_FAMILIES = ("gemma", "gemma2", "phi", "phi3", "stablelm", "gpt_neox", "granite", "olmo", "cohere", "cohere2",
                    "starcoder2", "glm", "glm4", "qwen2_moe", "qwen3_moe", "mixtral", "falcon", "persimmon",
                    "nemotron", "smollm3", "exaone4", "ernie4_5", "seed_oss", "arcee", "apertus", "granitemoe",
                    "gpt_oss", "deepseek_v3")
ALREADY_SCALED_FAMILIES = ("gpt_oss", "apertus")
PROVEN_SCALINGS = ("yarn", "pi", "ntk", "dynamic_ntk", "llama3", "longrope")
# Vision-language models with multimodal RoPE (adapters/mrope.py) on which each scaling of PROVEN_SCALINGS is proven
# equal to transformers' own computation, on text and on image+text inputs (tests/test_mrope_vlm.py); the
# length-dependent ones with cache="stale". The attention-level methods too, on text inputs (images refused).
MROPE_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# Decoders beyond the tested list on which the attention-level methods marked any_rope (every built-in one) are proven
# (tests/test_attention_hybrids.py): sliding/full hybrids with sinks or soft-capping, partial rotary, MLA, NoPE layers
# (left as they are).
ANY_ROPE_ATTENTION_FAMILIES = ("gemma2", "gpt_oss", "phi", "deepseek_v3", "smollm3")


def _census_families(spec) -> list[str]:
    """The families the census (``adapters/family_census.py``) proves take ``spec``'s method."""
    return list(takes(spec.name))


class RopeDecoderAdapter(Adapter):
    name = "rope_decoder"
    model_types = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text")
    layered_types = ("gemma3_text",)  # per-layer-type RoPE: scalings and nope, no other swap yet
    kinds = frozenset({"rope", "none", ATTENTION})
    swaps = tuple(SWAPS)  # away from RoPE (the sinusoid is registered as an "absolute" method)
    generic_note = ("and other decoders with standard rotary embeddings, flat or per-layer-type rope_parameters, "
                    "found generically")

    def extra_weights(self, model: nn.Module) -> list[str]:
        return [k for k in model.state_dict() if f"{TABLE_NAME}." in k]

    def takes_layer_types(self) -> bool:
        return True

    def families(self, spec) -> list[str]:
        found = super().families(spec)
        if found and not HANDLERS[spec.kind].on_layered(spec):
            return [t for t in found if t not in self.layered_types]
        if found and spec.name in PROVEN_SCALINGS:
            composes = SCALINGS[spec.name].compose is not None
            found += [t for t in GENERIC_FAMILIES if composes or t not in ALREADY_SCALED_FAMILIES]
            found += list(MROPE_FAMILIES)
        if found and spec.kind == ATTENTION and REMAPPED[spec.name].any_rope:
            found += list(ANY_ROPE_ATTENTION_FAMILIES) + list(MROPE_FAMILIES)
        census = _census_families(spec)
        return found + [t for t in census if t not in found] if found else found

    def matches(self, model: nn.Module) -> bool:
        try:
            self._check_layout(model)
        except ValueError:
            return False
        return True

    def _check_layout(self, model: nn.Module) -> list[RotarySlot]:
        config, _ = text_config(model.config)
        rp = getattr(config, "rope_parameters", None)
        slots = rotary_slots(model)
        layered = [s for s in slots if s.layer_type is not None]
        if not slots:
            raise ValueError(f"no rotary embedding module (with an inv_freq buffer) found in {type(model).__name__}.")
        if layered and len(layered) != len(slots):
            raise ValueError(f"{type(model).__name__} mixes per-layer-type and single rotary modules: not supported.")
        for s in slots:
            if getattr(s.module, "config", config) is not config:
                raise ValueError(
                    f"{type(s.module).__name__} uses a config other than the model's language-model config: this "
                    "layout is not supported."
                )
            params = s.rope_parameters(config) \
                if isinstance(rp, dict) and (s.layer_type is None or s.layer_type in rp) else None
            if not isinstance(params, dict) or "rope_theta" not in params:
                where = "rope_parameters" if s.layer_type is None else f"rope_parameters[{s.layer_type!r}]"
                raise ValueError(f"model_type={config.model_type!r}: {where} has no rope_theta (got {rp!r}).")
        if not layered and not all(isinstance(s.module.rope_type, str) for s in slots):
            raise ValueError(f"{type(slots[0].module).__name__} has an unexpected rope_type layout.")
        return slots

    def _selected(self, model: nn.Module, slots: list[RotarySlot], cfg: PosEncConfig) -> list[RotarySlot]:
        """The slots a scaling changes: ``layer_types`` (default: see the module docstring)."""
        wanted = cfg.params.get("layer_types")
        if slots[0].layer_type is None:
            if wanted is not None:
                raise ValueError(f"layer_types={wanted!r}: model_type={model.config.model_type!r} has one RoPE for all "
                                 "layers; layer_types applies to per-layer-type RoPE (Gemma 3, OLMo 3, ...). Omit it.")
            return slots
        types = [s.layer_type for s in slots]
        if wanted is None:
            wanted = default_layer_types(types)
        unknown = sorted(set(wanted) - set(types))
        if unknown:
            raise ValueError(f"layer_types has {unknown}, which this model does not have; its RoPE layer types: "
                             f"{sorted(set(types))}.")
        return [s for s in slots if s.layer_type in wanted]

    def original_length(self, config: Any, rp: dict[str, Any] | None = None) -> int | None:
        """The length the checkpoint was trained on: the scaling already recorded in ``rp`` (default: the
        config's flat rope_parameters), if any, else ``max_position_embeddings``."""
        rp = config.rope_parameters if rp is None else rp
        if rp.get("rope_type", "default") not in ("default", "dynamic") and rp.get("original_max_position_embeddings"):
            return int(rp["original_max_position_embeddings"])
        omp = getattr(config, "max_position_embeddings", None)
        return int(omp) if omp else None

    def _layout(self, model: nn.Module, cfg: PosEncConfig) -> Layout:
        slots = self._check_layout(model)
        config, prefix = text_config(model.config)
        selected = self._selected(model, slots, cfg) if HANDLERS[cfg.spec.kind].per_type(cfg.spec) else slots
        return Layout(slots, selected, config, prefix, getattr(model.config, CONFIG_KEY, None),
                      model.__dict__.get(UNDER_KEY))

    def _original(self, cfg: PosEncConfig, lay: Layout) -> int:
        """The original context: the one given (checked against the checkpoint), else the checkpoint's -- for an
        attention-level method on a statically scaled RoPE, the context that scaling advertises now (the method
        extends from there and never advertises less)."""
        rp0 = lay.selected[0].rope_parameters(lay.config)
        recorded = self.original_length(lay.config, rp0)
        L = cfg.original_max_position_embeddings
        if L is None:
            current = self._scaled_context(cfg, lay)
            if current is not None:
                return current
            if recorded is None:
                raise ValueError(
                    f"original_max_position_embeddings is missing: the config of model_type="
                    f"{lay.config.model_type!r} has no max_position_embeddings; pass "
                    "original_max_position_embeddings=<trained context length>."
                )
            return recorded
        if restates_checkpoint(cfg, lay):
            return L  # a composed configuration of this checkpoint, over its current context
        if self._within_scaled_context(cfg, lay, recorded, L):
            return L
        if check_replacing_composition(cfg, lay):
            return L
        if recorded is not None and scaled_by(rp0) is not None and L != recorded:
            raise ValueError(
                f"original_max_position_embeddings={L} conflicts with the checkpoint, which records "
                f"{recorded} as its original context (rope_type={rp0.get('rope_type')!r}); "
                f"omit it or pass {recorded}{self._scaled_range_hint(cfg, lay)}."
            )
        if recorded is not None and L > recorded:
            raise ValueError(
                f"original_max_position_embeddings={L} is larger than the model's max_position_embeddings={recorded}: "
                "the original context cannot exceed what the model supports; pass a value <= "
                f"{recorded} or omit it."
            )
        return L

    @staticmethod
    def _scaled_context(cfg: PosEncConfig, lay: Layout) -> int | None:
        """The context a statically scaled checkpoint advertises now, where an attention-level method that keeps its
        RoPE (``any_rope``) may take it as L (the scaled frequencies are those of every length up to it); else None."""
        own = {scaled_by(s.rope_parameters(lay.config)) for s in lay.selected}
        current = checkpoint_context(lay)
        if cfg.spec.kind != ATTENTION or not REMAPPED[cfg.method].any_rope or not isinstance(current, int):
            return None
        return current if own - {None} and not own & set(LENGTH_DEPENDENT_TYPES) else None

    def _within_scaled_context(self, cfg: PosEncConfig, lay: Layout, recorded: int | None, L: int) -> bool:
        current = self._scaled_context(cfg, lay)
        return current is not None and recorded is not None and recorded <= L <= current

    def _scaled_range_hint(self, cfg: PosEncConfig, lay: Layout) -> str:
        current = self._scaled_context(cfg, lay)
        return "" if current is None else f", or up to {current}, the context its scaled RoPE is trained for"

    def resolve(self, model: nn.Module, cfg: PosEncConfig) -> PosEncConfig:
        lay = self._layout(model, cfg)
        check_mrope(model, cfg, lay)
        _check_frequencies_loaded(lay, cfg.method)
        resolved = HANDLERS[cfg.spec.kind].resolve(model, cfg, lay, self._original(cfg, lay))
        resolved.pretrained_context = under_composition(lay)  # what it is applied on: saved in its block (schema 4)
        return resolved

    def apply(self, model: nn.Module, cfg: PosEncConfig, record: PatchRecord) -> bool:
        return HANDLERS[cfg.spec.kind].apply(model, cfg, self._layout(model, cfg), record)


def _check_frequencies_loaded(lay: Layout, method: str) -> None:
    """A ValueError where the rotary frequencies are on the meta device (a model built under ``torch.device("meta")``
    whose buffers were never computed): every RoPE method reads them."""
    if any(s.get("inv_freq").device.type == "meta" for s in lay.slots):
        raise ValueError(f"{method}: the model's rotary frequencies (inv_freq) are on the meta device, not computed; "
                         "load the model with from_pretrained (an offloaded device_map included) before patching.")
