"""Methods on absolute position tables (learned, as in BERT; or the fixed sinusoid)."""

from __future__ import annotations

from typing import Any

from .spec import MethodSpec, positive_number, register_method


def _check_alpha(factor: float, p: dict[str, Any]) -> None:
    alpha = p["alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be a number strictly between 0 and 1, got {alpha!r}.")


def check_sinusoid(factor: float, p: dict[str, Any]) -> None:
    """The knobs of a (scaled) sinusoid: ``base`` > 0, ``scale`` > 0 or None (matched to the model)."""
    positive_number("base", p["base"])
    positive_number("scale", p.get("scale"), allow_none=True)


register_method(MethodSpec(
    "interpolate", "absolute",
    "Learned position table resampled to factor x its length (linear, position-interpolation mapping p -> p/factor).",
    aliases=("table_interpolation",)))
register_method(MethodSpec(
    "hierarchical", "absolute",
    "Hierarchical decomposition of a learned table (Su 2020): the first n positions unchanged, up to n^2 positions.",
    params={"alpha": 0.4}, check=_check_alpha))
register_method(MethodSpec(
    "sinusoidal", "absolute",
    "The fixed sinusoid of Vaswani et al. 2017: in place of a learned table (factor x its length), or added to a "
    "RoPE decoder's input embeddings in place of RoPE.",
    aliases=("sinusoid",), params={"base": 10000.0, "scale": None}, check=check_sinusoid, default_factor=1.0))
