"""Content digests of files: SHA-256 of every byte, remembered by path and by what the file system says of the file.

The digest names a file's whole content (a change anywhere in a weight file changes it). Hashing a multi-GB
checkpoint takes seconds to a minute, so each digest is kept in a small JSON file, ``file_digests.json`` in
the cache folder (``$HF_POSENC_CACHE``, else ``$XDG_CACHE_HOME/hf_posenc``, else ``~/.cache/hf_posenc``), under
the file's real path with its stamp: size, modification time, device, inode and status-change time (ctime), in
nanoseconds.

The guarantee: a cached digest is used only while all of the stamp is unchanged and the file's ctime lies more
than :data:`RACY_NS` before the moment it was hashed. ``cp -p``, ``rsync -a`` and ``touch -d`` can put back an
old size and mtime, but not the ctime (the kernel sets it on every write, rename or ``utime``; only changing the
system clock can forge it), and a file replaced by another has another inode. A file written within
:data:`RACY_NS` of its hashing (where a coarse file-system clock could give the rewrite the same ctime) is hashed
again on the next call, until its digest is older than that. A cache that cannot be read or written is ignored
(the file is hashed every time).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from ..checkpoints.models import cache_dir
from .files import atomic_write_text

CACHE_FILE = "file_digests.json"
RACY_NS = 2_000_000_000  # 2 s: above the clock tick of any local file system (FAT's 2 s included)
_CHUNK = 1 << 24


def _load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def hash_file(path: str) -> str:
    """SHA-256 of every byte of ``path``, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino, st.st_ctime_ns]


def _cached(held, stamp: list[int]) -> str | None:
    """The recorded digest when ``held`` records this stamp, hashed more than RACY_NS after the file's ctime."""
    if not (isinstance(held, dict) and held.get("stamp") == stamp and isinstance(held.get("sha256"), str)):
        return None
    hashed_at = held.get("hashed_at_ns")
    if not isinstance(hashed_at, int) or hashed_at - stamp[4] <= RACY_NS:
        return None
    return held["sha256"]


def file_digests(paths: list[str]) -> list[str]:
    """The SHA-256 of each file of ``paths`` (hex), read from the cache where the file's real path and stamp are
    those recorded (see the module's guarantee), hashed (and recorded) otherwise."""
    cache_path = os.path.join(cache_dir(), CACHE_FILE)
    cache, out, changed = _load(cache_path), [], False
    for path in paths:
        real, st = os.path.realpath(path), os.stat(path)
        stamp = _stamp(st)
        held = _cached(cache.get(real), stamp)
        if held is not None:
            out.append(held)
            continue
        hashed_at = time.time_ns()  # before reading: a write during the hashing falls after it
        out.append(hash_file(path))
        cache[real], changed = {"stamp": stamp, "hashed_at_ns": hashed_at, "sha256": out[-1]}, True
    if changed:
        try:
            atomic_write_text(cache_path, json.dumps(cache, indent=0, sort_keys=True))
        except OSError:  # a read-only home: the digests are simply computed again next time
            pass
    return out


def comparable_identity(identity: Any) -> Any:
    """A model's identity (``eval.common.model_identity``) as a resume compares it: a local folder by the digest of
    its files alone, not by the path it was given as -- a relative path from another working folder, or the folder
    moved, is the same weights (and a path whose files changed is not)."""
    if isinstance(identity, dict) and "files" in identity:
        return {k: v for k, v in identity.items() if k != "model"}
    return identity
