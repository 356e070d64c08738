"""Modules that moved, still importable by their old names for a while (with a DeprecationWarning that names the
new one): ``from hf_posenc.publish import PatchJob`` goes on working. :data:`MOVED` is the one list of old -> new
names (README's "Changes" section says the same); the old name is a view of the new module, not a copy.
``hf_posenc.finetune`` is now the public function: ``from hf_posenc.finetune import X`` still reaches the module, but
``import hf_posenc.finetune as ft`` binds the function (Python reads the package's attribute first)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

MOVED = {
    "hf_posenc.eval.data": "hf_posenc.io.documents",
    "hf_posenc.eval.report": "hf_posenc.io.reports",
    "hf_posenc.files": "hf_posenc.io.files",
    "hf_posenc.replaced_folder": "hf_posenc.io.output_folder",
    "hf_posenc.digests": "hf_posenc.io.digests",
    "hf_posenc.publish": "hf_posenc.publishing.patch_job",
    "hf_posenc.registry": "hf_posenc.method_listing",
    "hf_posenc.flags": "hf_posenc.cli.flags",
    "hf_posenc.finetune": "hf_posenc.training.finetune",
    "hf_posenc.finetune_eval": "hf_posenc.training.long_eval",
    "hf_posenc.lora": "hf_posenc.training.lora",
    "hf_posenc.parallel": "hf_posenc.training.parallel",
    "hf_posenc.training_resume": "hf_posenc.training.resume",
    "hf_posenc.training_settings": "hf_posenc.training.settings",
    "hf_posenc.serve_check": "hf_posenc.serving.check",
    "hf_posenc.serve_config": "hf_posenc.serving.launch_settings",
    "hf_posenc.gguf_file": "hf_posenc.serving.gguf_file",
    "hf_posenc.freezing": "hf_posenc.serving.freezing",
    "hf_posenc.dual_chunk_config": "hf_posenc.serving.dual_chunk_config",
    "hf_posenc.patch_job": "hf_posenc.publishing.patch_job",
    "hf_posenc.hub": "hf_posenc.publishing.hub",
    "hf_posenc.card": "hf_posenc.publishing.card",
    "hf_posenc.loading": "hf_posenc.checkpoints.loading",
    "hf_posenc.models": "hf_posenc.checkpoints.models",
    "hf_posenc.runtime": "hf_posenc.checkpoints.runtime",
    "hf_posenc.weights": "hf_posenc.checkpoints.weights",
    "hf_posenc.context": "hf_posenc.checkpoints.context",
    "hf_posenc.compat": "hf_posenc.checkpoints.compat",
    "hf_posenc.provenance": "hf_posenc.io.provenance",
    "hf_posenc.figures": "hf_posenc.io.figures",
    "hf_posenc.interrupts": "hf_posenc.io.interrupts",
    "hf_posenc.wording": "hf_posenc.io.wording",
    "hf_posenc.reference_docs": "hf_posenc.cli.reference_docs",
}


class _View(types.ModuleType):
    """An old module name: every attribute read, written or deleted through it is the new module's, and
    ``from OLD import *`` gives the names ``from NEW import *`` gives."""

    def __init__(self, name: str, target: types.ModuleType):
        super().__init__(name, target.__doc__)
        object.__setattr__(self, "_target", target)

    def __getattr__(self, attribute):  # called for what the view itself does not hold
        return getattr(self._target, attribute)

    def __setattr__(self, attribute, value):
        if _own(attribute):  # what the import system sets on the view (__spec__, __loader__, ...)
            object.__setattr__(self, attribute, value)
        else:
            setattr(self._target, attribute, value)

    def __delattr__(self, attribute):
        if _own(attribute):
            object.__delattr__(self, attribute)
        else:
            delattr(self._target, attribute)

    def __dir__(self):
        return dir(self._target)

    @property
    def __all__(self):
        return list(getattr(self._target, "__all__", None) or _public(self._target))


def _own(attribute: str) -> bool:
    return attribute.startswith("__") and attribute.endswith("__")


def _public(module: types.ModuleType) -> list[str]:
    """What ``from MODULE import *`` takes from a module without ``__all__``: every name not starting with _."""
    return [n for n in vars(module) if not n.startswith("_")]


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers only for the old names of :data:`MOVED` (after every other finder found no file for them)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name in MOVED else None

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old name goes in a later release)",
                      DeprecationWarning, stacklevel=2)
        return _View(spec.name, importlib.import_module(new))

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (last: a module found as a file always wins)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
