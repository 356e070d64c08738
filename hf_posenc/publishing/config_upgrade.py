"""``hf-posenc upgrade-config FOLDER``: a checkpoint folder saved with transformers 5 (by any tool) gets the
transformers-4 RoPE keys beside ``rope_parameters`` (:mod:`hf_posenc.checkpoints.legacy_rope`), so that loaders on
transformers 4 read the model it is.

``in_place``: only ``config.json`` is rewritten, atomically (the old file or the new one, never half of one), under
the folder's lock; every other file stays as it is. ``output``: a new folder, put in place whole by the replaced-
output rule (:class:`hf_posenc.io.output_folder.ReplacedOutput`): the checkpoint's files linked (copied where the
filesystem cannot link) and the upgraded ``config.json``. A RoPE transformers 4.57 would compute otherwise is
refused by name, before anything is written.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from ..checkpoints.legacy_rope import LegacyKeys, legacy_keys, with_legacy_keys
from ..io.files import OutputLock
from ..io.output_folder import OWN, ReplacedOutput, check_replaced_output
from .legacy_folder import read_config, refuse, write_config

COMMAND = "upgrade-config"


@dataclass
class Upgrade:
    """What :func:`upgrade_config` did: the folder written, the keys it added (per sub-config path), and the
    transformers-4 keys config.json held before that said something else (replaced)."""
    folder: str
    keys: dict
    replaced: list[str]


def _checked(folder: str) -> tuple[dict, LegacyKeys]:
    """``folder``'s config.json and the keys it gets; a ValueError for a folder that is none or a RoPE
    transformers 4.57 would compute otherwise."""
    if not os.path.isdir(folder):
        what = "a file" if os.path.exists(folder) else "missing"
        raise ValueError(f"FOLDER {folder!r} is {what}: give the checkpoint folder that holds config.json")
    config = read_config(folder)
    found = legacy_keys(config)
    refuse(found, f"hf-posenc {COMMAND} {folder}")
    return config, found


def _replaced(config: dict, found: LegacyKeys) -> list[str]:
    """The keys config.json held that the upgrade gives another value."""
    out = []
    for path, keys in found.keys.items():
        held = config if not path else config.get(path[:-1]) or {}
        out += [path + k for k, v in keys.items() if k in held and held[k] != v]
    return out


def upgrade_config(folder: str, *, output: str | None = None, in_place: bool = False) -> Upgrade:
    """Add the transformers-4 keys to ``folder``'s config.json, in place (``in_place``) or into a new ``output``
    folder (exactly one of them). A folder with no RoPE in config.json gets nothing (``keys`` empty)."""
    if in_place == (output is not None):
        raise ValueError(f"hf-posenc {COMMAND} writes either in place (--in-place) or into a new folder (--output); "
                         f"give one of them, got {'both' if in_place else 'neither'}")
    config, found = _checked(folder)
    upgraded = with_legacy_keys(config, found)
    if in_place:
        lock = None
        try:  # the lock taken inside: a kill right after it is taken still releases it
            lock = OutputLock(folder, flag="FOLDER")
            if found.keys and upgraded != config:
                write_config(folder, upgraded)
        finally:
            if lock is not None:
                lock.release()
        return Upgrade(os.path.abspath(folder), found.keys, _replaced(config, found))
    path = check_replaced_output(output, COMMAND, source=folder)
    with ReplacedOutput(path, COMMAND) as out, out.staged() as tmp:
        _link_files(folder, tmp)
        write_config(tmp, upgraded)
    return Upgrade(path, found.keys, _replaced(config, found))


def _link_files(source: str, target: str) -> None:
    """Every file below ``source`` (hf_posenc's own lock and manifest aside) into ``target``: hard-linked, or copied
    where the filesystem cannot link; symbolic links are copied as links."""
    for root, _dirs, names in os.walk(source):
        rel = os.path.relpath(root, source)
        os.makedirs(os.path.join(target, rel), exist_ok=True)
        for name in names:
            if rel == "." and (name in OWN or name == ".hf_posenc.lock" or name == "config.json"):
                continue
            src, dst = os.path.join(root, name), os.path.join(target, rel, name)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                continue
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
