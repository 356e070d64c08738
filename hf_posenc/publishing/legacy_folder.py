"""The transformers-4 RoPE keys (:mod:`hf_posenc.checkpoints.legacy_rope`) in a checkpoint folder's config.json.

:func:`predicted` tells, before anything is saved, what a patched model's config.json will allow (the values it
will hold: a patch plain transformers does not compute is saved with the original RoPE); :func:`add_to_folder`
writes the keys into a saved folder's config.json, atomically, or records in its ``hf_posenc`` block why they
are not there.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from ..adapters.base import SavedAsOriginal, config_field
from ..checkpoints.legacy_rope import TRANSFORMERS4, V4_KEYS, LegacyKeys, legacy_keys, with_legacy_keys
from ..config import CONFIG_KEY
from ..io.files import atomic_write_text

BLOCK_FIELD = "transformers4"  # the hf_posenc block's note when config.json carries no transformers-4 keys


def predicted(model) -> LegacyKeys:
    """:func:`legacy_keys` of the config.json that ``model.save_pretrained`` will write."""
    config = copy.deepcopy(model.config)
    saver = model.__dict__.get("save_pretrained")
    if isinstance(saver, SavedAsOriginal):  # saved with the original values of the fields the patch changed
        for key, value in saver.record.config_original.items():
            if key != CONFIG_KEY:
                owner, name = config_field(config, key)
                setattr(owner, name, copy.deepcopy(value))
    return legacy_keys(config.to_dict())


def requested(model, transformers4: bool | None) -> LegacyKeys | None:
    """What ``model``'s saved config.json will carry (None: no keys asked for, ``transformers4=False``); with
    ``transformers4=True``, a RoPE transformers 4.57 computes otherwise is refused, naming the method, before
    anything is written."""
    if transformers4 is False:
        return None
    found = predicted(model)
    if transformers4:
        method = (getattr(model.config, CONFIG_KEY, None) or {}).get("method", "none")
        refuse(found, f"transformers4=True for `{method}`")
    return found


def refuse(found: LegacyKeys, what: str) -> None:
    """The error of keys asked for that transformers 4.57 cannot read as transformers 5 does."""
    if found.reason is not None:
        raise ValueError(f"{what}: no transformers-4 keys (rope_theta / rope_scaling) can make {TRANSFORMERS4} "
                         f"compute this RoPE as transformers 5 does: {found.reason}. Save it without them "
                         "(transformers4=None writes them only where they compute the same).")


def read_config(folder: str) -> dict[str, Any]:
    """``folder``'s config.json as a dict; a ValueError naming the folder when there is none or it is no object."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"{folder!r} has no config.json: give a checkpoint folder written by save_pretrained")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} could not be read as JSON ({err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds {type(config).__name__}, not a JSON object")
    return config


def write_config(folder: str, config: dict[str, Any]) -> None:
    """config.json written as transformers writes it, atomically (the old file or the new one, never half)."""
    atomic_write_text(os.path.join(folder, "config.json"), json.dumps(config, indent=2, sort_keys=True) + "\n")


def add_to_folder(folder: str, required: bool | None = None) -> LegacyKeys:
    """Give ``folder``'s config.json the transformers-4 keys (``required=False``: none). Where transformers 4.57
    would compute another RoPE, ``required=True`` refuses it, else the hf_posenc block (if any) records why."""
    config = read_config(folder)
    found = legacy_keys(config) if required is not False else LegacyKeys()
    if required:
        refuse(found, folder)
    block = config.get(CONFIG_KEY)
    if found.written:
        config = with_legacy_keys(config, found)
    elif isinstance(block, dict) and found.reason is not None:
        config[CONFIG_KEY] = {**block, BLOCK_FIELD: {"keys": False, "reason": found.reason}}
    else:
        return found
    write_config(folder, config)
    return found


def card_line(found: LegacyKeys | None) -> str | None:
    """The model card's line on transformers 4's loaders, or None when config.json holds no RoPE."""
    if found is None or (found.reason is None and not found.keys):
        return None
    if found.written:
        return (f"yes: `{'` / `'.join(V4_KEYS)}` beside `rope_parameters` state the same RoPE, so loaders on "
                "transformers 4 (TGI, engines pinned below transformers 5) read it as transformers 5 does")
    return (f"no: {TRANSFORMERS4} would compute another RoPE ({found.reason}), so config.json carries "
            "`rope_parameters` alone; loaders on transformers 5 read it right, those on transformers 4 (TGI, "
            "engines pinned below transformers 5) would use base 10000 and no scaling")


def folder_state(folder: str) -> LegacyKeys | None:
    """What a saved folder's config.json carries: its keys, recomputed from ``rope_parameters``, when it holds
    transformers-4 keys; the hf_posenc block's note when they were left out; None without config.json or when
    neither (saved with ``transformers4=False``)."""
    try:
        config = read_config(folder)
    except ValueError:
        return None
    note = (config.get(CONFIG_KEY) or {}).get(BLOCK_FIELD) if isinstance(config.get(CONFIG_KEY), dict) else None
    if isinstance(note, dict) and note.get("reason"):
        return LegacyKeys(reason=str(note["reason"]))
    found = legacy_keys(config)
    return found if found.written and all(set(keys) <= set(_at(config, path)) for path, keys in found.keys.items()) \
        else None


def _at(config: dict[str, Any], path: str) -> dict[str, Any]:
    return config if not path else config.get(path[:-1]) or {}
