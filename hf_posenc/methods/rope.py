"""The RoPE methods: their knobs, defaults and checks, and the frequency function of each."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..encodings import rope as R
from . import MethodSpec, check_layer_types, positive_number, register_method


def _check_yarn(factor: float, p: dict[str, Any]) -> None:
    positive_number("beta_fast", p["beta_fast"])
    positive_number("beta_slow", p["beta_slow"])
    if p["beta_fast"] <= p["beta_slow"]:
        raise ValueError(f"beta_fast must be greater than beta_slow, got beta_fast={p['beta_fast']}, beta_slow={p['beta_slow']}.")
    for key in ("attention_factor", "mscale", "mscale_all_dim", "attn_factor"):
        if key in p:
            positive_number(key, p[key], allow_none=True)
    if "truncate" in p and not isinstance(p["truncate"], bool):
        raise ValueError(f"truncate must be True or False, got {p['truncate']!r}.")
    if "finetuned" in p and not isinstance(p["finetuned"], bool):
        raise ValueError(f"finetuned must be True or False, got {p['finetuned']!r}.")


def _check_llama3(factor: float, p: dict[str, Any]) -> None:
    positive_number("low_freq_factor", p["low_freq_factor"])
    positive_number("high_freq_factor", p["high_freq_factor"])
    if p["high_freq_factor"] <= p["low_freq_factor"]:
        raise ValueError(
            f"high_freq_factor must be greater than low_freq_factor, got high_freq_factor={p['high_freq_factor']}, "
            f"low_freq_factor={p['low_freq_factor']}."
        )


def _check_longrope(factor: float, p: dict[str, Any]) -> None:
    for key in ("short_factor", "long_factor"):
        value = p[key]
        if value is None:
            continue
        if not isinstance(value, (list, tuple)) or not value:
            raise ValueError(f"{key} must be a non-empty list of numbers > 0 (one per rotary frequency), got {value!r}.")
        for x in value:
            positive_number(f"every entry of {key}", x)
    positive_number("attention_factor", p["attention_factor"], allow_none=True)


# Each RoPE method: its spec, and the frequency function (``hf_posenc.encodings.rope``) it runs.
ROPE_FUNCTIONS = {}
# Methods whose frequencies depend on the current sequence length (recomputed in the forward pass).
DYNAMIC = {"dynamic_ntk", "dynamic_yarn", "longrope"}


def _add(spec: MethodSpec, fn) -> None:
    if spec.kind == "rope":  # every scaling takes layer_types: which RoPE of a per-layer-type model it changes
        own = spec.check

        def check(factor: float, p: dict[str, Any]) -> None:
            check_layer_types(p["layer_types"])
            if own is not None:
                own(factor, p)

        spec = dataclasses.replace(spec, params={**spec.params, "layer_types": None}, check=check)
    register_method(spec)
    ROPE_FUNCTIONS[spec.name] = fn


# "none" is its own kind: every adapter takes it (the unchanged model, as a baseline)
_add(MethodSpec("none", "none", "No change: the checkpoint's own positions (a baseline).", uses_factor=False), R.rope_none)
_add(MethodSpec("pi", "rope", "Position interpolation: every frequency divided by factor (Chen et al. 2023).",
                aliases=("linear",)), R.rope_linear)
_add(MethodSpec("ntk", "rope", "Static NTK-aware scaling: rope_theta' = rope_theta * factor^(d/(d-2)).",
                aliases=("ntk_aware", "static_ntk")), R.rope_ntk)
_add(MethodSpec("dynamic_ntk", "rope", "Dynamic NTK: the base grows with the current length once it exceeds the original context.",
                aliases=("dynamic",)), R.rope_dynamic_ntk)
_add(MethodSpec("yarn", "rope", "YaRN: NTK-by-parts interpolation plus attention temperature (Peng et al. 2023).",
                params={"beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None, "mscale": None,
                        "mscale_all_dim": None, "truncate": True},
                check=_check_yarn), R.rope_yarn)
_add(MethodSpec("dynamic_yarn", "rope", "Dynamic YaRN: YaRN with scale = current length / original context (jquesnelle/yarn).",
                params={"beta_fast": 32.0, "beta_slow": 1.0, "attn_factor": 1.0, "finetuned": False},
                check=_check_yarn), R.rope_dynamic_yarn)
_add(MethodSpec("llama3", "rope", "Llama 3.1 wavelength-band smoothing of PI.",
                params={"low_freq_factor": 1.0, "high_freq_factor": 4.0}, check=_check_llama3), R.rope_llama3)
_add(MethodSpec("longrope", "rope", "LongRoPE per-dimension rescale factors (short/long lists; default: PI-like uniform lists).",
                params={"short_factor": None, "long_factor": None, "attention_factor": None},
                check=_check_longrope), R.rope_longrope)
