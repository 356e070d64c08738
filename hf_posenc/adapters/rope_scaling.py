"""RoPE scalings on RoPE decoders (``methods.rope.SCALINGS``): the handler ``Scaled`` of ``rope_decoder``.

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
with ``cache="consistent"`` (the default) they are re-rotated (``consistent_cache``); with ``cache="exact"``
``generate`` encodes the sequence again whenever they change. Recomputation
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
from ..methods.rope import SCALINGS, RopeScaling
from .base import PatchRecord
from .consistent_cache import CacheWatcher, RecomputeOnChange, layers_of_type, rerotate_cache, watch
from .layout import Layout, RotarySlot, rope_geometry
from .rope_native import native_mismatch, native_rope_parameters, softmax_rescalers

logger = logging.getLogger(__name__)


class LengthAwareRope:
    """Forward pre-hook of one rotary module: recomputes the frequencies from the current length.

    ``scaling.dynamic == "grow"`` follows transformers' dynamic update: recompute when the length grows
    past the largest seen, return to the original frequencies when a call is shorter than the original
    context after having grown past it. ``"switch"`` (LongRoPE): the short or long set is picked per call.
    With a ``watcher`` (``cache="consistent"``), each change re-rotates the keys of the KV cache of the call
    in progress (those of ``layers``, None: all) to the new frequencies."""

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

    def would_change(self, seq_len: int) -> bool:
        """Whether a forward call whose longest row is ``seq_len`` long changes the frequencies."""
        L = self.geom.original_max_position_embeddings
        if self.grow_only:
            return seq_len > self.cached or (seq_len < L and self.cached > L)
        return (seq_len > L) != (self.current is not None)

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


class Scaled:
    """A RoPE scaling (``methods.rope.SCALINGS``): new frequencies on this instance's rotary module(s),
    a length-aware hook for the dynamic ones, native ``rope_parameters`` where transformers has them."""

    def per_type(self, spec) -> bool:
        return True

    def on_layered(self, spec) -> bool:
        return True

    def resolve(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, L: int) -> PosEncConfig:
        params = dict(cfg.params)
        if lay.layered:
            params["layer_types"] = lay.chosen_types()
        defaults = SCALINGS[cfg.method].defaults
        for s in lay.selected:
            rp = s.rope_parameters(lay.config)
            geom = rope_geometry(lay.config, L, rp)
            n = s.get("inv_freq").shape[-1]
            if n != geom.dim // 2:
                raise ValueError(
                    f"{type(s.module).__name__} holds {n} frequencies but head_dim x partial_rotary_factor gives "
                    f"{geom.dim // 2}: unsupported rotary layout for model_type={lay.config.model_type!r}."
                )
            if defaults is not None:
                params = defaults(params, geom.dim // 2, cfg.factor)
            old = rp.get("rope_type", "default")
            if old != "default":
                logger.warning(
                    "model already uses rope_type=%r%s; hf_posenc replaces it with %r computed from rope_theta=%s and "
                    "original context %d.", old, f" for {s.layer_type}" if s.layer_type else "", cfg.method,
                    geom.base, L,
                )
        return PosEncConfig(cfg.method, cfg.factor if cfg.spec.uses_factor else None, L, params)

    def apply(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, record: PatchRecord) -> bool:
        scaling = SCALINGS[cfg.method]
        natives, ours, watchers = {}, {}, []
        for s in lay.selected:
            rp = s.rope_parameters(lay.config)
            geom = rope_geometry(lay.config, cfg.original_max_position_embeddings, rp)
            ours[s] = self._set_frequencies(s, scaling, geom, cfg, record)
            if scaling.dynamic:
                self._hook(model, lay, s, scaling, geom, cfg, record, watchers)
            natives[s.layer_type] = native_rope_parameters(cfg, geom, rp)
        for s in lay.selected:
            s.set_default_type(record)
        length = scaling.max_position(cfg.factor, cfg.original_max_position_embeddings)
        record.set_config(lay.prefix + "max_position_embeddings", length)
        if any(n is None for n in natives.values()):
            return False
        return self._save_native(model, cfg, lay, natives, ours, length, record)

    @staticmethod
    def _set_frequencies(s: RotarySlot, scaling: RopeScaling, geom: R.RopeGeometry, cfg: PosEncConfig,
                         record: PatchRecord) -> tuple[torch.Tensor, float]:
        m, device, dtype = s.module, s.get("inv_freq").device, s.get("inv_freq").dtype
        inv_freq, attention = scaling.frequencies(geom, cfg.factor, cfg.params, seq_len=None, device=device)
        record.set_attr(m, s.attr("inv_freq"), inv_freq.to(device=device, dtype=dtype))
        if isinstance(m._buffers.get(s.attr("original_inv_freq")), torch.Tensor):
            record.set_attr(m, s.attr("original_inv_freq"), inv_freq.clone().to(device=device, dtype=dtype))
        record.set_attr(m, s.attr("attention_scaling"), attention)
        return inv_freq, attention

    @staticmethod
    def _hook(model: nn.Module, lay: Layout, s: RotarySlot, scaling: RopeScaling, geom: R.RopeGeometry,
              cfg: PosEncConfig, record: PatchRecord, watchers: list) -> None:
        mode = cfg.params.get("cache")
        watcher = watch(model, s.module, record, watchers) if mode in ("consistent", "exact") else None
        layers = layers_of_type(lay.config, s.layer_type)
        hook = LengthAwareRope(scaling, geom, cfg, s, watcher, layers)
        if mode == "exact" or (mode == "consistent" and scaling.dynamic == "switch"):
            recompute = model.__dict__.get("prepare_inputs_for_generation")
            if not isinstance(recompute, RecomputeOnChange):
                recompute = RecomputeOnChange(model, [])
                record.set_attr(model, "prepare_inputs_for_generation", recompute)
            recompute.hooks.append(hook)
        record.add_hook(s.module.register_forward_pre_hook(hook, with_kwargs=True))

    @staticmethod
    def _save_native(model: nn.Module, cfg: PosEncConfig, lay: Layout, natives: dict, ours: dict, length: int,
                     record: PatchRecord) -> bool:
        """Writes the native ``rope_parameters`` (and what transformers reads beside them) into the config,
        where transformers rebuilds exactly our frequencies from them; returns whether it did."""
        config = lay.config
        changes: dict[str, Any] = {}
        changes["rope_parameters"] = natives[None] if None in natives else {**config.rope_parameters, **natives}
        if hasattr(config, "original_max_position_embeddings"):  # Phi-3, DeepSeek-V3: transformers reads this one
            changes["original_max_position_embeddings"] = cfg.original_max_position_embeddings
        if hasattr(config, "head_dim") and config.head_dim is None:  # (Mixtral) transformers' scaled types read it
            changes["head_dim"] = config.hidden_size // config.num_attention_heads
        reason = native_mismatch(config, {**changes, "max_position_embeddings": length}, ours)
        if reason:
            logger.warning("%s is not saved as native rope_parameters for model_type=%r: %s; hf_posenc.from_pretrained "
                           "re-applies it.", cfg.method, config.model_type, reason)
            rescale_softmax(model, {}, record)
            return False
        rescale_softmax(model, changes["rope_parameters"], record)
        for name, value in changes.items():
            if value != getattr(config, name, None):
                record.set_config(lay.prefix + name, value)
        return True


def rescale_softmax(model: nn.Module, rope_parameters: dict[str, Any], record: PatchRecord) -> None:
    """Attention modules whose softmax scale transformers derives from ``rope_parameters`` at build time
    (DeepSeek-V2/V3 and other MLA models: YaRN's ``mscale_all_dim`` squared) get the scale transformers
    would give them for the new parameters; ``{}`` (not native: our frequencies carry the whole
    temperature) gives the plain ``qk_head_dim ** -0.5``."""
    for m, fn in softmax_rescalers(model):
        record.set_attr(m, "scaling", fn(rope_parameters, m.qk_head_dim ** (-0.5)))
