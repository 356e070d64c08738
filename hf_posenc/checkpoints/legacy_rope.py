"""config.json's RoPE in transformers 4's spelling, beside transformers 5's ``rope_parameters``.

transformers 5 writes a model's RoPE only as ``rope_parameters``; transformers 4 (and every consumer pinned below
5: TGI, older engines and converters) reads ``rope_theta`` and ``rope_scaling`` and, finding neither, uses the class
defaults (base 10000, no scaling). :func:`legacy_keys` gives the keys that make transformers 4.57 compute what
transformers 5 computes from ``rope_parameters``, or the reason it cannot:

- ``rope_theta`` (and ``partial_rotary_factor``, which transformers 4 reads from the config itself);
- ``rope_scaling``: ``rope_parameters`` less ``rope_theta`` and ``partial_rotary_factor``, its type under both
  ``rope_type`` and ``type`` (the older spelling), or null for plain RoPE with no other key. transformers 5 reads a
  ``rope_scaling`` it finds as ``rope_parameters`` and takes ``rope_theta`` / ``partial_rotary_factor`` back from the
  config, so it builds the same RoPE from either form;
- longrope: ``original_max_position_embeddings`` at the config's top level when it differs from
  ``max_position_embeddings``: transformers 4.57 switches to the long factors past that field and derives the
  attention factor from ``max_position_embeddings / original_max_position_embeddings``.

Gemma 3's RoPE per layer type: transformers 4.57 reads its global layers' RoPE from ``rope_theta`` / ``rope_scaling``
and gives its sliding layers plain RoPE over ``rope_local_base_freq``; those three keys state it.

Refused (no keys written): a type transformers 4.57 does not have, other RoPE per layer type (or Gemma 3's with
scaled sliding layers), a longrope whose ``factor`` is not that ratio and has no ``attention_factor`` (transformers
4.57 would derive another attention factor), a yarn or llama3 without the knobs transformers 4.57 requires.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

V4_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")  # transformers 4.57's ROPE_INIT_FUNCTIONS
V4_KEYS = ("rope_theta", "rope_scaling")
MOVED = ("rope_theta", "partial_rotary_factor")  # in rope_parameters for transformers 5, on the config for 4
REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
            "longrope": ("short_factor", "long_factor")}
SUB_CONFIGS = ("text_config",)  # composite models: transformers 4 reads the language model's RoPE there
TRANSFORMERS4 = "transformers 4.57"
# model types whose transformers-4.57 config class takes a rope_scaling of exactly these keys, of that type alone
# (Phi3Config._rope_scaling_validation); the attention factor is then derived from the context ratio
_PHI3_KEYS = ("longrope", ("type", "short_factor", "long_factor"))
THREE_KEYS = {"phi3": _PHI3_KEYS, "phi4_multimodal": _PHI3_KEYS}
# per-layer-type RoPE transformers 4.57 reads: model_type -> (scaled type, plain type, the plain type's base key)
LAYERED = {"gemma3_text": ("full_attention", "sliding_attention", "rope_local_base_freq")}


@dataclass
class LegacyKeys:
    """The keys to add to config.json (``keys``, per sub-config path: ``""`` for the top level), or ``reason``, why
    transformers 4.57 would compute another RoPE from any keys (then ``keys`` is empty)."""
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    reason: str | None = None

    @property
    def written(self) -> bool:
        return self.reason is None and bool(self.keys)


def legacy_keys(config: dict[str, Any]) -> LegacyKeys:
    """The transformers-4 keys of ``config`` (a config.json as a dict), for it and its language model's
    sub-config; a model with no ``rope_parameters`` gets none and no reason (transformers 4 reads it the same)."""
    found = LegacyKeys()
    for path, sub in [("", config)] + [(f"{n}.", config[n]) for n in SUB_CONFIGS if isinstance(config.get(n), dict)]:
        if not isinstance(sub.get("rope_parameters"), dict):
            continue
        try:
            found.keys[path] = _flat_keys(sub)
        except ValueError as err:
            where = f" ({path[:-1]})" if path else ""
            return LegacyKeys(reason=f"{err}{where}")
    return found


def _flat_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of one config whose ``rope_parameters`` is one RoPE; a ValueError saying why transformers 4.57
    would compute another one."""
    rope = config["rope_parameters"]
    nested = sorted(k for k, v in rope.items() if isinstance(v, dict))
    if nested:
        return _layered_keys(config, rope, nested)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in V4_TYPES:
        raise ValueError(f"rope_type {rope_type!r}: {TRANSFORMERS4} computes {', '.join(V4_TYPES)} only")
    if "rope_theta" not in rope:
        raise ValueError(f"rope_parameters without rope_theta: {TRANSFORMERS4} would use its class default")
    missing = [k for k in REQUIRED.get(rope_type, ()) if rope.get(k) is None]
    if missing:
        raise ValueError(f"rope_type {rope_type!r} without {', '.join(missing)}, which {TRANSFORMERS4} requires")
    keys = {k: rope[k] for k in MOVED if k in rope}
    scaling = {k: v for k, v in rope.items() if k not in MOVED and k not in ("type", "rope_type")}
    plain = rope_type == "default" and not scaling  # other keys of a plain RoPE (Qwen2-VL's mrope_section) are kept
    keys["rope_scaling"] = None if plain else {**scaling, "rope_type": rope_type, "type": rope_type}
    if rope_type == "longrope":
        keys.update(_longrope_context(config, rope))
    if config.get("model_type") in THREE_KEYS and keys["rope_scaling"] is not None:
        keys["rope_scaling"] = _three_keys(config, rope, rope_type, keys)
    return keys


def _three_keys(config: dict[str, Any], rope: dict[str, Any], rope_type: str, keys: dict[str, Any]) -> dict[str, Any]:
    """The ``rope_scaling`` of a model whose transformers-4.57 config class takes exactly :data:`THREE_KEYS` (Phi-3):
    a longrope whose attention factor is the one transformers 4.57 derives from the context ratio; a ValueError
    otherwise."""
    taken, names = THREE_KEYS[config["model_type"]]
    cls = f"{TRANSFORMERS4}'s config of model_type={config['model_type']!r}"
    if rope_type != taken:
        raise ValueError(f"rope_type {rope_type!r}: {cls} takes a rope_scaling of type {taken} only")
    context = config.get("max_position_embeddings")
    original = keys.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings") or context
    ratio = context / original
    derived = 1.0 if ratio <= 1 else math.sqrt(1 + math.log(ratio) / math.log(original))
    own = rope.get("attention_factor")
    if own is not None and not math.isclose(float(own), derived, rel_tol=1e-9):
        raise ValueError(f"longrope with attention_factor {float(own):.6g}: {cls} takes a rope_scaling of "
                         f"{', '.join(names)} alone and derives the attention factor from max_position_embeddings / "
                         f"original_max_position_embeddings = {context} / {original}, giving {derived:.6g}")
    return {"type": taken, "short_factor": rope["short_factor"], "long_factor": rope["long_factor"]}


def _layered_keys(config: dict[str, Any], rope: dict[str, Any], nested: list[str]) -> dict[str, Any]:
    """The keys of a per-layer-type RoPE that transformers 4.57 spells its own way (Gemma 3: the global layers'
    RoPE as rope_theta / rope_scaling, the sliding layers' base as rope_local_base_freq); a ValueError otherwise."""
    spelled = LAYERED.get(config.get("model_type"))
    if spelled is None or set(nested) != {spelled[0], spelled[1]}:
        raise ValueError(f"RoPE per layer type ({', '.join(nested)}): {TRANSFORMERS4} reads one rope_theta and "
                         "rope_scaling for all layers")
    glob, local, key = spelled
    if rope[local].get("rope_type", "default") != "default" or set(rope[local]) - {"rope_type", "rope_theta"} \
            or "rope_theta" not in rope[local]:
        raise ValueError(f"RoPE per layer type with {local} RoPE {rope[local]}: {TRANSFORMERS4} computes plain RoPE "
                         f"over {key} there")
    return {**_flat_keys({**config, "rope_parameters": rope[glob]}), key: rope[local]["rope_theta"]}


def _longrope_context(config: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    """longrope's top-level ``original_max_position_embeddings`` where transformers 4.57 needs it; a ValueError when
    it would derive another attention factor than transformers 5."""
    context = config.get("max_position_embeddings")
    original = rope.get("original_max_position_embeddings") or context
    factor = rope.get("factor")
    ratio = context / original if context and original else None
    if original != context:
        if rope.get("attention_factor") is None and factor is not None and not math.isclose(factor, ratio):
            raise ValueError(f"longrope with factor {factor:g} and no attention_factor, while max_position_embeddings"
                             f" / original_max_position_embeddings = {context} / {original}: {TRANSFORMERS4} derives "
                             "its attention factor from that ratio, not from factor")
        return {"original_max_position_embeddings": original}
    if rope.get("attention_factor") is None and factor is None:
        raise ValueError(f"longrope with neither factor nor attention_factor: {TRANSFORMERS4} needs one of them when "
                         "max_position_embeddings is the original context")
    return {}


def with_legacy_keys(config: dict[str, Any], found: LegacyKeys) -> dict[str, Any]:
    """A copy of ``config`` with ``found``'s keys set (each sub-config's in it); ``config`` is left as it was."""
    out = dict(config)
    for path, keys in found.keys.items():
        if path:
            out[path[:-1]] = {**out.get(path[:-1], {}), **keys}
        else:
            out.update(keys)
    return out


def stated(config: dict[str, Any]) -> dict[str, Any] | None:
    """The transformers-4 keys ``config`` (one config, a language model's) carries when they state the RoPE of its
    ``rope_parameters`` (as :func:`legacy_keys` writes them); None when they are missing or say something else."""
    if not isinstance(config.get("rope_parameters"), dict):
        return None
    try:
        keys = _flat_keys(config)
    except ValueError:
        return None
    return keys if all(k in config and config[k] == v for k, v in keys.items()) else None
