"""Which attention layers an attention-level method computes, and with which RoPE: every full-attention layer,
with the frequencies of its own rotary slot (a per-layer-type model's ``full_attention`` set, else the model's
one set: scaled or not) on the dimensions that slot rotates (the first ``2 * len(inv_freq)`` of the head; the
last ones under MLA, after the ``qk_nope_head_dim`` part that carries no position). A ``hybrid`` layer (Falcon-H1,
ZAYA: a recurrent or convolution state beside full attention in one layer) is computed as a full-attention one, its
state left to the model. Sliding-window and chunked layers are left to the model's own attention (a window or a
chunk never sees a distance past its width), and so are layers without RoPE (SmolLM3's and Llama 4's NoPE layers,
``no_rope_layers``: the model rotates nothing there, so there is no position to remap).

Before anything is changed, each (attention class, rotary slot) pair is checked to compose as the method needs:
the model's own rotation at ``p`` turned further by ``d`` equals its rotation at ``p + d`` (a rotary layout of
interleaved pairs, GLM's and Cohere's, would not; refused by name). Frequencies that transformers recomputes
with the input's length (``dynamic``, ``longrope``) are pinned to the checkpoint's own for inputs up to its
original context: the method keeps every relative position below it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .attention_probe import check_turns
from .base import text_config
from .layout import RotarySlot, decoder_layers, layer_modules, nope_layers
from .remapped_attention import TABLES_ATTR
from .remapped_keys import RotationTables
from .rotary_layout import HALF, first_rotated, key_layout, rotates, twin_flags

FULL, SLIDING = "full_attention", "sliding_attention"
# layer types whose attention is full and causal: a hybrid layer holds a linear-attention state beside it
FULL_TYPES = (FULL, "hybrid")
# layer types whose attention never sees a distance past a window (a chunk: Llama 4's chunked layers)
WINDOWED = (SLIDING, "chunked_attention", "hybrid_sliding")
ATTENDING = FULL_TYPES + WINDOWED
# layer types that read no RoPE position (a recurrent state, a convolution): left to the model, as NoPE layers are
POSITION_FREE = ("linear_attention", "conv")
LENGTH_DEPENDENT_TYPES = ("dynamic", "longrope")  # rope types whose frequencies follow the input's length


@dataclass(frozen=True)
class LayerPlan:
    """Per attention module (in layer order), the RoPE slot the method computes it with (None: left alone)."""

    modules: list[nn.Module | None]  # None: a layer without attention (POSITION_FREE)
    slots: list[RotarySlot | None]

    def computed(self) -> frozenset[int]:
        """The indices of the layers (and of their KV cache layers) the method computes."""
        return frozenset(i for i, s in enumerate(self.slots) if s is not None)

    def used_slots(self) -> list[RotarySlot]:
        return list(dict.fromkeys(s for s in self.slots if s is not None))

    def attention(self) -> list[nn.Module]:
        """The attention modules (the method's function serves them: computed, or delegated to the model's own)."""
        return [m for m in self.modules if m is not None]


def layer_types(config: Any, n: int) -> list[str]:
    """The attention type of each of ``n`` layers: the config's ``layer_types``, else every layer sliding where
    the config names a sliding window (Mistral) and full otherwise."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    return [SLIDING if getattr(config, "sliding_window", None) is not None else FULL] * n


def declared_computed(config: Any, n: int | None = None) -> tuple[list[str], list[bool]]:
    """From the config alone (``explain``): each layer's attention type, and whether an attention-level method
    computes it (full attention, not declared NoPE in ``no_rope_layers``, in a config that states a RoPE at all --
    Kimi Linear's MLA layers have none; EXAONE 4's and Cohere 2's global NoPE layers are found only on the model, by
    :func:`layer_plan`)."""
    n = n or int(getattr(config, "num_hidden_layers", 0) or 0)
    types, nope = layer_types(config, n), set(nope_layers(config, n))
    rope = getattr(config, "rope_parameters", None) is not None or getattr(config, "rope_theta", None) is not None
    return types, [rope and t in FULL_TYPES and i not in nope for i, t in enumerate(types)]


def probed_computed(config: Any) -> tuple[list[str], list[bool]]:
    """:func:`declared_computed`, each layer then run in a narrow twin of the model (:func:`rotary_layout.twin_flags`)
    to see whether it rotates (EXAONE 4's and Cohere 2's global NoPE layers); the declared answer alone where no twin
    can be built or its layers do not match the declared ones."""
    types, computed = declared_computed(config)
    flags = twin_flags(config)
    if flags is None or len(flags) != len(types):
        return types, computed
    return types, [c and f for c, f in zip(computed, flags)]


def computed_layers(model: nn.Module) -> tuple[list[str], list[bool]]:
    """On a model an attention-level method patched: each layer's attention type, and whether the method computes
    it (its attention module holds the method's rotation tables)."""
    modules = layer_modules(model)
    computed = [m is not None and m.__dict__.get(TABLES_ATTR) is not None for m in modules]
    return layer_types(text_config(model.config)[0], len(modules)), computed


def layer_plan(model: nn.Module, config: Any, slots: list[RotarySlot], name: str) -> LayerPlan:
    """The plan of ``name`` on ``model``; a ValueError naming what it cannot serve."""
    types = layer_types(config, len(decoder_layers(model)))
    other = sorted(set(types) - set(ATTENDING) - set(POSITION_FREE))
    if other:  # before the attention modules: a linear-attention layer has none
        raise ValueError(f"{name} computes full-attention layers ({', '.join(FULL_TYPES)}) and leaves windowed "
                         f"({', '.join(WINDOWED)}) and position-free ({', '.join(POSITION_FREE)}) ones alone; "
                         f"model_type={config.model_type!r} has layers of type {other}, which it does not serve.")
    modules = [m if t in ATTENDING else None for m, t in zip(layer_modules(model), types)]
    missing = [i for i, (m, t) in enumerate(zip(modules, types)) if m is None and t in ATTENDING]
    if missing:
        raise ValueError(f"{name}: model_type={config.model_type!r} has no self_attn module in its attention layers "
                         f"{missing}; this model is not supported.")
    if not any(t in FULL_TYPES for t in types):
        raise ValueError(f"{name} replaces full attention; model_type={config.model_type!r} has none (its layers: "
                         f"{sorted(set(types))}; {_windows(config)}), so it has nothing to extend: a window never "
                         "sees a distance past its width. Load it with sliding_window=None to make them full.")
    plan = [slot_of(slots, config, t, name) if t in FULL_TYPES else None for t in types]
    plan = [s if s is not None and m is not None and rotates(m, s, config) else None for m, s in zip(modules, plan)]
    if all(s is None for s in plan):
        full = [i for i, t in enumerate(types) if t in FULL_TYPES]
        declared = getattr(config, "no_rope_layers", None)
        why = ("NoPE: no_rope_layers is 0 there" if declared else
               "NoPE: a probe of each one found its queries and keys turned by no position")
        windowed = sorted(set(types) & set(WINDOWED))
        rest = (f"; its {', '.join(windowed)} layers never see a distance past their window ({_windows(config)})"
                if windowed else "")
        raise ValueError(f"{name} remaps the RoPE positions of full-attention layers; every full-attention layer of "
                         f"model_type={config.model_type!r} (layers {full}) rotates nothing ({why}), so it has "
                         f"nothing to extend{rest}.")
    return LayerPlan(modules, plan)


def _windows(config: Any) -> str:
    """The window widths the config states (``sliding_window``, ``attention_chunk_size``), as a phrase."""
    said = [f"{k}={getattr(config, k)!r}" for k in ("sliding_window", "attention_chunk_size")
            if getattr(config, k, None) is not None]
    return ", ".join(said) or "no window stated"


def slot_of(slots: list[RotarySlot], config: Any, layer_type: str, name: str) -> RotarySlot:
    """The rotary slot a layer of ``layer_type`` uses: its own in a per-layer-type module, else the model's one."""
    if slots[0].layer_type is None:
        if len(slots) != 1:
            raise ValueError(f"{name} needs one rotary embedding per layer type; model_type={config.model_type!r} "
                             f"has {len(slots)} rotary modules.")
        return slots[0]
    found = [s for s in slots if s.layer_type == layer_type]
    if not found:
        raise ValueError(f"{name}: model_type={config.model_type!r} has no RoPE for its {layer_type!r} layers; "
                         f"its RoPE layer types: {sorted(s.layer_type for s in slots)}.")
    return found[0]


def own_frequencies(slot: RotarySlot, config: Any) -> torch.Tensor:
    """The frequencies the checkpoint rotates with for inputs up to its original context: its rotary slot's
    (scaled ones included), the original set of a length-dependent type."""
    if slot.rope_parameters(config).get("rope_type", "default") in LENGTH_DEPENDENT_TYPES:
        held = getattr(slot.module, slot.attr("original_inv_freq"), None)
        if isinstance(held, torch.Tensor):
            return held
    return slot.get("inv_freq")


def rotation_tables(plan: LayerPlan, config: Any, scheme, name: str) -> list[RotationTables | None]:
    """Per attention module, the tables it rotates with (one per slot and rotated part, shared by its layers),
    each pair of attention class and slot checked first (:func:`check_rotation`); None for a layer left alone."""
    made: dict[tuple, RotationTables] = {}
    out = []
    for attn, slot in zip(plan.modules, plan.slots):
        if slot is None:
            out.append(None)
            continue
        key = (slot, first_rotated(attn), type(attn))
        if key not in made:
            inv_freq = own_frequencies(slot, config)
            check_rotation(attn, slot, config, inv_freq, name)
            made[key] = RotationTables(scheme, inv_freq, first_rotated(attn))
        out.append(made[key])
    return out


def check_rotation(attn: nn.Module, slot: RotarySlot, config: Any, inv_freq: torch.Tensor, name: str) -> None:
    """A ValueError unless ``attn``'s own RoPE composes with a further turn in the rotate-half layout (the one the
    methods turn queries and keys in: :func:`rotary_layout.key_layout`), on dimensions that fit the head, and its
    queries and keys are still that rotation where its attention function receives them (:mod:`attention_probe`)."""
    if key_layout(attn, slot, config, inv_freq, name).pairs != HALF:
        raise ValueError(f"{name} turns queries and keys further in the rotate-half layout with the model's own "
                         f"frequencies; {type(attn).__name__}'s RoPE (apply_rotary_pos_emb) does not compose that way "
                         "(it rotates interleaved pairs): this model is not supported.")
    check_turns(attn, slot, config, inv_freq, HALF, ("queries", "keys"), name)


def pin_frequencies(plan: LayerPlan, config: Any, record) -> None:
    """Slots whose frequencies transformers recomputes with the input's length keep the checkpoint's own for inputs
    up to its original context (recorded: ``unpatch`` gives the length-dependent ones back)."""
    for slot in plan.used_slots():
        if slot.rope_parameters(config).get("rope_type", "default") in LENGTH_DEPENDENT_TYPES:
            record.set_attr(slot.module, slot.attr("inv_freq"), own_frequencies(slot, config).clone())
            slot.set_default_type(record)


def layers_note(types: list[str], computed: list[bool]) -> str | None:
    """The sentence ``explain`` and the card give of the layers an attention-level method leaves to the model
    (``types``: each layer's attention type; ``computed``: whether the method computes it), or None where it
    computes every layer."""
    n = len(types)
    if not n or all(computed):
        return None
    left = {"sliding-window": [i for i, t in enumerate(types) if t in (SLIDING, "hybrid_sliding")],
            "chunked-attention": [i for i, t in enumerate(types) if t == "chunked_attention"],
            "NoPE (no RoPE)": [i for i, t in enumerate(types) if t in FULL_TYPES and not computed[i]],
            "position-free (linear-attention, convolution)": [i for i, t in enumerate(types) if t in POSITION_FREE],
            "other-type": [i for i, t in enumerate(types) if t not in (*ATTENDING, *POSITION_FREE)]}
    other = sorted(set(types) - set(ATTENDING) - set(POSITION_FREE))
    if other:  # what layer_plan refuses: the full-attention layers it would have computed are named too
        left["full-attention"] = [i for i, t in enumerate(types) if t in FULL_TYPES and computed[i]]
    parts = [f"{len(v)} {what} layer{'s' * (len(v) > 1)} ({', '.join(map(str, v))})" for what, v in left.items() if v]
    if other:
        return (f"it would compute none of the {n} layers ({' and '.join(parts)}): hf_posenc.patch refuses it on this "
                f"model, whose layers of type {other} it does not serve")
    if not any(computed):
        return (f"it would compute none of the {n} layers ({' and '.join(parts)}): hf_posenc.patch refuses it on this "
                "model, which has no full-attention layer with RoPE")
    return (f"it computes {sum(computed)} of the {n} layers (the full-attention layers with RoPE); the model's own "
            f"attention runs the others, as they are: {' and '.join(parts)}")
