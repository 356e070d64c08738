"""Modules that moved, still importable by their old names for a while (with a DeprecationWarning that names the
new one): ``from hf_posenc.publish import PatchJob`` goes on working. :data:`MOVED` is the one list of old -> new
names (README's "Changes" section says the same); the old name is a view of the new module, not a copy."""

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
    "hf_posenc.publish": "hf_posenc.patch_job",
    "hf_posenc.registry": "hf_posenc.method_listing",
    "hf_posenc.flags": "hf_posenc.cli.flags",
}


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers only for the old names of :data:`MOVED` (after every other finder found no file for them)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name in MOVED else None

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old name goes in a later release)",
                      DeprecationWarning, stacklevel=2)
        target = importlib.import_module(new)
        view = types.ModuleType(spec.name, target.__doc__)
        view.__getattr__ = lambda attribute: getattr(target, attribute)  # PEP 562: every name the new module has
        view.__dir__ = lambda: dir(target)
        return view

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (last: a module found as a file always wins)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
