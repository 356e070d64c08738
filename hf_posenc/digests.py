"""Content digests of files: SHA-256 of every byte, remembered by path, size and modification time.

The digest names a file's whole content (a change anywhere in a weight file changes it). Hashing a multi-GB
checkpoint takes seconds to a minute, so each digest is kept in a small JSON file, ``file_digests.json`` in
the cache folder (``$HF_POSENC_CACHE``, else ``$XDG_CACHE_HOME/hf_posenc``, else ``~/.cache/hf_posenc``), under
the file's real path with its size and modification time in nanoseconds: a file that keeps all three is not
read again. A cache that cannot be read or written is ignored (the file is hashed every time).
"""

from __future__ import annotations

import hashlib
import json
import os

from .files import atomic_write_text
from .models import cache_dir

CACHE_FILE = "file_digests.json"
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


def file_digests(paths: list[str]) -> list[str]:
    """The SHA-256 of each file of ``paths`` (hex), read from the cache where the file's real path, size and
    modification time are those recorded, hashed (and recorded) otherwise."""
    cache_path = os.path.join(cache_dir(), CACHE_FILE)
    cache, out, changed = _load(cache_path), [], False
    for path in paths:
        real, st = os.path.realpath(path), os.stat(path)
        stamp = [st.st_size, st.st_mtime_ns]
        held = cache.get(real)
        if isinstance(held, dict) and held.get("stamp") == stamp and isinstance(held.get("sha256"), str):
            out.append(held["sha256"])
            continue
        out.append(hash_file(path))
        cache[real], changed = {"stamp": stamp, "sha256": out[-1]}, True
    if changed:
        try:
            atomic_write_text(cache_path, json.dumps(cache, indent=0, sort_keys=True))
        except OSError:  # a read-only home: the digests are simply computed again next time
            pass
    return out
