"""Writing files so that a crash, a full disk or a kill leaves the old file or the new one, never half of one."""

from __future__ import annotations

import fcntl
import os
import tempfile
from typing import BinaryIO, Callable

from .interrupts import deferred_interrupts


def umask() -> int:
    """The process's file-mode creation mask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(folder: str) -> None:
    """Give the files below ``folder`` that were written as private temporary files (mode 0600: safetensors
    writes its weights so) the mode a plain ``open`` gives (0644 under umask 022): a checkpoint is for sharing."""
    mode = 0o666 & ~umask()
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path) and os.stat(path).st_mode & 0o777 == 0o600:
                os.chmod(path, mode)


def atomic_write(path: str, write: Callable[[BinaryIO], None], replace: bool = True) -> str:
    """``write(f)`` into a temporary file beside ``path``, flushed to disk, then renamed over ``path``. The file
    gets the mode a plain ``open`` would give it (0644 under umask 022), not the temporary file's 0600. With
    ``replace=False`` a ``path`` that exists is kept as it is: the file is linked into place, which fails rather
    than replace one that appeared meanwhile (of several writers racing to create it, the first one's stands)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str, text: str, replace: bool = True) -> str:
    """``text`` (UTF-8) at ``path``, written as :func:`atomic_write` does."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")), replace)


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
    if not _can_create_in(parent):
        raise ValueError(f"--output {output!r}: {parent} is not writable.")
    return path


def _can_create_in(folder: str) -> bool:
    """Whether a file can really be created in ``folder`` (a probe: ``os.access`` says yes to root on /proc, /sys)."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".hf_posenc-probe-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


LOCK_FILE = ".hf_posenc.lock"


class OutputLock:
    """An exclusive lock on an output folder for one run: ``<folder>/.hf_posenc.lock``, held with ``flock`` (the
    system releases it when the process ends, however it ends) and removed when the run ends. A second run on
    the same folder is refused with the pid of the one holding it. A folder that the lock itself created and
    that holds nothing else when the run ends (it failed before writing anything) is removed too. ``path``: the lock
    file when it is not ``<folder>/.hf_posenc.lock`` (a command that replaces its folder whole locks it from beside
    the folder: :mod:`hf_posenc.io.output_folder`)."""

    def __init__(self, folder: str, path: str | None = None, flag: str = "--output"):
        self.folder, self.flag = os.path.abspath(folder), flag
        self.created = path is None and not os.path.exists(self.folder)
        if path is None:
            os.makedirs(self.folder, exist_ok=True)
        self.path, self.fd = path or os.path.join(self.folder, LOCK_FILE), None
        try:  # a kill while the lock is taken (handled as the signals are let through) leaves no lock file
            with deferred_interrupts():
                self._hold(folder)
        except BaseException:
            self.release()
            raise

    def _hold(self, folder: str) -> None:
        while True:  # the file locked must still be the one at the path (a releasing run removes it)
            fd = self._take(folder)
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        self.fd = fd
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()}\n".encode())

    def _take(self, folder: str) -> int:
        try:  # never through a link planted at the lock's path (it would truncate the file it points to)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)  # the umask applies
        except OSError as err:
            raise ValueError(f"the lock {self.path} cannot be taken ({err.strerror}); if it is a symbolic link, "
                             "it is not hf-posenc's: remove it") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise ValueError(f"{self.flag} {folder!r} is in use by another hf-posenc run (pid {holder}, lock "
                             f"{self.path}); wait for it to finish, or give another {self.flag}.") from None
        return fd

    def release(self) -> None:
        if self.fd is None:
            return
        os.unlink(self.path)  # while still held: a run waiting on this file sees it gone and takes a new one
        if self.created and not os.listdir(self.folder):  # the run wrote nothing: leave no trace of it
            os.rmdir(self.folder)
        os.close(self.fd)  # closing releases the flock
        self.fd = None
