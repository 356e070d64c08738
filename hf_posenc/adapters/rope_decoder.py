"""Decoders with rotary position embeddings: LLaMA, Qwen2, Qwen3, Mistral, and any transformers
decoder whose config carries flat ``rope_parameters`` and whose rotary module follows the standard
layout (an ``inv_freq`` buffer, an ``attention_scaling`` factor and a ``rope_type``).

Per-layer-type RoPE (Gemma 3, OLMo 3, ...: ``rope_parameters`` keyed by layer type, one rotary module
holding ``{type}_inv_freq`` / ``{type}_attention_scaling`` and a ``rope_type`` dict): each type is a
``RotarySlot`` with its own geometry. A scaling changes the types in its ``layer_types`` knob; by
default only ``full_attention`` when the model also has other (sliding-window) types -- a window
never sees a position past its width, so its RoPE has nothing to extend (Gemma 3's own long-context
recipe scales the global layers only) -- else every type.

How a patch works: the rotary module of *this instance* gets the new ``inv_freq`` and
``attention_scaling`` computed by ``hf_posenc.encodings.rope``; its ``rope_type`` is set to
``"default"`` so that transformers' own dynamic update stays out of the way. Methods whose
frequencies depend on the sequence length (dynamic NTK, dynamic YaRN, LongRoPE) get a forward
pre-hook on that module instance which recomputes them from the current positions.

Length-dependent methods and the KV cache: the frequencies are chosen from the largest position in
the current forward call (``max(position_ids) + 1``), exactly as transformers does for its dynamic
types. During ``generate`` the prompt is encoded with the frequencies for the prompt length; each
new token past the original context recomputes them for the grown length. With ``cache="stale"``
the keys already in the cache keep the rotation they were stored with (transformers' behaviour);
with ``cache="consistent"`` (the default) they are re-rotated (``consistent_cache``). Recomputation
only ever happens when the length grows past what was seen, and the original frequencies return
once a call is shorter than the original context again.

The model config is updated so that ``save_pretrained`` writes native ``rope_parameters`` wherever
transformers implements the method (``ntk`` is written as a rewritten ``rope_theta``):
``max_position_embeddings`` becomes factor x original, except for ``dynamic_ntk``, where
transformers reads the original length from ``max_position_embeddings``, so it stays the original.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..config import PosEncConfig
from ..encodings import rope as R
from ..methods.remapped import KIND as ATTENTION
from ..methods.rope import SCALINGS, RopeScaling
from .base import Adapter, PatchRecord, text_config
from .consistent_cache import CacheWatcher, RecomputeAtSwitch, layers_of_type, rerotate_cache, watch
from .rope_native import native_mismatch, native_rope_parameters, softmax_rescalers
from .decoder_swaps import SWAPS, TABLE_NAME, apply_swap, resolve_swap
from .layout import RotarySlot, rope_geometry, rotary_slots
from .remapped import apply_remapped, resolve_remapped

logger = logging.getLogger(__name__)


class LengthAwareRope:
    """Forward pre-hook of one rotary module: recomputes the frequencies from the current length.

    ``scaling.dynamic == "grow"`` follows transformers' dynamic update: recompute when the length grows
    past the largest seen, return to the original frequencies when a call is shorter than the original
    context after having grown past it. ``"switch"`` (LongRoPE): the short or long set is picked per call. With a ``watcher`` (``cache="consistent"``), each change re-rotates the keys of the KV cache
    of the call in progress (those of ``layers``, None: all) to the new frequencies."""

    def __init__(self, scaling: RopeScaling, geom: R.RopeGeometry, cfg: PosEncConfig, slot: RotarySlot,
                 watcher: CacheWatcher | None = None, layers: list[int] | None = None):
        self.fn, self.grow_only = scaling.frequencies, scaling.dynamic == "grow"
        self.geom, self.cfg, self.slot, self.watcher, self.layers = geom, cfg, slot, watcher, layers
        self.cached = geom.original_max_position_embeddings
        self.current: int | None = None  # seq_len the module's frequencies were computed for

    def _set(self, module: nn.Module, seq_len: int | None, device, position_ids: torch.Tensor) -> None:
        old = (self.slot.get("inv_freq"), self.slot.get("attention_scaling"))
        inv_freq, attention = self.fn(self.geom, self.cfg.factor, self.cfg.params, seq_len=seq_len, device=device)
        name = self.slot.attr("inv_freq")
        setattr(module, name, inv_freq.to(device=device, dtype=getattr(module, name).dtype))
        setattr(module, self.slot.attr("attention_scaling"), attention)
        self.current = seq_len
        if self.watcher is not None and self.watcher.cache is not None:
            rerotate_cache(self.watcher.cache, self.layers, position_ids, old, (self.slot.get("inv_freq"), attention))

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        position_ids = kwargs["position_ids"] if "position_ids" in kwargs else args[1]
        device = self.slot.get("inv_freq").device
        seq_len = int(position_ids.max()) + 1
        L = self.geom.original_max_position_embeddings
        if self.grow_only:
            if seq_len > self.cached:
                self._set(module, seq_len, device, position_ids)
                self.cached = seq_len
            if seq_len < L and self.cached > L:
                self._set(module, None, device, position_ids)
                self.cached = L
        else:
            want = seq_len if seq_len > L else None
            if (want is None) != (self.current is None):
                self._set(module, want, device, position_ids)


class RopeDecoderAdapter(Adapter):
    name = "rope_decoder"
    model_types = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text")
    layered_types = ("gemma3_text",)  # per-layer-type RoPE: scalings and nope, no other swap yet
    kinds = frozenset({"rope", "none", ATTENTION})
    swaps = SWAPS  # away from RoPE (the sinusoid is registered as an "absolute" method)
    generic_note = ("and other decoders with standard rotary embeddings, flat or per-layer-type rope_parameters, "
                    "found generically")

    def extra_weights(self, model: nn.Module) -> list[str]:
        return [k for k in model.state_dict() if f"{TABLE_NAME}." in k]

    def takes_layer_types(self) -> bool:
        return True

    def families(self, spec) -> list[str]:
        found = super().families(spec)
        if (spec.name in self.swaps and spec.name != "nope") or spec.kind == ATTENTION:  # not on per-layer-type
            return [t for t in found if t not in self.layered_types]
        return found

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
            params = s.rope_parameters(config) if isinstance(rp, dict) and (s.layer_type is None or s.layer_type in rp) else None
            if not isinstance(params, dict) or "rope_theta" not in params:
                where = "rope_parameters" if s.layer_type is None else f"rope_parameters[{s.layer_type!r}]"
                raise ValueError(f"model_type={config.model_type!r}: {where} has no rope_theta (got {rp!r}).")
        if not layered and not all(isinstance(s.module.rope_type, str) for s in slots):
            raise ValueError(f"{type(slots[0].module).__name__} has an unexpected rope_type layout.")
        return slots

    @staticmethod
    def _per_type(cfg: PosEncConfig) -> bool:
        """Whether ``cfg`` changes chosen layer types only (``layer_types``): the scalings and ``nope``."""
        return cfg.spec.kind == "rope" or cfg.method == "nope"

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
            wanted = ["full_attention"] if "full_attention" in types and len(set(types)) > 1 else sorted(set(types))
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

    def resolve(self, model: nn.Module, cfg: PosEncConfig) -> PosEncConfig:
        slots = self._check_layout(model)
        config, prefix = text_config(model.config)
        layered = slots[0].layer_type is not None
        if layered and cfg.method in SWAPS and cfg.method != "nope":
            raise ValueError(f"{cfg.method!r} (a family swap) on per-layer-type RoPE (model_type="
                             f"{config.model_type!r}) is not supported yet; RoPE scalings and nope are.")
        if cfg.method in SWAPS and softmax_rescalers(model):
            raise ValueError(f"{cfg.method!r} (a family swap) on model_type={config.model_type!r}, whose attention scale "
                             "depends on its RoPE parameters, is not supported yet; RoPE scalings are.")
        if prefix and cfg.method in SWAPS:
            raise ValueError(f"{cfg.method!r} (a family swap) on a composite model ({model.config.model_type!r} with "
                             f"its language model in {prefix[:-1]}) is not supported yet; RoPE scalings are.")
        selected = self._selected(model, slots, cfg) if self._per_type(cfg) else slots
        rp0 = selected[0].rope_parameters(config)
        recorded = self.original_length(config, rp0)
        L = cfg.original_max_position_embeddings
        if L is None:
            if recorded is None:
                raise ValueError(
                    f"original_max_position_embeddings is missing: the config of model_type={config.model_type!r} "
                    "has no max_position_embeddings; pass original_max_position_embeddings=<trained context length>."
                )
            L = recorded
        elif recorded is not None and rp0.get("rope_type", "default") not in ("default",) and L != recorded:
            raise ValueError(
                f"original_max_position_embeddings={L} conflicts with the checkpoint, which records "
                f"{recorded} as its original context (rope_type={rp0.get('rope_type')!r}); "
                f"omit it or pass {recorded}."
            )
        elif recorded is not None and L > recorded:
            raise ValueError(
                f"original_max_position_embeddings={L} is larger than the model's max_position_embeddings={recorded}: "
                "the original context cannot exceed what the model supports; pass a value <= "
                f"{recorded} or omit it."
            )
        if cfg.method in SWAPS:
            resolved = resolve_swap(model, cfg, L)
            if layered:  # nope: the chosen types, recorded explicitly
                resolved.params["layer_types"] = sorted({s.layer_type for s in selected})
            return resolved
        if cfg.method == "none":  # the checkpoint as it is, its own scaling (Llama 3.1's, a YaRN config's) included
            return PosEncConfig("none", None, L, dict(cfg.params))
        if cfg.spec.kind == ATTENTION:
            return resolve_remapped(model, cfg, slots, L, prefix)
        params = dict(cfg.params)
        if layered and cfg.spec.kind == "rope":
            params["layer_types"] = sorted({s.layer_type for s in selected})
        for s in selected:
            geom = rope_geometry(config, L, s.rope_parameters(config))
            n = s.get("inv_freq").shape[-1]
            if n != geom.dim // 2:
                raise ValueError(
                    f"{type(s.module).__name__} holds {n} frequencies but head_dim x partial_rotary_factor gives "
                    f"{geom.dim // 2}: unsupported rotary layout for model_type={config.model_type!r}."
                )
            defaults = SCALINGS[cfg.method].defaults
            if defaults is not None:
                params = defaults(params, geom.dim // 2, cfg.factor)
            old = s.rope_parameters(config).get("rope_type", "default")
            if old != "default":
                logger.warning(
                    "model already uses rope_type=%r%s; hf_posenc replaces it with %r computed from rope_theta=%s and "
                    "original context %d.", old, f" for {s.layer_type}" if s.layer_type else "", cfg.method,
                    geom.base, L,
                )
        return PosEncConfig(cfg.method, cfg.factor if cfg.spec.uses_factor else None, L, params)

    def apply(self, model: nn.Module, cfg: PosEncConfig, record: PatchRecord) -> bool:
        slots = self._check_layout(model)
        if cfg.method in SWAPS:  # (nope on per-layer-type RoPE: the chosen types only)
            apply_swap(model, cfg, self._selected(model, slots, cfg) if self._per_type(cfg) else slots, record)
            return False
        if cfg.method == "none":
            return True
        if cfg.spec.kind == ATTENTION:
            apply_remapped(model, cfg, slots, record)
            return False
        config, prefix = text_config(model.config)
        selected = self._selected(model, slots, cfg) if self._per_type(cfg) else slots
        scaling = SCALINGS[cfg.method]
        natives, ours, watchers = {}, {}, {}
        for s in selected:
            m, base_rp = s.module, s.rope_parameters(config)
            geom = rope_geometry(config, cfg.original_max_position_embeddings, base_rp)
            device, dtype = s.get("inv_freq").device, s.get("inv_freq").dtype
            inv_freq, attention = scaling.frequencies(geom, cfg.factor, cfg.params, seq_len=None, device=device)
            record.set_attr(m, s.attr("inv_freq"), inv_freq.to(device=device, dtype=dtype))
            if isinstance(m._buffers.get(s.attr("original_inv_freq")), torch.Tensor):
                record.set_attr(m, s.attr("original_inv_freq"), inv_freq.clone().to(device=device, dtype=dtype))
            record.set_attr(m, s.attr("attention_scaling"), attention)
            if scaling.dynamic:
                consistent = cfg.params.get("cache") == "consistent"
                watcher = watch(model, m, record, watchers) if consistent else None
                hook = LengthAwareRope(scaling, geom, cfg, s, watcher, layers_of_type(config, s.layer_type))
                if consistent and scaling.dynamic == "switch" and "prepare_inputs_for_generation" not in model.__dict__:
                    record.set_attr(model, "prepare_inputs_for_generation",
                                    RecomputeAtSwitch(model, geom.original_max_position_embeddings))
                record.add_hook(m.register_forward_pre_hook(hook, with_kwargs=True))
            natives[s.layer_type] = native_rope_parameters(cfg, geom, base_rp)
            ours[s] = (inv_freq, attention)
        for s in selected:
            s.set_default_type(record)
        changes = {"max_position_embeddings": scaling.max_position(cfg.factor, cfg.original_max_position_embeddings)}
        record.set_config(prefix + "max_position_embeddings", changes["max_position_embeddings"])
        if any(n is None for n in natives.values()):
            return False
        base = config.rope_parameters
        changes["rope_parameters"] = natives[None] if None in natives else {**base, **natives}
        if hasattr(config, "original_max_position_embeddings"):  # Phi-3, DeepSeek-V3: transformers reads this one
            changes["original_max_position_embeddings"] = cfg.original_max_position_embeddings
        if hasattr(config, "head_dim") and config.head_dim is None:  # (Mixtral) transformers' scaled types read it
            changes["head_dim"] = config.hidden_size // config.num_attention_heads
        reason = native_mismatch(config, changes, ours)
        if reason:
            logger.warning("%s is not saved as native rope_parameters for model_type=%r: %s; hf_posenc.from_pretrained "
                           "re-applies it.", cfg.method, config.model_type, reason)
            self._rescale_softmax(model, {}, record)
            return False
        self._rescale_softmax(model, changes["rope_parameters"], record)
        for name, value in changes.items():
            if name != "max_position_embeddings" and value != getattr(config, name, None):
                record.set_config(prefix + name, value)
        return True

    @staticmethod
    def _rescale_softmax(model: nn.Module, rope_parameters: dict[str, Any], record: PatchRecord) -> None:
        """Attention modules whose softmax scale transformers derives from ``rope_parameters`` at build time
        (DeepSeek-V2/V3 and other MLA models: YaRN's ``mscale_all_dim`` squared) get the scale transformers
        would give them for the new parameters; ``{}`` (not native: our frequencies carry the whole
        temperature) gives the plain ``qk_head_dim ** -0.5``."""
        for m, fn in softmax_rescalers(model):
            record.set_attr(m, "scaling", fn(rope_parameters, m.qk_head_dim ** (-0.5)))
