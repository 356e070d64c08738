"""Encoder-decoders with T5's relative-position buckets: T5, mT5, UMT5.

``max_distance`` raises ``relative_attention_max_distance`` (module attributes and config) by the
factor, so plain transformers loads it identically. ``bucket_scale`` gives each attention module of
*this instance* its own ``_relative_position_bucket`` (an instance attribute shadowing the class's
method), which divides relative positions by the factor before T5's own bucketing; it is not
expressible in transformers' config, so ``hf_posenc.from_pretrained`` re-applies it on load.
Both apply to every relative bias the model computes: encoder self-attention, and decoder
self-attention (cross-attention has no position bias in T5). The ``alibi``, ``rope`` and ``nope``
swaps are in ``encoder_swaps.py``.
"""

from __future__ import annotations

from torch import nn

from ..config import PosEncConfig
from ..encodings import t5_buckets as B
from .base import Adapter, PatchRecord
from .encoder_swaps import apply_t5_swap


def bucket_modules(model: nn.Module) -> list[nn.Module]:
    """Attention modules that bucket relative positions (they hold the bucket settings)."""
    return [m for m in model.modules()
            if hasattr(m, "relative_attention_num_buckets") and hasattr(m, "relative_attention_max_distance")
            and hasattr(m, "_relative_position_bucket")]


class ScaledBuckets:
    """A per-module ``_relative_position_bucket`` with relative positions divided by ``factor``.
    Accepts both call styles: T5/mT5 pass the settings, UMT5 reads them from the module."""

    def __init__(self, module: nn.Module, factor: float):
        self.module = module
        self.factor = factor

    def __call__(self, relative_position, bidirectional=None, num_buckets=None, max_distance=None):
        m = self.module
        return B.relative_position_bucket(
            B.scaled_relative_positions(relative_position, self.factor),
            bidirectional=(not m.is_decoder) if bidirectional is None else bidirectional,
            num_buckets=m.relative_attention_num_buckets if num_buckets is None else num_buckets,
            max_distance=m.relative_attention_max_distance if max_distance is None else max_distance,
        )


def _scale_max_distance(model: nn.Module, mods: list[nn.Module], cfg: PosEncConfig, record: PatchRecord) -> bool:
    new = int(round(model.config.relative_attention_max_distance * cfg.factor))
    for m in mods:
        record.set_attr(m, "relative_attention_max_distance", new)
    record.set_config("relative_attention_max_distance", new)
    return True  # a config field: plain transformers rebuilds it


def _scale_buckets(model: nn.Module, mods: list[nn.Module], cfg: PosEncConfig, record: PatchRecord) -> bool:
    for m in mods:
        record.set_attr(m, "_relative_position_bucket", ScaledBuckets(m, cfg.factor))
    return False


# each bucket method: applies itself, returns whether plain transformers rebuilds it from the config
BUCKET_METHODS = {"max_distance": _scale_max_distance, "bucket_scale": _scale_buckets}


class T5RelativeAdapter(Adapter):
    name = "t5_relative"
    model_types = ("t5", "mt5", "umt5")
    kinds = frozenset({"relative_bucket", "none"})
    swaps = ("alibi", "rope", "nope")  # encoder_swaps.py

    def matches(self, model: nn.Module) -> bool:
        return bool(bucket_modules(model)) and hasattr(model.config, "relative_attention_max_distance")

    def resolve(self, model: nn.Module, cfg: PosEncConfig) -> PosEncConfig:
        if not bucket_modules(model):
            raise ValueError(f"{type(model).__name__} has no relative-position bucket attention to patch.")
        L = cfg.original_max_position_embeddings
        if cfg.params.get("max_position_embeddings") is not None:
            raise ValueError("T5-style models have no length-sized position weights: leave max_position_embeddings "
                             "unset.")
        if L is not None:
            raise ValueError("T5-style models have no fixed context length; leave original_max_position_embeddings "
                             f"unset (got {L}).")
        return PosEncConfig(cfg.method, cfg.factor if cfg.spec.uses_factor else None, None, dict(cfg.params))

    def apply(self, model: nn.Module, cfg: PosEncConfig, record: PatchRecord) -> bool:
        mods = bucket_modules(model)
        if cfg.method in self.swaps:
            apply_t5_swap(model, cfg, record)
            return False
        return BUCKET_METHODS[cfg.method](model, mods, cfg, record) if cfg.spec.kind != "none" else True
