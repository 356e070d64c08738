"""RoPE scalings on RoPE decoders (``methods.rope.SCALINGS``): the handler ``Scaled`` of ``rope_decoder``.

How a patch works: the rotary module of *this instance* gets the new ``inv_freq`` and
``attention_scaling`` computed by ``hf_posenc.encodings.rope``; its ``rope_type`` is set to
``"default"`` so that transformers' own dynamic update stays out of the way. Methods whose
frequencies depend on the sequence length (dynamic NTK, dynamic YaRN, LongRoPE) get a forward
pre-hook on that module instance which recomputes them from the current positions.

Length-dependent methods, per row and without history: each row of a forward call gets the frequencies of its
own length, ``max(position_ids[row]) + 1`` (a left-padded row: its real tokens), and nothing carries over from
one call to the next, so a row gives the same logits alone or in any batch, before or after any other input.
This departs from transformers' native ``"dynamic"`` type (which ``dynamic_ntk`` saves as), where the longest
row of the padded batch sets the frequencies of every row and grown frequencies stay until a call shorter than
the original context; both agree on a single unpadded call of a fresh model (tests/test_rope_parity.py), and a
saved ``dynamic_ntk`` checkpoint loads in plain transformers, which computes its own way. During ``generate``
each new token past the original context recomputes the frequencies for the grown length. With
``cache="stale"`` the keys already in the cache keep the rotation they were stored with (as transformers); with
``cache="consistent"`` (the default) they are re-rotated (``consistent_cache``); with ``cache="exact"``
``generate`` encodes the sequence again whenever they change (a cached loop written by hand cannot: warned once,
re-rotated).

The model config is updated so that ``save_pretrained`` writes native ``rope_parameters`` wherever
transformers implements the method (``ntk`` is written as a rewritten ``rope_theta``):
``max_position_embeddings`` becomes factor x original, except for ``dynamic_ntk``, where
transformers reads the original length from ``max_position_embeddings``, so it stays the original.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from torch import nn

from ..config import PosEncConfig
from ..encodings import rope as R
from ..methods.rope import SCALINGS, RopeScaling
from .base import PatchRecord
from .consistent_cache import CacheWatcher, RecomputeOnChange, rerotate_cache, rotated_layers, watch
from .layout import Layout, RotarySlot, checkpoint_context, rope_geometry, scaled_by
from .rope_compose import composed_config, kept_softmax_scale, restates_checkpoint, scaled_type, shrink_refusal
from .rope_native import native_mismatch, native_rope_parameters, softmax_rescalers
from .rotary_probe import check_reads_frequencies

logger = logging.getLogger(__name__)


class LengthAwareRope:
    """Forward hook of one rotary module (one slot): each row of a call gets the frequencies of its own length,
    ``max(position_ids[row]) + 1`` (a left-padded row those of its real tokens), and nothing is kept from one
    call to the next: the module keeps the frequencies set at patch time (those of the original context), and
    rows past it get their cos and sin computed again by the module with their own frequencies swapped in.

    With a ``watcher`` (``cache="consistent"`` or ``"exact"``), a call with a KV cache first re-rotates each row's
    cached keys (of ``layers``, None: all) from the frequencies of the row's cached length (``position_ids[row,
    0]``: a cache grown one call after another, as ``generate`` and a cached loop grow it) to those of its new
    length. ``regenerates``: ``generate`` re-encodes the sequence at each change instead (``RecomputeOnChange``),
    so a cached call that changes them is a hand-written loop: warned once, then re-rotated."""

    def __init__(self, scaling: RopeScaling, geom: R.RopeGeometry, cfg: PosEncConfig, slot: RotarySlot,
                 watcher: CacheWatcher | None = None, layers: dict | None = None, regenerates: bool = False,
                 record: PatchRecord | None = None):
        self.fn, self.grow = scaling.frequencies, scaling.dynamic == "grow"  # (fn: a module function, it pickles)
        self.geom, self.cfg, self.slot, self.watcher, self.layers = geom, cfg, slot, watcher, layers
        self.regenerates, self.record = regenerates, record

    @property
    def covered(self) -> bool:
        """Whether a patch went on top of this hook's own (a checkpoint's longrope under a composition): then the
        rotary module is that patch's, and this hook changes nothing."""
        return bool(getattr(getattr(self, "record", None), "covered", False))  # (a hook pickled without it)

    def key(self, n: int) -> int | None:
        """What the frequencies of a row of ``n`` tokens depend on: None within the original context."""
        L = self.geom.original_max_position_embeddings
        if n <= L:
            return None
        return n if self.grow else L + 1

    def frequencies(self, key: int | None) -> tuple[torch.Tensor, float]:
        """(inv_freq, attention_scaling) for a row of ``key`` (:meth:`key`), in the module's dtype and device."""
        here = self.slot.get("inv_freq")
        if key is None:
            return here, float(self.slot.get("attention_scaling"))
        inv_freq, attention = self.fn(self.geom, self.cfg.factor, self.cfg.params, seq_len=key, device=here.device)
        inv_freq = R.still_pairs(inv_freq, self.geom)  # (RopeScaling.computed's, inline)
        return inv_freq.to(device=here.device, dtype=here.dtype), float(attention)

    def changes(self, before: list[int], after: list[int]) -> bool:
        """Whether rows growing from ``before`` to ``after`` tokens get other frequencies (any row)."""
        if self.covered:
            return False
        for b, a in zip(before, after):
            kb, ka = self.key(b), self.key(a)
            if kb != ka:
                (inv_b, s_b), (inv_a, s_a) = self.frequencies(kb), self.frequencies(ka)
                if s_b != s_a or not torch.equal(inv_b, inv_a):
                    return True
        return False

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if self.covered or (self.slot.layer_type is not None
                            and _argument(args, kwargs, 2, "layer_type") != self.slot.layer_type):
            return None
        position_ids = _argument(args, kwargs, 1, "position_ids")
        lengths = _row_lengths(position_ids)
        if self.watcher is not None and self.watcher.cache is not None:
            self._follow_cache(self.watcher.cache, position_ids, lengths)
        keys = [self.key(n) for n in lengths]
        if all(k is None for k in keys):
            return None
        return self._per_row(module, args, kwargs, output, keys)

    def _per_row(self, module: nn.Module, args: tuple, kwargs: dict, output: Any, keys: list) -> tuple:
        """The module's (cos, sin) (Llama 4's one complex tensor) with the rows past the original context computed
        again, grouped by length."""
        x, position_ids = _argument(args, kwargs, 0, "x"), _argument(args, kwargs, 1, "position_ids")
        rest = {k: v for k, v in kwargs.items() if k not in ("x", "position_ids")}
        single = isinstance(output, torch.Tensor)  # Llama 4: one complex tensor, cos + i sin
        parts = [t.clone() for t in ((output,) if single else output)]
        groups: dict[Any, list[int]] = {}
        for r, k in enumerate(keys):
            if k is not None:
                groups.setdefault(k, []).append(r)
        axis = position_ids.dim() - 2  # the batch: [b, s], or MRoPE's [3, b, s]
        for k, rows in groups.items():
            whole = len(keys) == 1 or axis not in (0, 1)
            idx = torch.tensor(rows, device=position_ids.device)
            sub_x = x if whole or x.shape[0] != position_ids.shape[axis] else x[idx.to(x.device)]
            sub_pos = position_ids if whole else position_ids.index_select(axis, idx)
            with self._swapped(module, *self.frequencies(k)):
                got = module.forward(sub_x, sub_pos, *args[2:], **rest)
            if whole:
                return got
            for part, new in zip(parts, (got,) if single else got):
                part[idx.to(part.device)] = new
        return parts[0] if single else tuple(parts)

    @contextlib.contextmanager
    def _swapped(self, module: nn.Module, inv_freq: torch.Tensor, attention: float):
        names = self.slot.attr("inv_freq"), self.slot.attr("attention_scaling")
        kept = tuple(getattr(module, n) for n in names)
        try:
            setattr(module, names[0], inv_freq)
            setattr(module, names[1], attention)
            yield
        finally:
            setattr(module, names[0], kept[0])
            setattr(module, names[1], kept[1])

    def _follow_cache(self, cache: Any, position_ids: torch.Tensor, lengths: list[int]) -> None:
        """Re-rotate the cached keys of each row whose frequencies change in this call (warned once where
        ``generate`` would have re-encoded the sequence instead)."""
        if int(cache.get_seq_length()) == 0 or position_ids.dim() != 2:
            return
        cached = position_ids[:, 0].tolist()
        if not self.changes(cached, lengths):
            return
        if self.regenerates:
            self.watcher.warn_once(_hand_loop_warning(self.cfg))
        old = _stacked([self.frequencies(self.key(n)) for n in cached])
        new = _stacked([self.frequencies(self.key(n)) for n in lengths])
        rerotate_cache(cache, self.layers, position_ids, old, new)


def _row_lengths(position_ids: torch.Tensor) -> list[int]:
    """Each row's ``max(position) + 1``: of ``position_ids`` [b, s], or of MRoPE's [3, b, s] (a row's temporal,
    height and width positions together); one length for the whole call of any other shape."""
    if position_ids.dim() == 2:
        return (position_ids.amax(-1) + 1).tolist()
    if position_ids.dim() == 3:
        return (position_ids.amax(dim=(0, 2)) + 1).tolist()
    return [int(position_ids.max()) + 1]


def _argument(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return kwargs[name] if name in kwargs else (args[index] if len(args) > index else None)


def _stacked(freqs: list[tuple[torch.Tensor, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (inv_freq ``[b, rot / 2]``, attention_scaling ``[b]``) from one (inv_freq, scaling) per row."""
    return torch.stack([f for f, _ in freqs]), torch.tensor([s for _, s in freqs], dtype=torch.float64)


def _hand_loop_warning(cfg: PosEncConfig) -> str:
    switches = SCALINGS[cfg.method].dynamic == "switch"
    what = "it switches from the short to the long factors" if switches else "its frequencies change"
    return (f"hf_posenc {cfg.method} with cache={cfg.params.get('cache')!r}: a forward call with a KV cache passed "
            f"by hand went past the original context ({cfg.original_max_position_embeddings} tokens), where {what}. "
            "Only generate() re-encodes the sequence there; here the cached keys are re-rotated instead (the "
            "accuracy of cache='consistent': for dynamic NTK and YaRN several times closer to recomputing than "
            "stale keys, not equal past the first layer; far less for LongRoPE's switch). For exact logits, call "
            "model.generate(), or at each step past the original context call the model on the whole sequence "
            "without the cache. (Warned once per patched model.)")


def _check_layout(lay: Layout, L: int) -> None:
    """Refuses, by name, a rotary slot whose frequencies are not one per rotating pair of head_dim x
    partial_rotary_factor (MiMo-V2-Flash's; the zero-padded ``proportional`` RoPE of LFM3's full-attention layers),
    before a scaling or a composition reads them."""
    for s in lay.selected:
        rp = s.rope_parameters(lay.config)
        n, pairs = s.get("inv_freq").shape[-1], rope_geometry(lay.config, L, rp, s.layer_type).dim // 2
        if n != pairs:
            layers = f" for its {s.layer_type!r} layers" if s.layer_type else ""
            raise ValueError(
                f"{type(s.module).__name__} holds {n} frequencies{layers} (rope_type="
                f"{rp.get('rope_type', 'default')!r}) but head_dim x partial_rotary_factor gives {pairs}: unsupported "
                f"rotary layout for model_type={lay.config.model_type!r}.")


def _check_one_width(cfg: PosEncConfig, lay: Layout, L: int, per_pair: bool) -> None:
    """Refuses, by name, a scaling whose knobs hold one entry per rotary pair (``per_pair``: LongRoPE's factor
    lists) on layer types whose heads have different numbers of pairs (Gemma 4: 128 sliding, 256 full)."""
    pairs = {s.layer_type: rope_geometry(lay.config, L, s.rope_parameters(lay.config), s.layer_type).dim // 2
             for s in lay.selected}
    if per_pair and len(set(pairs.values())) > 1:
        raise ValueError(f"{cfg.method} gives one factor per rotary pair, and the layer types it would change have "
                         f"different numbers of pairs ({', '.join(f'{t}: {n}' for t, n in pairs.items())}); one list "
                         "cannot fit them all: give layer_types with one of them.")


class Scaled:
    """A RoPE scaling (``methods.rope.SCALINGS``): new frequencies on this instance's rotary module(s),
    a length-aware hook for the dynamic ones, native ``rope_parameters`` where transformers has them."""

    def per_type(self, spec) -> bool:
        return True

    def on_layered(self, spec) -> bool:
        return True

    def resolve(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, L: int) -> PosEncConfig:
        _check_layout(lay, L)
        check_reads_frequencies(lay.selected, lay.config, cfg.method)
        if cfg.original_max_position_embeddings is None and scaled_type(lay) is not None:
            return composed_config(cfg, lay)  # extends from the checkpoint's current scaling, never replaces it
        params = dict(cfg.params)
        if lay.layered:
            params["layer_types"] = lay.chosen_types()
        defaults = SCALINGS[cfg.method].defaults
        _check_one_width(cfg, lay, L, defaults is not None)
        replaced = []  # (own rope_type, layer type, base): said once the patch is known not to be refused
        for s in lay.selected:
            rp = s.rope_parameters(lay.config)
            geom = rope_geometry(lay.config, L, rp, s.layer_type)
            if defaults is not None:
                params = defaults(params, geom.dim // 2, cfg.factor)
            old = scaled_by(rp)
            if old is not None and cfg.asked is None and not restates_checkpoint(cfg, lay):  # (asked: re-applied)
                replaced.append((old, s.layer_type, geom.base))
        resolved = PosEncConfig(cfg.method, cfg.factor if cfg.spec.uses_factor else None, L, params)
        _refuse_shrink(resolved, lay)
        for old, layer_type, base in replaced:
            logger.warning(
                "model already uses rope_type=%r%s; hf_posenc replaces it with %r computed from rope_theta=%s and "
                "original context %d, as original_max_position_embeddings asks%s.", old,
                f" for {layer_type}" if layer_type else "", cfg.method, base, L, _advertised_less(resolved, lay))
        return resolved

    def apply(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, record: PatchRecord) -> bool:
        scaling = SCALINGS[cfg.method]
        natives, ours, watchers = {}, {}, []
        for s in lay.selected:
            rp = s.rope_parameters(lay.config)
            geom = rope_geometry(lay.config, cfg.original_max_position_embeddings, rp, s.layer_type)
            ours[s] = self._set_frequencies(s, scaling, geom, cfg, record)
            if scaling.dynamic:
                self._hook(model, lay, s, scaling, geom, cfg, record, watchers)
            natives[s.layer_type] = native_rope_parameters(cfg, geom, rp)
        for s in lay.selected:
            s.set_default_type(record)
        kept = kept_softmax_scale(model, cfg, lay)  # (before the config advertises the new length)
        length = scaling.max_position(cfg.factor, cfg.original_max_position_embeddings)
        record.set_config(lay.prefix + "max_position_embeddings", length)
        if any(n is None for n in natives.values()):
            return False
        natives = {t: {**n, **kept} for t, n in natives.items()}
        return self._save_native(model, cfg, lay, natives, ours, length, record, keeps_scale=bool(kept))

    @staticmethod
    def _set_frequencies(s: RotarySlot, scaling: RopeScaling, geom: R.RopeGeometry, cfg: PosEncConfig,
                         record: PatchRecord) -> tuple[torch.Tensor, float]:
        m, device, dtype = s.module, s.get("inv_freq").device, s.get("inv_freq").dtype
        inv_freq, attention = scaling.computed(geom, cfg.factor, cfg.params, seq_len=None, device=device)
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
        layers = rotated_layers(model, lay.config, s, s.get("inv_freq"), mode) if watcher is not None else None
        regenerates = mode == "exact" or (mode == "consistent" and scaling.dynamic == "switch")
        hook = LengthAwareRope(scaling, geom, cfg, s, watcher, layers, regenerates, record)
        if regenerates:
            recompute = model.__dict__.get("prepare_inputs_for_generation")
            if not isinstance(recompute, RecomputeOnChange) or recompute.record is not record:  # (not one below's)
                recompute = RecomputeOnChange(model, [], record)
                record.set_attr(model, "prepare_inputs_for_generation", recompute)
            recompute.hooks.append(hook)
        record.add_hook(s.module.register_forward_hook(hook, with_kwargs=True))

    @staticmethod
    def _save_native(model: nn.Module, cfg: PosEncConfig, lay: Layout, natives: dict, ours: dict, length: int,
                     record: PatchRecord, keeps_scale: bool) -> bool:
        """Writes the native ``rope_parameters`` (and what transformers reads beside them) into the config,
        where transformers rebuilds exactly our frequencies from them; returns whether it did. ``keeps_scale``: a
        composition on MLA, whose softmax scale stays the checkpoint's either way."""
        config = lay.config
        changes: dict[str, Any] = {}
        changes["rope_parameters"] = natives[None] if None in natives else {**config.rope_parameters, **natives}
        if hasattr(config, "original_max_position_embeddings"):  # Phi-3, DeepSeek-V3: transformers reads this one
            changes["original_max_position_embeddings"] = cfg.original_max_position_embeddings
        if not getattr(config, "is_heterogeneous", False) and hasattr(config, "head_dim") and config.head_dim is None:
            # (Mixtral) transformers' scaled types read it; a config that sets it per layer (Gemma 4) holds it there
            changes["head_dim"] = config.hidden_size // config.num_attention_heads
        reason = native_mismatch(config, {**changes, "max_position_embeddings": length}, ours)
        if reason:
            logger.warning("%s is not saved as native rope_parameters for model_type=%r: %s; hf_posenc.from_pretrained "
                           "re-applies it.", cfg.method, config.model_type, reason)
            if not keeps_scale:  # (a composition on MLA keeps the checkpoint's own scale)
                rescale_softmax(model, {}, record)
            return False
        rescale_softmax(model, changes["rope_parameters"], record)
        for name, value in changes.items():
            if value != getattr(config, name, None):
                record.set_config(lay.prefix + name, value)
        return True


def _refuse_shrink(cfg: PosEncConfig, lay: Layout) -> None:
    """A scaling that replaces the checkpoint's own must not advertise less than the checkpoint does now."""
    now, own = checkpoint_context(lay), scaled_type(lay)
    if own is None or not isinstance(now, int):
        return
    why = shrink_refusal(cfg, now, own)
    if why:
        spec = SCALINGS[cfg.method]
        raise ValueError(f"{why} to replace it, or drop original_max_position_embeddings to extend from its current "
                         f"context (x{cfg.factor:g} -> {spec.max_position(cfg.factor, now):,} tokens).")


def _advertised_less(cfg: PosEncConfig, lay: Layout) -> str:
    """What a replacing scaling that keeps its original context as the advertised one (dynamic NTK) gives up, said
    beside the replacement: '' when it advertises no fewer tokens than the checkpoint does now."""
    now = checkpoint_context(lay)
    after = SCALINGS[cfg.method].max_position(cfg.factor, cfg.original_max_position_embeddings)
    if not isinstance(now, int) or after >= now:
        return ""
    return (f"; it advertises {after:,} tokens where the checkpoint advertises {now:,}, and inputs up to "
            f"{cfg.original_max_position_embeddings:,} tokens take the unscaled frequencies")


def rescale_softmax(model: nn.Module, rope_parameters: dict[str, Any], record: PatchRecord) -> None:
    """Attention modules whose softmax scale transformers derives from ``rope_parameters`` at build time
    (DeepSeek-V2/V3 and other MLA models: YaRN's ``mscale_all_dim`` squared) get the scale transformers
    would give them for the new parameters; ``{}`` (not native: our frequencies carry the whole
    temperature) gives the plain ``qk_head_dim ** -0.5``."""
    for m, fn in softmax_rescalers(model):
        record.set_attr(m, "scaling", fn(rope_parameters, m.qk_head_dim ** (-0.5)))
