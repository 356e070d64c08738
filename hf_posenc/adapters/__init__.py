"""Family adapters, found by ``config.model_type`` first and by what the model contains second."""

from __future__ import annotations

from torch import nn

from ..config import FAMILIES
from ..methods import METHODS, MethodSpec
from .base import Adapter, PatchRecord
from .learned_absolute import LearnedAbsoluteAdapter
from .rope_decoder import RopeDecoderAdapter
from .t5_relative import T5RelativeAdapter

ADAPTERS: list[Adapter] = [RopeDecoderAdapter(), LearnedAbsoluteAdapter(), T5RelativeAdapter()]
FAMILIES[:] = [a.name for a in ADAPTERS]  # what a stored block may name (hf_posenc.config reads it, below this package)


def _describe_supported() -> str:
    parts = []
    for a in ADAPTERS:
        parts.append(f"{a.name}: {', '.join(a.model_types)}" + (f" ({a.generic_note})" if a.generic_note else ""))
    return "; ".join(parts)


def find_adapter(model: nn.Module, spec: MethodSpec) -> Adapter:
    """The adapter for ``model`` that takes ``spec``; a ValueError naming what is supported otherwise."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no `.config`: hf_posenc patches transformers models only.")
    candidates = [a for a in ADAPTERS if model_type in a.model_types] or [a for a in ADAPTERS if a.matches(model)]
    if not candidates:
        raise ValueError(
            f"unsupported architecture: model_type={model_type!r} ({type(model).__name__}). "
            f"Supported families: {_describe_supported()}."
        )
    for adapter in candidates:
        if adapter.accepts(spec) and adapter.matches(model):
            return adapter
    takes = sorted({a.name for a in candidates})
    raise ValueError(
        f"method {spec.name!r} ({spec.kind}) does not apply to model_type={model_type!r}, "
        f"which hf_posenc handles as {takes}; methods for it: {', '.join(methods_for(candidates[0]))}."
    )


def methods_for(adapter: Adapter) -> list[str]:
    return sorted(name for name, spec in METHODS.items() if adapter.accepts(spec))


__all__ = ["ADAPTERS", "Adapter", "PatchRecord", "find_adapter", "methods_for"]
