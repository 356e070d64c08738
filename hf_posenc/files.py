"""Writing files so that a crash, a full disk or a kill leaves the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile


def atomic_write_text(path: str, text: str) -> str:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk, then rename it over ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def check_output_folder(output: str, source: str | None = None) -> str:
    """Refuse, before any compute, an ``--output`` that cannot receive a saved checkpoint: an existing file, a
    folder that cannot be written, or the folder of the model being read (``source``)."""
    path = os.path.abspath(output)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--output {output!r} is an existing file; give a folder.")
    if source is not None and os.path.isdir(source) and os.path.realpath(path) == os.path.realpath(source):
        raise ValueError(f"--output {output!r} is the folder of the model being patched; give another folder, so that "
                         "the base checkpoint stays as it is.")
    parent = path if os.path.isdir(path) else os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--output {output!r}: {parent} is not writable.")
    return path


class StagedFolder:
    """``with StagedFolder(output) as tmp:`` -- write into ``tmp`` (beside ``output``); on success it replaces
    ``output`` whole, on any failure it is removed and ``output`` stays as it was."""

    def __init__(self, output: str):
        self.output = os.path.abspath(output)

    def __enter__(self) -> str:
        parent = os.path.dirname(self.output)
        os.makedirs(parent, exist_ok=True)
        self.tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(self.output)}.partial-")
        return self.tmp

    def __exit__(self, kind, value, tb) -> bool:
        import shutil

        if kind is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        old = None
        if os.path.exists(self.output):
            old = tempfile.mkdtemp(dir=os.path.dirname(self.output), prefix=f".{os.path.basename(self.output)}.old-")
            os.replace(self.output, os.path.join(old, "previous"))
        os.replace(self.tmp, self.output)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return False
