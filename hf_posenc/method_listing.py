"""list_methods(): what hf_posenc can do, and to which families."""

from __future__ import annotations

from typing import Any

from .adapters import ADAPTERS
from .methods import METHODS, REQUIRED


def list_methods() -> dict[str, dict[str, Any]]:
    """Every method hf_posenc knows.

    Returns:
        By canonical name: its aliases, a one-line summary, its knobs with defaults, the model families
        (``config.model_type``) it supports, whether ``hf-posenc tune`` has a grid for it, and what the serving
        engines are known to compute for it (``same``; ``within_original``: the same up to the original context).
    """
    out = {}
    for name, spec in sorted(METHODS.items()):
        families = list(dict.fromkeys(t for a in ADAPTERS for t in a.families(spec)))  # once each, tested first
        out[name] = {
            "aliases": list(spec.aliases),
            "summary": spec.summary,
            "kind": spec.kind,
            "takes_factor": spec.uses_factor,
            "params": {k: ("<required>" if v is REQUIRED else v) for k, v in spec.params.items()},
            "families": families,
            "tuned": spec.tune_grid is not None,  # hf-posenc tune has a grid for it
            "engines": {engine: support.computes for engine, support in spec.engines.items()},
        }
    return out
