"""The ``--output`` of a command that writes a whole folder (``patch``, ``finetune``): checked before any compute,
locked for one run, written into a staged folder beside it, and put in place only when complete. It never
deletes what the command did not write: a folder that is not empty is replaced only when it is the same
command's earlier output, unchanged, as its manifest (``.hf_posenc-output.json``) lists it."""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from typing import Any

from .files import OutputLock, atomic_write_text, check_output_folder, umask
from .interrupts import deferred_interrupts
from .wording import first_names

MANIFEST = ".hf_posenc-output.json"
OWN = {MANIFEST}  # what hf_posenc keeps in the folder beside the files of the output (an eval's lock there is not:
# a folder an eval is writing into, or was killed in, is not replaced)
_TEMP = "[a-z0-9_]" * 8  # the random part of a name tempfile.mkdtemp makes


def check_replaced_output(output: str, command: str, source: str | None = None, reads: list[str] = ()) -> str:
    """Refuse, before any compute, an ``--output`` that ``command`` may not replace: what
    :func:`files.check_output_folder` refuses, a folder that contains the model being read (``source``), an input
    in ``reads`` or the working directory, and a folder that is not empty unless it is ``command``'s own earlier
    output, unchanged."""
    path = check_output_folder(output, source)
    if os.path.islink(path):
        raise ValueError(f"--output {output!r} is a symbolic link (to {os.readlink(path)!r}); `hf-posenc {command}` "
                         "replaces its --output whole, which would replace the link: give the folder itself")
    if os.path.ismount(path):
        raise ValueError(f"--output {output!r} is a mount point, which `hf-posenc {command}` cannot replace whole; "
                         "give a folder inside it")
    read = [("the model being read", source)] + [("the input", r) for r in reads if r]
    for what, inside in read + [("the current working directory", os.getcwd())]:
        if inside and os.path.exists(inside) and _within(inside, path):
            raise ValueError(f"--output {output!r} contains {what} ({inside}), and `hf-posenc {command}` replaces "
                             "its --output whole; give a folder outside it.")
    check_replaceable(output, command)
    return path


def _within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies below it (links resolved)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def check_replaceable(output: str, command: str) -> None:
    """Refuse a folder that is not empty unless its manifest says ``command`` wrote it and every file in it is
    one the manifest lists, with the size and modification time it had when written."""
    path = os.path.abspath(output)
    present = _files(path) if os.path.isdir(path) else {}
    if not present:
        return
    how = ("give a new or empty folder, or move those files away yourself: hf-posenc never deletes a file it did "
           "not write")
    manifest = _read_manifest(path)
    if manifest is None:
        raise ValueError(f"--output {output!r} already holds files that hf-posenc {command} did not write "
                         f"({first_names(sorted(present))}); {how}.")
    if manifest.get("command") != command:
        raise ValueError(f"--output {output!r} holds the output of `hf-posenc {manifest.get('command')}`, which "
                         f"`hf-posenc {command}` does not replace; give another folder, or remove it yourself.")
    written = manifest.get("files", {})
    foreign = sorted(name for name in present if name not in written)
    changed = sorted(name for name, stamp in written.items() if present.get(name, stamp) != stamp)
    if foreign or changed:
        what = (f"files it did not write ({first_names(foreign)})" if foreign else "") + \
               (" and " if foreign and changed else "") + \
               (f"files changed since it wrote them ({first_names(changed)})" if changed else "")
        raise ValueError(f"--output {output!r} is an earlier output of `hf-posenc {command}`, but it now holds {what}; "
                         f"{how}.")


def _files(folder: str) -> dict[str, list[int]]:
    """Every file (and link) below ``folder`` but hf_posenc's own, by relative path: [size, mtime in ns]."""
    found = {}
    for root, dirs, names in os.walk(folder):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, folder).replace(os.sep, "/")
            if rel not in OWN:
                st = os.lstat(full)
                found[rel] = [st.st_size, st.st_mtime_ns]
    return found


def _read_manifest(folder: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


class ReplacedOutput:
    """``with ReplacedOutput(output, command) as out: ... with out.staged() as tmp: <write into tmp>``

    Holds ``.<name>.hf_posenc.lock`` beside ``output`` from start to end (a second run on the same folder is
    refused, naming the pid); on entering, puts back an output that a killed run had moved aside and removes the
    staged folders killed runs left. ``staged()`` yields a folder beside ``output``; when its block ends without
    error, the folder gets its manifest and replaces ``output`` (checked again: still replaceable); on any failure
    it is removed and ``output`` stays as it was."""

    def __init__(self, output: str, command: str):
        self.output, self.command = os.path.abspath(output), command
        parent, name = os.path.split(self.output)
        self.made, self.lock = _missing_parents(parent), None
        self._prefix = os.path.join(parent, f".{name}.")
        try:  # a kill from here on leaves neither the lock nor the parent folders made for the output
            os.makedirs(parent, exist_ok=True)
            with deferred_interrupts():
                self.lock = OutputLock(self.output, path=f"{self._prefix}hf_posenc.lock")
            self._recover()
        except BaseException:
            self.__exit__()
            raise

    def __enter__(self) -> "ReplacedOutput":
        return self

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            self.lock.release()
        self._remove_made()

    def _recover(self) -> None:
        """What a run killed while it held this lock left beside the output (only such a run writes these names)."""
        for old in glob.glob(glob.escape(self._prefix) + "old-" + _TEMP):
            previous = os.path.join(old, "previous")
            if os.path.isdir(previous) and not os.path.lexists(self.output):  # killed between the two renames
                os.replace(previous, self.output)
            shutil.rmtree(old, ignore_errors=True)
        for partial in glob.glob(glob.escape(self._prefix) + "partial-" + _TEMP):
            shutil.rmtree(partial, ignore_errors=True)

    def _remove_made(self) -> None:
        """The parent folders this run made, when they are still empty (it failed before writing)."""
        for folder in reversed(self.made):
            try:
                os.rmdir(folder)
            except OSError:
                break

    def staged(self) -> "_Staged":
        return _Staged(self)


class _Staged:
    def __init__(self, out: ReplacedOutput):
        self.out, self.tmp = out, None

    def __enter__(self) -> str:
        try:  # a kill while the folder is made is handled once it is recorded, and removes it
            with deferred_interrupts():
                self.tmp = tempfile.mkdtemp(prefix=os.path.basename(self.out._prefix) + "partial-",
                                            dir=os.path.dirname(self.out.output))
            os.chmod(self.tmp, 0o777 & ~umask())  # the mode of a folder made by os.makedirs, not mkdtemp's 0700
        except BaseException:
            self._discard()
            raise
        return self.tmp

    def __exit__(self, kind, value, tb) -> bool:
        try:
            if kind is None:
                self._put_in_place()
        finally:  # failed, killed, or put in place (then nothing is left at its name)
            self._discard()
        return False

    def _discard(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _put_in_place(self) -> None:
        try:
            check_replaceable(self.out.output, self.out.command)  # a file put there while the run computed
        except ValueError as err:
            raise ValueError(f"{err} The new output is kept in {self._keep_aside()}.") from None
        manifest = {"command": self.out.command, "files": _files(self.tmp)}
        atomic_write_text(os.path.join(self.tmp, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        old = None
        try:
            with deferred_interrupts():  # the two renames happen together, or the old output is put back; a kill -9
                if os.path.exists(self.out.output):  # between them is undone by the next run
                    old = tempfile.mkdtemp(prefix=os.path.basename(self.out._prefix) + "old-",
                                           dir=os.path.dirname(self.out.output))
                self._replace(old)
        finally:  # also when a kill that came during the renames is handled, as they end
            if old is not None and (self.tmp is None or not os.path.lexists(os.path.join(old, "previous"))):
                shutil.rmtree(old, ignore_errors=True)  # the replaced output, or the empty folder it came back from

    def _replace(self, old: str | None) -> None:
        """The staged folder to ``output``; ``output`` first into ``old``, and back there if that fails."""
        if old is not None:
            os.replace(self.out.output, os.path.join(old, "previous"))
        try:
            os.replace(self.tmp, self.out.output)
            self.tmp = None  # (put in place)
        except OSError as err:
            if old is not None:
                os.replace(os.path.join(old, "previous"), self.out.output)
            raise ValueError(f"--output {self.out.output} could not be replaced ({err.strerror}); it is as it was, "
                             f"and the new output is kept in {self._keep_aside()}") from None

    def _keep_aside(self) -> str:
        """The staged folder moved to ``<output>.new-*``, a name no later run removes; returns it."""
        parent, name = os.path.split(self.out.output)
        kept = tempfile.mkdtemp(prefix=name + ".new-", dir=parent)
        os.replace(self.tmp, kept)
        self.tmp = None
        return kept


def _missing_parents(folder: str) -> list[str]:
    """The folders from the first missing ancestor of ``folder`` down to it (empty when it exists)."""
    missing = []
    while not os.path.exists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return list(reversed(missing))
