"""Evaluation cells: the unit of work that is computed once, by one process, and kept.

A cell is one variant's number(s) at one point of the task's grid (a perplexity window, a passkey
(length, depth) batch of keys, ...), keyed by a JSON list. With an output folder, each finished cell is
appended to ``<output>/cells.jsonl`` at once (one ``write`` of one line, flushed and fsynced), after a
first line that records the setup's fingerprint (model and its revision or file digest, the task's
settings, the seed, the versions), written with the first cell: a run refused or failing before any cell
leaves no cells file. Run again, the same command skips the cells already there and says
``resumed K of N cells``; a different setup in the same folder is refused, naming what differs, unless
``overwrite`` (torch's build tag aside: a CPU run can be resumed on a GPU with the same torch release, see
:func:`resumable`). A method whose frequencies follow the lengths seen so far (dynamic NTK, dynamic YaRN, LongRoPE)
is patched afresh before each of its cells, so that a cell's numbers never depend on which cells ran before
it in the same process (resumed, shared out or not). A line cut short by a kill is ignored (that cell is computed
again). Results pass through JSON before they are used, so a resumed report equals an uninterrupted one. Each cell line
also records the seconds its computation took, so that a run resumed over several calls can still say what it cost in
all (:meth:`CellStore.compute`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from ..io.digests import comparable_identity
from ..io.files import atomic_write_text
from ..io.reports import NOT_RECORDED
from ..methods.rope import DYNAMIC
from ..patching import trying
from .processes import Processes
from .variants import Variant

CELLS_FILE = "cells.jsonl"


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``["model.revision: 'a' -> 'b'", ...]``: the leaves where two fingerprints differ."""
    a, b = _flat(old), _flat(new)
    return [f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}" for k in sorted(set(a) | set(b))
            if a.get(k, "<absent>") != b.get(k, "<absent>")]


def _tokenizer_by_files(fingerprint: dict[str, Any]) -> Any:
    """The settings without the tokenizer's path when the tokenizer is the model folder's own: the folder's files
    digest covers its tokenizer files (a tokenizer from elsewhere is still compared by its path)."""
    model, settings = fingerprint["model"], fingerprint.get("settings")
    if not (isinstance(model, dict) and "files" in model and isinstance(settings, dict)):
        return settings
    tokenizer, folder = settings.get("tokenizer"), model.get("model")
    if isinstance(tokenizer, str) and isinstance(folder, str) \
            and os.path.normpath(tokenizer) == os.path.normpath(folder):
        return {k: v for k, v in settings.items() if k != "tokenizer"}
    return settings


# the first hf_posenc release that computes every cell as this one does: cells of it or a later release resume; bump
# it to this release's version whenever a change alters what a cell holds (a formula, a window, a prompt)
CELLS_SINCE = "0.1.0"


# before this release, a variant computed after "none" on a checkpoint saved with a RoPE scaling started from the model
# without that scaling ("none" took it off): such cells are refused (:func:`_after_none`)
FROM_CHECKPOINT_SINCE = "0.2.1"


def _release(version: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in str(version).split("+", 1)[0].split("."))
    except ValueError:
        return None


def _hf_posenc_cells(version: Any) -> Any:
    """hf_posenc's version as a resume compares it: every release from :data:`CELLS_SINCE` on computes the same
    cells (one value for them all); an earlier one stays itself, so its cells are refused, naming it."""
    release, since = _release(version), _release(CELLS_SINCE)
    return f"cells of {CELLS_SINCE} or later" if release is not None and release >= since else version


def resumable(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint as a resume compares it: torch's version without its build tag (``2.13.0+cpu`` and
    ``2.13.0+cu130`` are one release built for other devices; each cell records the device it was computed on,
    and a report counts its cells by device), hf_posenc's by whether it computes cells as this release does
    (:data:`CELLS_SINCE`), a local model by its files (:func:`comparable_identity`). Every other field,
    transformers' version included, must match."""
    fingerprint = {**fingerprint, "model": comparable_identity(fingerprint["model"]),
                   "settings": _tokenizer_by_files(fingerprint)} if "model" in fingerprint else fingerprint
    versions = fingerprint.get("versions")
    if not isinstance(versions, dict):
        return fingerprint
    versions = {**versions, "hf_posenc": _hf_posenc_cells(versions.get("hf_posenc"))}
    if isinstance(versions.get("torch"), str):
        versions["torch"] = versions["torch"].split("+", 1)[0]
    return {**fingerprint, "versions": versions}


def _key_id(label: str, key: list) -> str:
    return json.dumps([label, *key])


def _normal(data: Any) -> Any:
    return json.loads(json.dumps(data))


# a field type of a cell result: an int or float (NaN included: a computation may overflow), not a bool
NUMBER = "number"
Fields = dict[str, Any]  # a cell result's fields and their types (NUMBER, list, dict)


def _fits(value: Any, kind: Any) -> bool:
    if kind == NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def result_fits(result: Any, fields: Fields | None) -> bool:
    """Whether a cell result read from a file has every field its task's results have, each of its type."""
    if fields is None:
        return True
    return isinstance(result, dict) and all(k in result and _fits(result[k], t) for k, t in fields.items())


def _is_cell(item: Any) -> bool:
    """Whether a parsed line has the fields of a cell line, each of its type."""
    if not isinstance(item, dict) or item.get("kind") != "cell" or "result" not in item:
        return False
    seconds = _recorded_seconds(item)
    timed = seconds is None or (isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0)
    return (isinstance(item.get("variant"), str) and isinstance(item.get("key"), list)
            and isinstance(item.get("config"), dict) and timed and isinstance(item.get("device", ""), str))


def _describe(item: Any) -> str:
    if not isinstance(item, dict):
        return f"a JSON {type(item).__name__}, not an object"
    missing = [k for k in ("kind", "variant", "config", "key", "result") if k not in item]
    if missing:
        return f"no {', '.join(missing)}"
    return "a field of the wrong type: " + ", ".join(f"{k}={item[k]!r}"[:60] for k in ("kind", "variant", "key"))


def _recorded_seconds(item: dict[str, Any]) -> float | None:
    """A cell line's seconds. Tune cells written before the lines carried them timed themselves inside the
    result; that time comes first, as the tune's budget counted it, so that a resumed run decides the same."""
    result = item.get("result")
    if isinstance(result, dict) and "seconds" in result:
        return result["seconds"]
    return item.get("seconds")


def _after_none(path: str, stored: dict[str, Any]) -> tuple[str, str] | None:
    """(a variant, the release) of the first cell a release before :data:`FROM_CHECKPOINT_SINCE` computed after a cell
    of "none" on a checkpoint saved with a RoPE scaling (the stored fingerprint names its ``checkpoint_scaling``),
    in the file's order, the order they were computed in; None when there is none."""
    version = (stored.get("versions") or {}).get("hf_posenc")
    release = _release(version)
    if "checkpoint_scaling" not in stored or release is None or release >= _release(FROM_CHECKPOINT_SINCE):
        return None
    seen = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if not _is_cell(item):
                continue
            if item["config"].get("method") == "none":
                seen = True
            elif seen:
                return item["variant"], version
    return None


class CellStore:
    """The finished cells of one run folder (or, without a folder, of this run only)."""

    def __init__(self, output: str | None, fingerprint: dict[str, Any], processes: Processes,
                 overwrite: bool = False, device: str | None = None):
        self.path = os.path.join(output, CELLS_FILE) if output else None
        self.device = device  # what computes this call's cells (recorded with each; not part of the fingerprint)
        self.fingerprint = _normal(fingerprint)
        self.done: dict[str, Any] = {}
        self.kept: dict[str, int] = {}  # the cells found in the file (computed by an earlier run): their line
        self.configs: dict[str, list[dict[str, Any]]] = {}  # label -> the configs of its finished cells
        self.seconds: dict[str, float] = {}  # cell id -> the seconds it took (cells of older releases have none)
        self.devices: dict[str, str] = {}  # cell id -> what computed it (cells of older releases have none)
        self.used: set[str] = set()  # the cells this run's results are made of
        if self.path is None:
            return
        if processes.is_main:
            self._prepare(overwrite)
        processes.barrier()
        self._read()
        processes.barrier()  # every process has read the same finished cells before any appends a new one, so
        # that all agree on what is pending and on its share-out

    def _prepare(self, overwrite: bool) -> None:
        """Check a cells file left by an earlier run (or discard it on ``overwrite``). A new file is written only
        with the first cell (see :meth:`_append`): a run that fails before it leaves no cells file behind."""
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:
            first = f.readline()
        try:
            stored = json.loads(first)["fingerprint"]
        except (ValueError, KeyError, TypeError):  # not written by hf_posenc: never deleted, not even on --overwrite
            raise ValueError(f"{self.path} is not a cells file of hf_posenc (first line: {first[:80]!r}); use another "
                             "--output, or move that file away") from None
        if overwrite:
            os.remove(self.path)
            return
        changed = differences(resumable(stored), resumable(self.fingerprint))
        if changed:
            raise ValueError(f"{self.path} holds the cells of another setup ({'; '.join(changed)}); use another "
                             "--output, or --overwrite to discard them")
        wrong = _after_none(self.path, stored)
        if wrong:
            raise ValueError(f"{self.path} holds cells of {wrong[0]!r} computed after 'none' by hf_posenc "
                             f"{wrong[1]}, on a checkpoint saved with a RoPE scaling: before {FROM_CHECKPOINT_SINCE} "
                             "those started from the model without its scaling, which 'none' had taken off, not from "
                             "the checkpoint; use --overwrite to compute them again, or another --output")
        with open(self.path, "rb+") as f:  # a line cut short by a kill is closed, so the next cell starts afresh
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")

    def _read(self) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                try:
                    item = json.loads(line)
                except ValueError:  # a line cut short by a kill: that cell is computed again
                    continue
                if number == 1 and isinstance(item, dict) and item.get("kind") == "setup":
                    continue
                self._take(item, number)

    def _take(self, item: Any, number: int) -> None:
        """One finished cell of the file (line ``number``), checked field by field."""
        if not _is_cell(item):
            raise ValueError(f"line {number} of {self.path} is not a cell of this run ({_describe(item)}); "
                             "use another --output, or --overwrite to start it anew")
        cell = _key_id(item["variant"], item["key"])
        self.done[cell] = item["result"]
        self.kept[cell] = number
        configs = self.configs.setdefault(item["variant"], [])
        if item["config"] not in configs:
            configs.append(item["config"])
        seconds = _recorded_seconds(item)
        if seconds is not None:
            self.seconds[cell] = seconds
        if "device" in item:
            self.devices[cell] = item["device"]

    def check(self, variants: list[Variant]) -> None:
        """Refuse a label whose configuration differs from one its finished cells were computed with (every
        cell line is checked, not only the last of the label)."""
        for v in variants:
            now = _normal(v.config.to_dict())
            for old in self.configs.get(v.label, []):
                if old != now:
                    raise ValueError(f"variant {v.label!r} is {now} now, but finished cells of it in {self.path} "
                                     f"were computed with {old} ({'; '.join(differences(old, now))}); give it "
                                     "another label, or --overwrite")

    def check_results(self, cells: list[tuple[str, list]], fields: Fields | Callable[[list], Fields] | None) -> None:
        """Refuse a finished cell of the file whose result lacks a field of the task (or has one of another type)."""
        for label, key in cells:
            cell = _key_id(label, key)
            if cell in self.kept and not result_fits(self.done[cell], fields(key) if callable(fields) else fields):
                raise ValueError(f"line {self.kept[cell]} of {self.path} is not a cell of this run (its result lacks "
                                 f"a field of the task, or has one of another type); use another --output, or "
                                 "--overwrite to start it anew")

    def _append(self, item: dict[str, Any]) -> None:
        if not os.path.exists(self.path):  # the first cell: the file starts whole, with its setup line, unless
            # another process of this run created it meanwhile (then that one stands), so no process ever reads
            # a cells file without its setup line
            atomic_write_text(self.path, json.dumps({"kind": "setup", "fingerprint": self.fingerprint}) + "\n",
                              replace=False)
        line = (json.dumps(item) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write of one line: lines of several processes never interleave
            os.fsync(fd)
        finally:
            os.close(fd)

    def add(self, variant: Variant, key: list, result: Any, seconds: float) -> Any:
        result, seconds = _normal(result), round(seconds, 3)
        self.done[_key_id(variant.label, key)] = result
        self.seconds[_key_id(variant.label, key)] = seconds
        line = {"kind": "cell", "variant": variant.label, "config": variant.config.to_dict(), "key": key,
                "result": result, "seconds": seconds}
        if self.device is not None:
            self.devices[_key_id(variant.label, key)] = line["device"] = self.device
        if self.path is not None:
            self._append(line)
        return result

    def seconds_of(self, label: str, keys: list[list]) -> float:
        """The recorded seconds of ``label``'s cells ``keys`` in all (untimed cells count nothing)."""
        return round(sum(self.seconds.get(_key_id(label, k), 0.0) for k in keys), 3)

    def compute(self) -> dict[str, Any]:
        """What the cells this run's results are made of cost, in whichever call computed them:
        ``{"seconds": sum of their recorded seconds, "cells": how many, "untimed": how many of them were
        computed by a release that recorded no seconds, "devices": {what computed them: how many cells}}``
        (a resumed run's cells may come from another machine than the one of this call)."""
        timed = [self.seconds[c] for c in self.used if c in self.seconds]
        devices: dict[str, int] = {}
        for c in self.used:
            where = self.devices.get(c, NOT_RECORDED)
            devices[where] = devices.get(where, 0) + 1
        return {"seconds": round(sum(timed), 3), "cells": len(self.used), "untimed": len(self.used) - len(timed),
                "devices": dict(sorted(devices.items()))}


def run_cells(model, variants: list[Variant], keys: dict[str, list[list]], compute: Callable[[Variant, list], Any],
              store: CellStore, processes: Processes, progress: bool = True, desc: str = "",
              fields: Fields | Callable[[list], Fields] | None = None) -> dict[str, dict]:
    """Compute every cell of ``keys`` (label -> the variant's cell keys) that ``store`` does not hold, this
    process its share, each with the model patched by its variant; returns label -> the results in the
    order of its keys, complete on every process. The model is left as it was. ``fields``: the fields of the
    task's results (or a function of the cell key giving them), which every result read from the file must have."""
    store.check(variants)
    store.check_results([(v.label, k) for v in variants for k in keys[v.label]], fields)
    total = sum(len(k) for k in keys.values())
    pending = [(v, k) for v in variants for k in keys[v.label] if _key_id(v.label, k) not in store.done]
    resumed = sum(_key_id(v.label, k) in store.kept for v in variants for k in keys[v.label])
    if processes.is_main and resumed:
        print(f"resumed {resumed} of {total} cells from {store.path}", file=sys.stderr)
    mine = processes.share(pending)
    computed = []
    with trying(model, [v.config for v in variants]) as apply:  # a variant that does not fit costs nothing
        bar = tqdm(total=len(mine), desc=desc, disable=not progress, leave=False)
        for v in variants:
            todo = [k for w, k in mine if w is v]
            if todo:
                apply(v.config)
            for k in todo:
                if v.config.method in DYNAMIC:
                    apply(v.config)  # the state of the lengths seen so far starts afresh
                bar.set_postfix_str(v.label)
                start = time.perf_counter()
                result = store.add(v, k, compute(v, k), time.perf_counter() - start)
                cell = _key_id(v.label, k)
                computed.append((cell, result, store.seconds[cell], store.devices.get(cell)))
                bar.update(1)
        bar.close()
    gathered = processes.gather(computed)
    store.done.update((cell, result) for cell, result, _, _ in gathered)
    store.seconds.update((cell, seconds) for cell, _, seconds, _ in gathered)
    store.devices.update((cell, device) for cell, _, _, device in gathered if device is not None)
    store.used.update(_key_id(v.label, k) for v in variants for k in keys[v.label])
    return {v.label: [store.done[_key_id(v.label, k)] for k in keys[v.label]] for v in variants}
