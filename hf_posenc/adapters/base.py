"""What every adapter implements, and the reversible record of what a patch changed.

An adapter knows where one family of models keeps its positions (a rotary module, a learned
table, relative-position buckets, attention biases) and how to change them. Every change goes
through a :class:`PatchRecord`, which remembers the original so that ``unpatch`` restores it
exactly (as accelerate's hooks do): nothing is ever changed on a class, only on one instance.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from torch import nn

from ..config import CONFIG_KEY, PosEncConfig, SavedBlock


class _Missing:
    """Marks an attribute that did not exist before a patch; one instance, kept by copy and pickle."""

    def __reduce__(self):
        return "_MISSING"

    def __repr__(self):
        return "<missing>"


_MISSING = _Missing()


class PatchRecord:
    """The undo log of one applied patch on one model instance.

    Each step is data -- ``("set", obj, name, old)``, ``("assign", obj, name, old)``, ``("hook", handle)``,
    ``("configs", [(module, config), ...])`` -- never a closure, so that ``copy.deepcopy`` and pickle of the
    model carry a log that points at the copy's own objects: unpatching a copy restores the copy."""

    checkpoint = False  # (class defaults: records pickled by a release without these fields)
    below: PatchRecord | None = None
    covered = False  # a patch went on top of this one: its per-length hooks leave the rotary module to that patch

    def __init__(self, model: nn.Module, config: PosEncConfig, adapter: "Adapter"):
        self.model = model
        self.config = config
        self.adapter = adapter
        self._undo: list[tuple] = []
        self.reversible = True  # False for a model adopted from a checkpoint that holds the patched weights
        self.checkpoint = False  # the scaling a checkpoint was saved with, re-applied at load: patches go on top
        self.below: PatchRecord | None = None  # the record this one was applied on top of (a checkpoint's), if any
        self.config_original: dict[str, Any] = {}  # model-config fields the patch changed, as they were

    # -- recorded changes -------------------------------------------------------------------
    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        """Set ``obj.name = value`` (a buffer, a parameter, a submodule or a plain attribute)."""
        old = obj.__dict__.get(name, _MISSING) if not isinstance(obj, nn.Module) else _module_attr(obj, name)
        setattr(obj, name, value)
        self._undo.append(("set", obj, name, old))

    def assign(self, obj: Any, name: str, value: Any) -> None:
        """``obj.name = value`` through whatever property ``name`` is; undone by assigning the old value."""
        old = getattr(obj, name)
        setattr(obj, name, value)
        self._undo.append(("assign", obj, name, old))

    def set_config(self, name: str, value: Any) -> None:
        """Change one field of the model's (already isolated) config; ``text_config.rope_parameters``
        names a field of a sub-config (composite models)."""
        owner, field = config_field(self.model.config, name)
        if name not in self.config_original:
            self.config_original[name] = copy.deepcopy(getattr(owner, field, None))
        self.set_attr(owner, field, value)

    def add_hook(self, handle: torch.utils.hooks.RemovableHandle) -> None:
        self._undo.append(("hook", handle))

    def isolate_config(self) -> None:
        """Give the model its own copy of its config, so that a patch never reaches another model
        built from the same config object. Every submodule that held the old object (or one of its
        sub-configs: the language model of a composite model) gets the copy."""
        old = self.model.config
        new = copy.deepcopy(old)
        pairs = [(old, new)]
        for name in getattr(old, "sub_configs", None) or {}:
            if getattr(old, name, None) is not None:
                pairs.append((getattr(old, name), getattr(new, name)))
        holders = []
        for m in self.model.modules():
            held = getattr(m, "config", None)
            for old_config, new_config in pairs:
                if held is old_config:
                    holders.append((m, held))
                    m.config = new_config
        self._undo.append(("configs", holders))

    def undo(self) -> None:
        while self._undo:
            kind, *step = self._undo.pop()
            if kind == "hook":
                step[0].remove()
            elif kind == "configs":
                for m, held in step[0]:
                    m.config = held
            elif kind == "assign" or step[2] is not _MISSING:
                obj, name, old = step
                setattr(obj, name, _as_current(old, getattr(obj, name, None)) if kind == "set" else old)
            elif hasattr(step[0], step[1]):
                delattr(step[0], step[1])

    # -- what goes into config.json -------------------------------------------------------------
    def block(self, native: bool) -> dict[str, Any]:
        original = {k: v for k, v in self.config_original.items() if k != CONFIG_KEY}
        return SavedBlock(self.config, self.adapter.name, native, original).to_dict()


def _as_current(old: Any, current: Any) -> Any:
    """``old`` (a saved tensor or module) in the dtype and on the device of ``current``, the value it replaces
    -- the model may have been cast (``.half()``) or moved since it was patched."""
    if isinstance(old, torch.Tensor) and isinstance(current, torch.Tensor):
        dtype = current.dtype if old.is_floating_point() and current.is_floating_point() else old.dtype
        if (old.dtype, old.device) == (dtype, current.device):
            return old
        moved = old.detach().to(device=current.device, dtype=dtype)
        return nn.Parameter(moved, requires_grad=old.requires_grad) if isinstance(old, nn.Parameter) else moved
    if isinstance(old, nn.Module) and isinstance(current, nn.Module):
        ref = next((t for t in [*current.parameters(), *current.buffers()] if t.is_floating_point()), None)
        return old.to(device=ref.device, dtype=ref.dtype) if ref is not None else old
    return old


class SavedAsOriginal:
    """``save_pretrained`` of one patched model instance whose patch plain transformers does not compute (not
    native): its ``config.json`` gets the original values of the fields the patch changed (the context L, the
    plain RoPE), beside the ``hf_posenc`` block that ``hf_posenc.from_pretrained`` re-applies. A plain loader
    (transformers, vLLM, SGLang, ...) then builds the unpatched model and is told its true context, instead of
    being told an extended context it would compute with plain RoPE. The live config keeps the patched values."""

    def __init__(self, model: nn.Module, record: "PatchRecord"):
        self.model, self.record = model, record

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        changed = [(key, value) for key, value in self.record.config_original.items() if key != CONFIG_KEY]
        held = []
        for key, value in changed:
            owner, field = config_field(self.model.config, key)
            held.append((owner, field, getattr(owner, field, None)))
            setattr(owner, field, copy.deepcopy(value))
        try:
            return type(self.model).save_pretrained(self.model, *args, **kwargs)
        finally:
            for owner, field, value in held:
                setattr(owner, field, value)


def config_field(config: Any, name: str) -> tuple[Any, str]:
    """The config object that holds ``name`` and the field's own name: ``"text_config.rope_parameters"``
    -> (config.text_config, "rope_parameters")."""
    *path, field = name.split(".")
    for part in path:
        config = getattr(config, part)
    return config, field


def drop_stray_original_context(config: Any, prefix: str, original: dict[str, Any]) -> None:
    """Removes a top-level ``original_max_position_embeddings`` that ``config``'s class does not take and the
    restored original fields do not hold: one written for transformers 4 beside the saved (patched) longrope.
    transformers 5 copies such a field into the rope_parameters of a llama3, yarn or longrope it builds, so left
    there it would replace the original context the restored rope_parameters state."""
    name = "original_max_position_embeddings"
    if prefix + name in original or name not in vars(config):
        return
    if name not in inspect.signature(type(config).__init__).parameters:
        delattr(config, name)


def text_config(config: Any) -> tuple[Any, str]:
    """The (sub-)config that describes the language model, and its path prefix from ``config``: ``(config,
    "")`` for a plain model, ``(config.text_config, "text_config.")`` for a composite one (LLaVA, Gemma 3
    with vision, ...)."""
    getter = getattr(config, "get_text_config", None)
    sub = getter(decoder=True) if callable(getter) else config
    if sub is not config:
        for name in getattr(config, "sub_configs", None) or {}:
            if getattr(config, name, None) is sub:
                return sub, f"{name}."
    return config, ""


def _module_attr(module: nn.Module, name: str) -> Any:
    for store in (module._parameters, module._buffers, module._modules, module.__dict__):
        if name in store:
            return store[name]
    return _MISSING


class Adapter:
    """Base class of the family adapters. Subclasses set ``name``, ``model_types`` (families tested
    explicitly), ``kinds`` (method kinds they take) and implement ``matches``, ``resolve`` and
    ``apply``."""

    name: str = "base"
    model_types: tuple[str, ...] = ()
    kinds: frozenset[str] = frozenset()
    swaps: tuple[str, ...] = ()  # methods taken by name beyond ``kinds``: swaps to another family
    generic_note: str = ""

    def matches(self, model: nn.Module) -> bool:
        """Whether this adapter can patch ``model`` (by model_type or by finding its modules)."""
        raise NotImplementedError

    def accepts(self, spec) -> bool:
        """Whether this adapter takes the method ``spec``: by its kind, or by name as one of ``swaps``."""
        return spec.kind in self.kinds or spec.name in self.swaps

    def takes_layer_types(self) -> bool:
        """Whether the ``layer_types`` knob can mean something for this adapter's models (per-layer-type RoPE)."""
        return False

    def families(self, spec) -> list[str]:
        """The tested families (``model_types``) that take the method ``spec``."""
        return list(self.model_types) if self.accepts(spec) else []

    def extra_weights(self, model: nn.Module) -> list[str]:
        """State-dict keys of weights the applied patch added (e.g. a learned position table): saved with
        the checkpoint, and loaded into the re-patched model by ``hf_posenc.from_pretrained``."""
        return []

    def resolve(self, model: nn.Module, config: PosEncConfig) -> PosEncConfig:
        """Check ``config`` against the model and fill what the model decides (original length...).
        Must not change the model; raises ValueError naming what is wrong."""
        raise NotImplementedError

    def apply(self, model: nn.Module, config: PosEncConfig, record: PatchRecord) -> bool:
        """Apply the resolved config through ``record``; returns whether the result is expressible in
        the model's native transformers config (so that plain transformers loads it identically)."""
        raise NotImplementedError

    def restores(self, block: dict[str, Any]) -> bool:
        """True: a saved patch is re-applied on load to weights of the original shapes; False: the saved
        weights already hold the patch (a resized table), and a reload adopts it (``patching.adopt``)."""
        return True

    def reapplies(self, block: dict[str, Any]) -> bool:
        """For a patch that ``restores`` not: whether its hooks must be installed again on load."""
        return False

    def prepare_load_config(self, hf_config: Any, block: dict[str, Any]) -> Any:
        """The config to build a saved, patched checkpoint with before ``patch`` re-applies the block.
        Default: the original fields recorded in the block are restored (the patch changes no weight
        shape, so the checkpoint's weights load into the original architecture)."""
        original = block.get("original") or {}
        for key, value in original.items():
            owner, field = config_field(hf_config, key)
            setattr(owner, field, copy.deepcopy(value))
            if field == "rope_parameters":
                drop_stray_original_context(owner, key[: -len(field)], original)
        return hf_config
