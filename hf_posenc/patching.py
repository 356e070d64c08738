"""patch / unpatch / get_config: the one entry point, dispatching to the family adapters."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any

from torch import nn

from .adapters import PatchRecord, find_adapter
from .adapters.base import SavedAsOriginal
from .compat import warn_if_untested
from .config import CONFIG_KEY, PosEncConfig, as_config

_STATE = "_hf_posenc_record"


def holder(model: nn.Module) -> nn.Module:
    """The model a patch lives on: ``model`` itself, or the model a peft wrapper (LoRA, ...) wraps, whose record
    and hooks the wrapper computes with (``peft_model.get_base_model()``)."""
    peft = sys.modules.get("peft")  # not imported: no peft model exists
    if peft is not None and isinstance(model, peft.PeftModel):
        return model.get_base_model()
    return model


def _record(model: nn.Module) -> PatchRecord | None:
    return holder(model).__dict__.get(_STATE)


def get_config(model: nn.Module) -> PosEncConfig | None:
    """The PosEncConfig applied to ``model`` (resolved against it), or None if it is not patched."""
    rec = _record(model)
    return rec.config if rec is not None else None


def _apply(model: nn.Module, cfg: PosEncConfig) -> None:
    warn_if_untested()
    adapter = find_adapter(model, cfg.spec)
    if cfg.params.get("layer_types") is not None and not adapter.takes_layer_types():
        raise ValueError(f"layer_types={cfg.params['layer_types']!r}: it applies to decoders with per-layer-type RoPE "
                         f"(Gemma 3, OLMo 3, ...); model_type={model.config.model_type!r} has none. Omit it.")
    resolved = adapter.resolve(model, cfg)
    record = PatchRecord(model, resolved, adapter)
    try:
        record.isolate_config()
        native = adapter.apply(model, resolved, record)
        record.set_config(CONFIG_KEY, record.block(native))
        if not native and adapter.restores(record.block(native)):  # plain loaders get the unpatched model's fields
            record.set_attr(model, "save_pretrained", SavedAsOriginal(model, record))
    except BaseException:
        record.undo()
        raise
    model.__dict__[_STATE] = record


def adopt(model: nn.Module, cfg: PosEncConfig, block: dict, reapply: bool = False) -> nn.Module:
    """Mark a model loaded from a patched checkpoint whose weights already hold the patch (a resized or
    zeroed position table) as patched by ``cfg``; with ``reapply``, the patch's hooks are installed again
    (applying it to such weights changes none). It cannot be unpatched: the original weights are not in
    the checkpoint."""
    if reapply:
        _apply(model, cfg)
        record = _record(model)
    else:
        record = PatchRecord(model, cfg, find_adapter(model, cfg.spec))
        record.isolate_config()
        model.__dict__[_STATE] = record
    record.reversible = False
    record.set_config(CONFIG_KEY, dict(block))
    return model


def patch(model: nn.Module, method: Any, **kwargs: Any) -> nn.Module:
    """Change the positional encoding of ``model`` (or of the model a peft wrapper wraps) in place and return it.

    ``method`` is a method name (``hf_posenc.list_methods()``) with its knobs as keywords, a
    :class:`PosEncConfig`, or a dict of one. Only this instance changes. Patching a patched model
    starts again from the original, so patches never compound; if the new patch is refused, the
    previous one stays in place.

    >>> hf_posenc.patch(model, "yarn", factor=4.0)          # doctest: +SKIP
    >>> hf_posenc.patch(model, PosEncConfig("ntk", 2.0))    # doctest: +SKIP
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"patch() needs a transformers model (a torch.nn.Module), got {type(model).__name__}.")
    cfg = as_config(method, **kwargs)
    inner = holder(model)  # a peft model: the model it wraps
    previous = get_config(inner)
    if previous is not None:
        unpatch(inner)
    try:
        _apply(inner, cfg)
    except BaseException:
        if previous is not None:
            _apply(inner, previous)
        raise
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Restore the original positional encoding of ``model`` exactly; a no-op on an unpatched model
    returns it unchanged. A peft model's wrapped model is unpatched."""
    inner = holder(model)
    rec = inner.__dict__.get(_STATE)
    if rec is not None and not rec.reversible:
        raise ValueError(
            f"this model was loaded from a checkpoint saved after {rec.config.method!r}, whose weights hold the "
            "changed position table; the original table is not in it, so it cannot be unpatched or re-patched. "
            "Load the base model to start from the original.")
    inner.__dict__.pop(_STATE, None)
    if rec is not None:
        rec.undo()
    return model


def is_patched(model: nn.Module) -> bool:
    return _record(model) is not None


@contextmanager
def trying(model: nn.Module, configs: list[PosEncConfig]):
    """``with trying(model, configs):`` -- each config is applied once on entry, so that one that does not fit
    ``model`` fails before any work; inside, patch freely; on exit ``model`` is as it was (its own patch, if it
    had one, applied again)."""
    before = get_config(model)
    try:
        for cfg in configs:
            patch(model, cfg)
        yield model
    finally:
        unpatch(model)
        if before is not None:
            patch(model, before)
