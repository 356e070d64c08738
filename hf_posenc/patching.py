"""patch / unpatch / get_config: the one entry point, dispatching to the family adapters."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any

from torch import nn

from .adapters import PatchRecord, find_adapter
from .adapters.base import SavedAsOriginal
from .checkpoints.compat import warn_if_untested
from .config import CONFIG_KEY, PosEncConfig, as_config

_STATE = "_hf_posenc_record"


OWN_WEIGHTS = "hf_posenc_"  # the prefix of weights a patch adds (the learned swap's table)


def holder(model: nn.Module) -> nn.Module:
    """The model a patch lives on: ``model`` itself, or the model a peft wrapper (LoRA, ...) wraps, whose record
    and hooks the wrapper computes with (``peft_model.get_base_model()``)."""
    peft = sys.modules.get("peft")  # not imported: no peft model exists
    if peft is not None and isinstance(model, peft.PeftModel):
        return model.get_base_model()
    return model


def _record(model: nn.Module) -> PatchRecord | None:
    return holder(model).__dict__.get(_STATE)


def held_modules(model: nn.Module) -> dict[int, str]:
    """The modules that the model's hf_posenc patch hooks, changed an attribute of, or keeps a reference to (in a
    hook's state): ``id(module) -> what``. peft must not replace these (a LoRA layer wraps the module, a
    ``modules_to_save`` copy stands in for it): the patch would act on the frozen original."""
    record = _record(model)
    if record is None:
        return {}
    method = record.config.method
    owners = {}
    for m in model.modules():
        for hooks in (m._forward_hooks, m._forward_pre_hooks):
            owners[id(hooks)] = m
    held: dict[int, str] = {}
    for kind, *step in record._undo:
        if kind == "hook":
            handle = step[0]
            hooks = handle.hooks_dict_ref()
            if hooks is None or handle.id not in hooks:
                continue
            owner = owners.get(id(hooks))
            if owner is not None:
                held[id(owner)] = f"{method} hooks it"
            hook = hooks[handle.id]
            state = getattr(hook, "__self__", hook)
            for value in getattr(state, "__dict__", {}).values():
                for v in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(v, nn.Module):
                        held[id(v)] = f"{method} calls it from a hook"
        elif kind in ("set", "assign"):
            obj, name, _ = step
            if isinstance(obj, nn.Module):
                held.setdefault(id(obj), f"{method} changed its {name!r}")
            value = getattr(obj, name, None)
            if isinstance(value, nn.Module):
                held.setdefault(id(value), f"{method} installed it")
    return held


def get_config(model: nn.Module) -> PosEncConfig | None:
    """The configuration applied to ``model``.

    Args:
        model: a transformers model (or a peft model wrapping one).

    Returns:
        The :class:`PosEncConfig` resolved against the model (its original context, the knobs' defaults filled
        in), or None when the model is not patched.
    """
    rec = _record(model)
    return rec.config if rec is not None else None


def _apply(model: nn.Module, cfg: PosEncConfig, asked: PosEncConfig | None = None) -> None:
    """Apply ``cfg`` on top of what ``model`` has; ``asked``: what was asked for it when ``cfg`` is a composition
    applied again (read back from a record or a saved block), kept beside it in the record and the block."""
    warn_if_untested()
    adapter = find_adapter(model, cfg.spec)
    if cfg.params.get("layer_types") is not None and not adapter.takes_layer_types():
        raise ValueError(f"layer_types={cfg.params['layer_types']!r}: it applies to decoders with per-layer-type RoPE "
                         f"(Gemma 3, OLMo 3, ...); model_type={model.config.model_type!r} has none. Omit it.")
    resolved = adapter.resolve(model, cfg)
    if asked is not None:
        resolved.asked = asked
    record = PatchRecord(model, resolved, adapter)
    record.below = _record(model)  # a checkpoint's own scaling this patch goes on top of (see patch)
    try:
        if record.below is not None:  # its per-length hooks stand aside while this patch is on top
            record.set_attr(record.below, "covered", True)
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
        _apply(model, cfg, cfg.asked)
        record = _record(model)
    else:
        record = PatchRecord(model, cfg, find_adapter(model, cfg.spec))
        record.isolate_config()
        model.__dict__[_STATE] = record
    record.reversible = False
    record.set_config(CONFIG_KEY, dict(block))
    return model


def patch(model: nn.Module, method: Any, **kwargs: Any) -> nn.Module:
    """Change the positional encoding of ``model`` in place.

    Only this instance changes. Patching a patched model starts again from the model as it was before its patch,
    so patches never compound; if the new patch is refused, the previous one stays in place. On a checkpoint whose
    RoPE is already scaled, a RoPE scaling extends from its current context (docs/rope-scalings.md). A checkpoint
    saved with a RoPE scaling of fixed frequencies (a patched, composed or fine-tuned model, loaded by
    :func:`hf_posenc.from_pretrained`, which re-applies it) is such a checkpoint: its scaling is where every later
    patch starts, as on the same folder loaded by plain transformers, and :func:`unpatch` returns to it; ``"none"``
    (the baseline) is the model without any patch, that scaling included.

    Args:
        model: a transformers model, or a peft model (the model it wraps is patched).
        method: a method name (:func:`hf_posenc.list_methods`), its text form (``"yarn:factor=4"``), a
            :class:`PosEncConfig` or a dict of one.
        **kwargs: the method's knobs (``factor=4.0``, ``original_max_position_embeddings=...``, ...).

    Returns:
        ``model``, patched.

    Raises:
        ValueError: an unknown method or knob, a value out of range, or a model the method does not fit, before
            anything changes.

    >>> hf_posenc.patch(model, "yarn", factor=4.0)          # doctest: +SKIP
    >>> hf_posenc.patch(model, PosEncConfig("ntk", 2.0))    # doctest: +SKIP
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"patch() needs a transformers model (a torch.nn.Module), got {type(model).__name__}.")
    return _patch(model, as_config(method, **kwargs))


def reapply(model: nn.Module, cfg: PosEncConfig) -> nn.Module:
    """:func:`patch` with a configuration read back from a record or a saved block: a composition keeps what was
    asked for it (``cfg.asked``), which the longrope it computes does not say."""
    return _patch(model, cfg, cfg.asked)


def _patch(model: nn.Module, cfg: PosEncConfig, asked: PosEncConfig | None = None) -> nn.Module:
    inner = holder(model)  # a peft model: the model it wraps
    top = _record(inner)
    previous = top.config if top is not None and not top.checkpoint else None
    if previous is not None:
        unpatch(inner)
    if cfg.method == "none":  # the baseline: the model without any hf_posenc patch (a checkpoint's scaling too)
        while _record(inner) is not None:
            unpatch(inner)
    under = _record(inner)  # the scaling the checkpoint was saved with (the patch goes on top of it), else None
    if under is not None and cfg == under.config:
        return model  # the checkpoint's own scaling: the model as loaded
    try:
        _apply(inner, cfg, asked)
        if inner is not model:
            _check_under_wrapper(model, inner)
    except BaseException:
        if _record(inner) is not under:
            unpatch(inner)
        if previous is not None:
            _apply(inner, previous, previous.asked)
        raise
    return model


def keep_as_checkpoint(model: nn.Module) -> nn.Module:
    """Mark the patch on ``model`` (the RoPE scaling its checkpoint was saved with, just re-applied by
    :func:`hf_posenc.from_pretrained`) as what the checkpoint is: later patches go on top of it and
    :func:`unpatch` returns to it (a second ``unpatch`` to the model without it)."""
    _record(model).checkpoint = True
    return model


def checkpoint_config(model: nn.Module) -> PosEncConfig | None:
    """The RoPE scaling ``model``'s checkpoint was saved with and every patch starts from
    (:func:`keep_as_checkpoint`), or None."""
    rec = _record(model)
    while rec is not None and not rec.checkpoint:
        rec = rec.below
    return rec.config if rec is not None else None


def _check_under_wrapper(wrapper: nn.Module, inner: nn.Module) -> None:
    """A patch applied to the model a peft wrapper wraps must neither add weights (the wrapper would leave them
    frozen, and save only its adapter) nor act on a module peft replaced (a LoRA layer, a trained ``modules_to_save``
    copy): what ``lora.apply_lora`` refuses when the patch comes first, refused here by name."""
    added = sorted(n for n, _ in inner.named_parameters() if OWN_WEIGHTS in n)
    method = _record(inner).config.method
    if added:
        raise ValueError(f"{method!r} adds weights ({', '.join(added[:3])}) that this peft model would leave frozen "
                         "and not save: patch the model before wrapping it (hf_posenc.training.lora.apply_lora checks "
                         "the pair)")
    peft = sys.modules["peft"]
    layers = (peft.tuners.tuners_utils.BaseTunerLayer,
              getattr(peft.utils.other, "AuxiliaryTrainingWrapper", peft.utils.other.ModulesToSaveWrapper))
    names = {id(s): f"{n}.{k}".rstrip(".") for n, m in wrapper.named_modules() if isinstance(m, layers)
             for k, s in m.named_modules()}
    held = [(names[i], what) for i, what in held_modules(inner).items() if i in names]
    if held:
        name, what = held[0]
        raise ValueError(f"{method!r} cannot be applied under this peft model: {name} ({what}) is a module peft "
                         "wrapped (a LoRA target, or an embedding or norm it trains in full), and the patch would act "
                         "beside the adapter, not through it. Patch the model before wrapping it "
                         "(hf_posenc.training.lora.apply_lora checks the pair)")


def unpatch(model: nn.Module) -> nn.Module:
    """Restore the original positional encoding of ``model`` exactly.

    Args:
        model: a patched model (an unpatched one is returned unchanged); a peft model's wrapped model is unpatched.

    Returns:
        ``model``, as it was before its patch (a checkpoint saved with a RoPE scaling: with that scaling, as loaded;
        unpatched once more, without it).

    Raises:
        ValueError: a model loaded from a checkpoint whose saved weights hold the changed position table.
    """
    inner = holder(model)
    rec = inner.__dict__.get(_STATE)
    if rec is not None and not rec.reversible:
        raise ValueError(
            f"this model was loaded from a checkpoint saved after {rec.config.method!r}, whose weights hold the "
            "changed position table; the original table is not in it, so it cannot be unpatched or re-patched. "
            "Load the base model to start from the original.")
    if rec is not None:
        if rec.below is None:
            inner.__dict__.pop(_STATE, None)
        else:
            inner.__dict__[_STATE] = rec.below
        rec.undo()
    return model


def is_patched(model: nn.Module) -> bool:
    """Whether ``model`` carries an hf_posenc patch.

    Args:
        model: a transformers model (or a peft model wrapping one).

    Returns:
        True when :func:`get_config` would return a configuration.
    """
    return _record(model) is not None


@contextmanager
def trying(model: nn.Module, configs: list[PosEncConfig]):
    """``with trying(model, configs) as apply:`` -- each config is applied once on entry, so that one that does not
    fit ``model`` fails before any work; inside, ``apply(cfg)`` patches ``model`` with ``cfg`` from the state it had
    on entry (after "none", which takes a checkpoint's own scaling off too, the next config starts from that scaling
    again, as it would alone); on exit ``model`` is as it was (its own patch, if it had one, applied again)."""
    chain, rec = [], _record(model)  # the records on the model now, the checkpoint's own scaling first
    while rec is not None:
        chain.insert(0, rec)
        rec = rec.below

    def apply(cfg: PosEncConfig) -> nn.Module:
        _restore(model, chain)
        return patch(model, cfg)

    try:
        for cfg in configs:
            apply(cfg)
        yield apply
    finally:
        _restore(model, chain)


def _restore(model: nn.Module, chain: list) -> None:
    """``model`` back to the patch records of ``chain`` (bottom first): those a later patch took off applied again."""
    while _record(model) is not None and _record(model) not in chain:
        unpatch(model)  # the patch tried last
    kept = chain.index(_record(model)) + 1 if _record(model) is not None else 0
    for rec in chain[kept:]:  # what a tried patch took off ("none": the checkpoint's scaling too), again
        reapply(model, rec.config)
        if rec.checkpoint:
            keep_as_checkpoint(model)
