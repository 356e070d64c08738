"""Resumable fine-tuning: the checkpoint folder of one run.

transformers' Trainer saves a checkpoint every N optimizer steps (``checkpoint-<step>/``: the trainable weights, the
optimizer's and the scheduler's state, every RNG state, the losses so far; it resumes the data order by skipping
the batches already seen). This module keeps beside those checkpoints one file, ``hf_posenc-run.json``: what the
run is (its fingerprint: model, method, every training setting, PoSE, LoRA, the documents' digests), what was
measured before training (so that a resumed run does not measure it again) and the seconds trained up to each
checkpoint; it is written when training starts, after every check that can refuse the run. A run is resumed only
with the same fingerprint; a folder holding another run's checkpoints is refused, never trained over; a folder whose
run never reached a checkpoint holds nothing to resume and is started over; a checkpoint cut short by a kill (no
readable ``trainer_state.json``, the Trainer's last file) is removed and the one before it is used. Once the trained
model is saved, the checkpoints and the run file go (and the folder, when this run made it). One process only: the
Trainer's checkpoints of several processes are not resumed here (refused by name).
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import re
import shutil
from contextlib import contextmanager
from typing import Any, Iterator

from ..io.digests import comparable_identity
from ..io.files import _can_create_in, atomic_write_text
from ..io.output_folder import MANIFEST
from ..io.wording import first_names
from .settings import CheckpointSettings

RUN_FILE = "hf_posenc-run.json"
STATE_FILE = "trainer_state.json"  # the Trainer writes it last in a checkpoint: its presence marks a whole one
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_MISSING = "There were missing keys in the checkpoint model loaded: "


class _TiedKeysFilter(logging.Filter):
    """Drops the Trainer's 'missing keys' warning when every key it names is a tied weight: a checkpoint holds a
    tied weight once (SmolLM2's LM head is its embedding), and loading the one loads both."""

    def __init__(self, tied: set[str]):
        super().__init__()
        self.tied = tied

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(_MISSING):
            return True
        try:
            keys = set(ast.literal_eval(message[len(_MISSING):].rstrip(".")))
        except (ValueError, SyntaxError):
            return True
        return not keys <= self.tied


@contextmanager
def quiet_about_tied_weights(model) -> Iterator[None]:
    """Within it, resuming a checkpoint does not warn of 'missing' weights that are tied to ones it holds
    (``named_parameters`` lists a tied weight's second name only with ``remove_duplicate=False``)."""
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    tied = every - {name for name, _ in model.named_parameters()}
    trainer_log = logging.getLogger("transformers.trainer")
    quiet = _TiedKeysFilter(tied)
    trainer_log.addFilter(quiet)
    try:
        yield
    finally:
        trainer_log.removeFilter(quiet)


def document_digests(docs) -> list[list[str]]:
    """``[name, sha256 of the text]`` per document: what a run trained or measured on, by content."""
    return [[d.name, hashlib.sha256(d.text.encode("utf-8")).hexdigest()] for d in docs]


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))


def _whole(checkpoint: str) -> bool:
    """A checkpoint the Trainer finished writing: its state file, written last, is there and reads back."""
    try:
        with open(os.path.join(checkpoint, STATE_FILE), encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError):
        return False
    return True


def _documents(value: Any) -> bool:
    """Whether a fingerprint value is a list of documents (:func:`document_digests`)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, list) and len(v) == 2 for v in value)


def _shown(value: Any) -> str:
    """A fingerprint value as a refusal shows it: a list of documents as its length and names."""
    if _documents(value):
        names = [v[0] for v in value]
        return f"{len(value)} document(s) ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
    return repr(value)


def _difference(key: str, then: Any, now: Any) -> str:
    """How one fingerprint value changed, in words: documents of the same names whose text changed are named as
    such (their names alone would read the same on both sides)."""
    if _documents(then) and _documents(now) and [d[0] for d in then] == [d[0] for d in now]:
        changed = [name for (name, a), (_, b) in zip(then, now) if a != b]
        return f"{key}: the text of {first_names(changed, 3)} changed (same name)"
    return f"{key}: {_shown(then)} then, {_shown(now)} now"


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested fingerprint as ``{"training.learning_rate": 0.001, ...}`` (lists are leaves)."""
    if not isinstance(value, dict):
        return {prefix: value}
    got: dict[str, Any] = {}
    for k, v in value.items():
        got.update(_leaves(v, f"{prefix}.{k}" if prefix else k))
    return got


class ResumableRun:
    """The checkpoint folder of the run writing ``output`` (see the module). ``fingerprint``: what the run is."""

    def __init__(self, settings: CheckpointSettings, output: str, fingerprint: dict[str, Any], processes: int = 1):
        self.folder = settings.folder_for(output)
        self.every = settings.every
        self.resume = settings.resume
        self.fingerprint = _normal(fingerprint)
        self.stored: dict[str, Any] | None = None  # the run file of the run being resumed
        self.resumed_step = 0  # the step of the checkpoint training continues from
        self._made_folder = not os.path.isdir(self.folder)  # (the Trainer makes it before training begins)
        self._before: dict[str, Any] = {}
        if self.every or self.resume:  # a run without checkpoints never looks at the folder
            self._check(os.path.abspath(output), processes)

    @property
    def active(self) -> bool:
        """Whether this run saves checkpoints (it does when resumed, every as many steps as the run it resumes)."""
        return self.every > 0

    def _check(self, output: str, processes: int) -> None:
        """Refusals before any compute: several processes, a folder inside the output or holding it (one is
        replaced whole, the other removed), a file or an unwritable place, a folder of files hf_posenc did not write,
        another run's checkpoints, an earlier run's without --resume, --resume of a run already finished."""
        if processes > 1:
            raise ValueError(f"--checkpoint-every / --resume under {processes} processes: resuming the checkpoints of "
                             "several processes (each one's RNG state, sharded optimizer state) is not supported by "
                             "hf-posenc finetune yet; train on one process to resume, or without checkpoints")
        if os.path.commonpath([self.folder, output]) in (output, self.folder):
            raise ValueError(f"--checkpoint-dir {self.folder} and --output {output} lie one inside the other (the "
                             "output is replaced whole when the run ends, and the checkpoints removed): give folders "
                             "beside each other (the default is <output>.checkpoints)")
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise ValueError(f"--checkpoint-dir {self.folder} is a file, not a folder")
        parent = self.folder
        while not os.path.exists(parent):  # the folder, or the nearest folder above it that exists
            parent = os.path.dirname(parent)
        if not _can_create_in(parent):
            raise ValueError(f"--checkpoint-dir {self.folder}: nothing can be written in {parent}")
        run_file = os.path.join(self.folder, RUN_FILE)
        if not os.path.isfile(run_file):
            if os.path.isdir(self.folder) and os.listdir(self.folder):
                raise ValueError(f"--checkpoint-dir {self.folder} holds files that no hf-posenc finetune wrote "
                                 f"({', '.join(sorted(os.listdir(self.folder))[:3])}); give another folder")
            self._starting(output)
            return
        with open(run_file, encoding="utf-8") as f:
            stored = json.load(f)
        self._made_folder = stored.get("made_folder", False)
        if not self.checkpoints():  # the run stopped before its first checkpoint: nothing to resume
            print(f"{self.folder}: the earlier run stopped before its first checkpoint; training starts at step 0")
            os.unlink(run_file)
            self._starting(output)
            return
        if not self.resume:
            raise ValueError(f"{self.folder} holds the checkpoints of an earlier run of this output (trained to step "
                             f"{self.latest_step()} of {stored['fingerprint']['training']['steps']}): pass --resume "
                             "to continue it, or remove that folder to train again from the start")
        then, now = (_leaves({**f, "model": comparable_identity(f.get("model"))})
                     for f in (stored["fingerprint"], self.fingerprint))
        differ = sorted(k for k in set(then) | set(now) if then.get(k) != now.get(k))
        if differ:
            detail = "; ".join(_difference(k, then.get(k), now.get(k)) for k in differ[:6])
            raise ValueError(f"--resume: the checkpoints in {self.folder} belong to a run with other settings "
                             f"({detail}); resume it with the same ones, or remove that folder to train again from "
                             "the start")
        self.stored = stored
        self.every = self.every or stored["every"]

    def _starting(self, output: str) -> None:
        """No checkpoint to continue from: with --resume, said (and refused when --output already holds the
        finished run: its checkpoints went when it was saved)."""
        if not self.resume:
            return
        if os.path.isfile(os.path.join(output, MANIFEST)):
            raise ValueError(f"--resume: {output} already holds the finished run (its checkpoints were removed when it "
                             "was saved): nothing to resume; drop --resume to train it again")
        print(f"--resume: no checkpoint of an earlier run in {self.folder}; training starts at step 0")

    def checkpoints(self) -> list[tuple[int, str]]:
        """The whole checkpoints in the folder, ``(step, path)``, oldest first."""
        if not os.path.isdir(self.folder):
            return []
        found = []
        for name in os.listdir(self.folder):
            m = _CHECKPOINT.fullmatch(name)
            if m and _whole(os.path.join(self.folder, name)):
                found.append((int(m.group(1)), os.path.join(self.folder, name)))
        return sorted(found)

    def latest_step(self) -> int:
        got = self.checkpoints()
        return got[-1][0] if got else 0

    def resume_from(self) -> str | None:
        """The checkpoint training continues from (None: from the start); checkpoints cut short are removed."""
        if self.stored is None:
            return None
        whole = {path for _, path in self.checkpoints()}
        for name in os.listdir(self.folder):
            path = os.path.join(self.folder, name)
            if _CHECKPOINT.fullmatch(name) and path not in whole:
                shutil.rmtree(path)  # a kill while the Trainer wrote it
        got = self.checkpoints()
        if not got:
            return None
        self.resumed_step = got[-1][0]
        return got[-1][1]

    def before(self) -> dict[str, Any] | None:
        """What the resumed run measured before training (None: not resuming)."""
        return None if self.stored is None else self.stored["before"]

    def seconds_until(self, step: int) -> float:
        """The seconds the run trained up to the checkpoint at ``step`` (0 from the start)."""
        return float((self.stored or {}).get("seconds", {}).get(str(step), 0.0))

    def start(self, before: dict[str, Any]) -> None:
        """What a new run measured before training, kept for its run file (:meth:`begin`)."""
        self._before = before

    def begin(self) -> None:
        """Training starts (every check has passed): the run file of a new run, with what was measured before."""
        if self.stored is not None or not self.active:
            return
        before = self._before
        os.makedirs(self.folder, exist_ok=True)
        self.stored = {"fingerprint": self.fingerprint, "every": self.every, "before": _normal(before), "seconds": {},
                       "made_folder": self._made_folder}
        self._write()

    def saved(self, step: int, seconds: float) -> None:
        """The Trainer saved the checkpoint of ``step`` after ``seconds`` of training in all."""
        self.stored["seconds"][str(step)] = round(seconds, 1)
        self._write()

    def _write(self) -> None:
        atomic_write_text(os.path.join(self.folder, RUN_FILE), json.dumps(self.stored, indent=1))

    def finish(self) -> None:
        """The trained model is saved: its checkpoints and the run file go, and the folder when this run made it
        (a folder the user gave stays)."""
        if not os.path.isdir(self.folder):
            return
        for name in os.listdir(self.folder):
            if _CHECKPOINT.fullmatch(name):
                shutil.rmtree(os.path.join(self.folder, name))
        if os.path.isfile(os.path.join(self.folder, RUN_FILE)):
            os.unlink(os.path.join(self.folder, RUN_FILE))
        if self._made_folder and not os.listdir(self.folder):
            os.rmdir(self.folder)
