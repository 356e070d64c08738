"""Which attention layers an attention-level method computes, and with which RoPE: every full-attention layer,
with the frequencies of its own rotary slot (a per-layer-type model's ``full_attention`` set, else the model's
one set: scaled or not) on the dimensions that slot rotates (the first ``2 * len(inv_freq)`` of the head; the
last ones under MLA, after the ``qk_nope_head_dim`` part that carries no position). Sliding-window layers are
left to the model's own attention (a window never sees a position past its width), and so are layers without RoPE
(SmolLM3's and Llama 4's NoPE layers, ``no_rope_layers``: the model rotates nothing there, so there is no position
to remap).

Before anything is changed, each (attention class, rotary slot) pair is checked to compose as the method needs:
the model's own rotation at ``p`` turned further by ``d`` equals its rotation at ``p + d`` (a rotary layout of
interleaved pairs, GLM's and Cohere's, would not; refused by name). Frequencies that transformers recomputes
with the input's length (``dynamic``, ``longrope``) are pinned to the checkpoint's own for inputs up to its
original context: the method keeps every relative position below it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .layout import RotarySlot, attention_modules, head_dim, nope_layers, rotates
from .remapped_keys import RotationTables, turned

FULL, SLIDING = "full_attention", "sliding_attention"
LENGTH_DEPENDENT_TYPES = ("dynamic", "longrope")  # rope types whose frequencies follow the input's length


@dataclass(frozen=True)
class LayerPlan:
    """Per attention module (in layer order), the RoPE slot the method computes it with (None: left alone)."""

    modules: list[nn.Module]
    slots: list[RotarySlot | None]

    def computed(self) -> frozenset[int]:
        """The indices of the layers (and of their KV cache layers) the method computes."""
        return frozenset(i for i, s in enumerate(self.slots) if s is not None)

    def used_slots(self) -> list[RotarySlot]:
        return list(dict.fromkeys(s for s in self.slots if s is not None))


def layer_types(config: Any, n: int) -> list[str]:
    """The attention type of each of ``n`` layers: the config's ``layer_types``, else every layer sliding where
    the config names a sliding window (Mistral) and full otherwise."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    return [SLIDING if getattr(config, "sliding_window", None) is not None else FULL] * n


def layers_left(config: Any, n: int | None = None) -> dict[str, list[int]]:
    """The layers an attention-level method leaves to the model, from the config alone (what ``explain`` and the
    card say): ``sliding_attention`` and ``no_rope`` indices (a NoPE sliding layer counted as sliding)."""
    n = n or int(getattr(config, "num_hidden_layers", 0) or 0)
    types = layer_types(config, n)
    sliding = [i for i, t in enumerate(types) if t == SLIDING]
    return {"sliding_attention": sliding, "no_rope": [i for i in nope_layers(config, n) if i not in sliding]}


def layer_plan(model: nn.Module, config: Any, slots: list[RotarySlot], name: str) -> LayerPlan:
    """The plan of ``name`` on ``model``; a ValueError naming what it cannot serve."""
    modules = attention_modules(model)
    types = layer_types(config, len(modules))
    other = sorted(set(types) - {FULL, SLIDING})
    if other:
        raise ValueError(f"{name} computes full-attention layers and leaves sliding-window ones alone; "
                         f"model_type={config.model_type!r} has layers of type {other}, which it does not serve.")
    if FULL not in types:
        window = getattr(config, "sliding_window", None)
        raise ValueError(f"{name} replaces full attention; model_type={config.model_type!r} uses sliding-window "
                         f"attention (sliding_window={window!r}) on every layer, where it has nothing to extend. "
                         "Load it with sliding_window=None.")
    computed = [t == FULL and rotates(m) for m, t in zip(modules, types)]
    if not any(computed):
        raise ValueError(f"{name} remaps the RoPE positions of full-attention layers; every full-attention layer of "
                         f"model_type={config.model_type!r} is a NoPE layer (no_rope_layers="
                         f"{getattr(config, 'no_rope_layers', None)!r}), so it has nothing to extend.")
    return LayerPlan(modules, [slot_of(slots, config, t, name) if c else None for t, c in zip(types, computed)])


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


def first_rotated(attn: nn.Module) -> int:
    """The first head dimension RoPE rotates: after MLA's ``qk_nope_head_dim`` position-free part, else 0."""
    return int(attn.qk_nope_head_dim) if hasattr(attn, "qk_rope_head_dim") else 0


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
    """A ValueError unless ``attn``'s own RoPE (its modeling file's rotation with ``slot``'s cos and sin) at
    position 3, turned further by 5 in the rotate-half layout, is its RoPE at position 8, on dimensions that fit
    the head."""
    rot, first = 2 * inv_freq.shape[-1], first_rotated(attn)
    width = getattr(attn, "qk_head_dim", None) or getattr(attn, "head_dim", None) or head_dim(config)
    if first + rot > width:
        raise ValueError(f"{name}: {type(attn).__name__} rotates {rot} dimensions from {first} of a {width}-dimension "
                         "head; this layout is not supported.")
    what = "apply_rotary_pos_emb_interleave" if getattr(config, "rope_interleave", False) else "apply_rotary_pos_emb"
    apply = getattr(sys.modules.get(type(attn).__module__), what, None)
    if apply is None:
        raise ValueError(f"{name}: the modeling file of {type(attn).__name__} has no {what} to check its rotary layout "
                         "by; this model is not supported.")
    x = torch.randn(1, 1, 1, rot, generator=torch.Generator().manual_seed(0)).expand(1, 1, 2, rot).to(inv_freq.device)
    pos = torch.tensor([[3, 8]], device=inv_freq.device)
    with torch.no_grad():
        cos, sin = slot.module(x, pos, *(() if slot.layer_type is None else (slot.layer_type,)))
        rotated, _ = apply(x, x, cos, sin)
        again = turned(rotated[:, :, :1].float(), torch.tensor([5], device=x.device), inv_freq.float())
    if not torch.allclose(again, rotated[:, :, 1:].float(), atol=1e-4, rtol=1e-4):
        raise ValueError(f"{name} turns queries and keys further in the rotate-half layout with the model's own "
                         f"frequencies; {type(attn).__name__}'s RoPE ({what}) does not compose that way (a layout of "
                         "interleaved pairs?): this model is not supported.")


def pin_frequencies(plan: LayerPlan, config: Any, record) -> None:
    """Slots whose frequencies transformers recomputes with the input's length keep the checkpoint's own for inputs
    up to its original context (recorded: ``unpatch`` gives the length-dependent ones back)."""
    for slot in plan.used_slots():
        if slot.rope_parameters(config).get("rope_type", "default") in LENGTH_DEPENDENT_TYPES:
            record.set_attr(slot.module, slot.attr("inv_freq"), own_frequencies(slot, config).clone())
            slot.set_default_type(record)


def layers_note(config: Any) -> str | None:
    """The sentence ``explain`` and the card give of the layers an attention-level method leaves to the model
    (from the config alone), or None where it computes every layer."""
    n = int(getattr(config, "num_hidden_layers", 0) or 0)
    left = layers_left(config, n)
    if not n or not any(left.values()):
        return None
    parts = [f"{len(v)} {what} layer{'s' * (len(v) > 1)} ({', '.join(map(str, v))})" for what, v in
             (("sliding-window", left["sliding_attention"]), ("NoPE (no RoPE)", left["no_rope"])) if v]
    nope = set(left["no_rope"])
    computed = sum(t == FULL and i not in nope for i, t in enumerate(layer_types(config, n)))
    return (f"it computes {computed} of the {n} layers (the full-attention layers with RoPE); the model's own "
            f"attention runs the others, as they are: {' and '.join(parts)}")
