"""The context length of a model, in one place: what it takes now, and what it was trained for."""

from __future__ import annotations

from ..adapters.layout import served_context
from ..adapters.learned_absolute import table_positions
from ..patching import get_config


def context_length(model) -> int | None:
    """Tokens the (patched) model takes: its learned table's positions (without RoBERTa's padding rows), else
    the language model's ``max_position_embeddings``; None when it has neither (T5's relative buckets)."""
    n = table_positions(model)
    if n is not None:
        return n
    n = served_context(model.config)
    return int(n) if n else None


def original_context(model) -> int | None:
    """The context length the model was trained for (before any hf_posenc patch: a checkpoint saved with a RoPE
    scaling, its pretraining context, which evaluations measure past; an unpatched one whose RoPE is scaled, the
    context that scaling serves: ``adapters.layout.current_context``, which a patch extends from); None when the
    family has no fixed one (T5's relative buckets)."""
    cfg = get_config(model)
    if cfg is not None and cfg.original_max_position_embeddings:
        return cfg.original_max_position_embeddings
    return served_context(model.config)
