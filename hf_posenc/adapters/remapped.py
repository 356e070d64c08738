"""The attention-level methods on RoPE decoders (``hf_posenc.methods.remapped``): checked against the model,
then applied by selecting the remapped-position attention function on this instance.

Methods marked ``any_rope`` (every built-in one: Self-Extend, DCA, ReRoPE, leaky ReRoPE, STRING) run on every layout
:mod:`remapped_layers` plans: a checkpoint's scaled RoPE (its own frequencies and attention factor), per-layer-type
RoPE, partial rotary, MLA, sliding/full hybrids (full-attention layers only) and head widths that differ between
layer types (Gemma 4: each layer's own, its full layers' proportional RoPE turning its first pairs only). A method
registered without it needs one plain RoPE on the whole head of full-attention layers."""

from __future__ import annotations

from torch import nn

from ..config import PosEncConfig
from ..methods.remapped import REMAPPED
from .attention import check_attention, select
from .base import PatchRecord
from .held_checks import HeldChecks
from .layout import Layout, RotarySlot, body, head_dim, rope_geometry
from .mrope import is_mrope
from .multimodal_inputs import media_takers
from .remapped_attention import STATE_ATTR, TABLES_ATTR, RemapState, eager_function, register
from .remapped_layers import layer_plan, pin_frequencies, rotation_tables
from .rope_native import softmax_rescalers

# The plan and rotation tables ``resolve_remapped`` checked, per model, for the ``apply_remapped`` that follows it
# (the NoPE probe of each layer and the rotation checks run once per patch).
_PLANS = HeldChecks()


def _proven() -> str:
    return ", ".join(sorted(name for name, method in REMAPPED.items() if method.any_rope)) or "none"


def check_plain_rope(model: nn.Module, name: str, slots: list[RotarySlot], L: int, prefix: str) -> None:
    """A ValueError unless ``model`` has one plain RoPE on the whole head and full attention on every layer: what
    the methods not marked ``any_rope`` are proven on."""
    config, proven = model.config, _proven()
    if prefix or slots[0].layer_type is not None or len(slots) != 1:
        raise ValueError(f"{name} needs one plain RoPE for all layers; this model has per-layer-type or composite "
                         f"RoPE (supported for {proven}).")
    rp = config.rope_parameters
    if rp.get("rope_type", "default") != "default" or abs(float(slots[0].get("attention_scaling")) - 1.0) > 0:
        raise ValueError(f"{name} works on the checkpoint's plain RoPE; this one uses "
                         f"rope_type={rp.get('rope_type')!r}. Load it without the scaling, or use another method "
                         f"({proven} take it).")
    rotated = rope_geometry(config, L).dim
    if rotated != head_dim(config):
        raise ValueError(f"{name} needs RoPE on the whole head (partial_rotary_factor 1); this model rotates "
                         f"{rotated} of {head_dim(config)} dimensions ({proven} take it).")
    window = getattr(config, "sliding_window", None)
    if window is not None or any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        raise ValueError(f"{name} replaces full attention; model_type={config.model_type!r} uses sliding-window "
                         f"attention (sliding_window={window!r}). Load it with sliding_window=None.")
    if softmax_rescalers(model):
        raise ValueError(f"{name} on model_type={config.model_type!r} is not supported ({proven} are).")


def resolve_remapped(model: nn.Module, cfg: PosEncConfig, lay: Layout, L: int) -> PosEncConfig:
    """``cfg`` with the model-dependent defaults filled; a ValueError where the model cannot take it."""
    name = cfg.method
    if not REMAPPED[name].any_rope:
        check_plain_rope(model, name, lay.slots, L, lay.prefix)
    impl = check_attention(model, name)
    params = REMAPPED[name].defaults(dict(cfg.params), L)
    plan = layer_plan(model, lay.config, lay.slots, name)
    tables = rotation_tables(plan, lay.config, REMAPPED[name].scheme(params, L), name)  # checks each layer's rotation
    _PLANS.hold(model, (name, L, params), (plan, tables))
    kept = [m for m, s in zip(plan.modules, plan.slots) if s is None and m is not None]
    if kept and impl == "eager" and eager_function(kept[0]) is None:
        raise ValueError(f"{name} leaves the sliding-window and NoPE layers to the model's eager attention, but the "
                         f"modeling file of {type(kept[0]).__name__} has no eager_attention_forward; load it with "
                         "attn_implementation='sdpa'.")
    return PosEncConfig(name, None, L, params)


def apply_remapped(model: nn.Module, cfg: PosEncConfig, lay: Layout, record: PatchRecord) -> None:
    method, L = REMAPPED[cfg.method], cfg.original_max_position_embeddings
    plan, tables = _PLANS.take(model, (cfg.method, L, cfg.params), lambda: _planned(model, cfg, lay))
    delegate = check_attention(model, cfg.method)
    layers = None if all(t is not None for t in tables) else plan.computed()
    state = RemapState(method.scheme(cfg.params, L), layers=layers, delegate=delegate, mrope=is_mrope(lay))
    pin_frequencies(plan, lay.config, record)
    inner = body(model)
    record.add_hook(inner.register_forward_pre_hook(state.body_hook, with_kwargs=True))
    record.add_hook(inner.register_forward_hook(state.body_done, with_kwargs=True, always_call=True))
    for outer in media_takers(model, inner):  # the model, and its base model called alone (Gemma3Model)
        record.add_hook(outer.register_forward_pre_hook(state.inputs_hook, with_kwargs=True))
    for attn, table in zip(plan.modules, tables):
        if attn is not None:
            record.set_attr(attn, TABLES_ATTR, table)
    select(model, record, state, plan.attention(), register(), STATE_ATTR)
    record.set_config("max_position_embeddings", method.context(cfg.params, L))


def _planned(model: nn.Module, cfg: PosEncConfig, lay: Layout) -> tuple:
    """The layer plan and rotation tables of ``cfg`` on ``model`` (each layer's rotation checked)."""
    plan = layer_plan(model, lay.config, lay.slots, cfg.method)
    scheme = REMAPPED[cfg.method].scheme(cfg.params, cfg.original_max_position_embeddings)
    return plan, rotation_tables(plan, lay.config, scheme, cfg.method)


class Remapped:
    """An attention-level method (``remapped``): the RoPE stays, the attention function changes."""

    def per_type(self, spec) -> bool:
        return False

    def on_layered(self, spec) -> bool:
        return REMAPPED[spec.name].any_rope

    def resolve(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, L: int) -> PosEncConfig:
        return resolve_remapped(model, cfg, lay, L)

    def apply(self, model: nn.Module, cfg: PosEncConfig, lay: Layout, record: PatchRecord) -> bool:
        apply_remapped(model, cfg, lay, record)
        return False
