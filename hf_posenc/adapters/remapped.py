"""The attention-level methods on RoPE decoders (``hf_posenc.methods.remapped``): checked against the model,
then applied by selecting the remapped-position attention function on this instance."""

from __future__ import annotations

from torch import nn

from ..config import PosEncConfig
from ..methods.remapped import REMAPPED
from .attention import check_attention, select
from .base import PatchRecord
from .layout import Layout, RotarySlot, attention_modules, body, head_dim, rope_geometry
from .remapped_attention import STATE_ATTR, RemapState, register
from .rope_native import softmax_rescalers


def resolve_remapped(model: nn.Module, cfg: PosEncConfig, slots: list[RotarySlot], L: int, prefix: str) -> PosEncConfig:
    """``cfg`` with the model-dependent defaults filled; a ValueError where the model cannot take it."""
    config, name = model.config, cfg.method
    if prefix or slots[0].layer_type is not None or len(slots) != 1:
        raise ValueError(f"{name} needs one plain RoPE for all layers; this model has per-layer-type or composite "
                         "RoPE (not supported yet).")
    rp = config.rope_parameters
    if rp.get("rope_type", "default") != "default" or abs(float(slots[0].get("attention_scaling")) - 1.0) > 0:
        raise ValueError(f"{name} works on the checkpoint's plain RoPE; this one uses rope_type={rp.get('rope_type')!r}. "
                         "Load it without the scaling, or use another method.")
    rotated = rope_geometry(config, L).dim
    if rotated != head_dim(config):
        raise ValueError(f"{name} needs RoPE on the whole head (partial_rotary_factor 1); this model rotates "
                         f"{rotated} of {head_dim(config)} dimensions.")
    window = getattr(config, "sliding_window", None)
    if window is not None or any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        raise ValueError(f"{name} replaces full attention; model_type={config.model_type!r} uses sliding-window "
                         f"attention (sliding_window={window!r}). Load it with sliding_window=None.")
    if softmax_rescalers(model):
        raise ValueError(f"{name} on model_type={config.model_type!r} is not supported.")
    check_attention(model, name)
    params = REMAPPED[name].defaults(dict(cfg.params), L)
    return PosEncConfig(name, None, L, params)


def apply_remapped(model: nn.Module, cfg: PosEncConfig, slots: list[RotarySlot], record: PatchRecord) -> None:
    method, L = REMAPPED[cfg.method], cfg.original_max_position_embeddings
    state = RemapState(method.scheme(cfg.params, L), slots[0].get("inv_freq"))
    record.add_hook(body(model).register_forward_pre_hook(state.body_hook, with_kwargs=True))
    record.add_hook(body(model).register_forward_hook(state.body_done, with_kwargs=True, always_call=True))
    select(model, record, state, attention_modules(model), register(), STATE_ATTR)
    record.set_config("max_position_embeddings", method.context(cfg.params, L))


class Remapped:
    """An attention-level method (``remapped``): the RoPE stays, the attention function changes."""

    def per_type(self, spec) -> bool:
        return False

    def on_layered(self, spec) -> bool:
        return False

    def resolve(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, L: int) -> PosEncConfig:
        return resolve_remapped(model, cfg, lay.slots, L, lay.prefix)

    def apply(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, record: PatchRecord) -> bool:
        apply_remapped(model, cfg, lay.slots, record)
        return False
