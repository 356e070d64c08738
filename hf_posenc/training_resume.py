"""Resumable fine-tuning: the checkpoint folder of one run.

transformers' Trainer saves a checkpoint every N optimizer steps (``checkpoint-<step>/``: the trainable weights, the
optimizer's and the scheduler's state, every RNG state, the losses so far; it resumes the data order by skipping
the batches already seen). This module keeps beside those checkpoints one file, ``hf_posenc-run.json``: what the
run is (its fingerprint: model, method, every training setting, PoSE, LoRA, the documents' digests), what was
measured before training (so that a resumed run does not measure it again) and the seconds trained up to each
checkpoint. A run is resumed only with the same fingerprint; a folder holding another run's checkpoints is refused,
never trained over; a checkpoint cut short by a kill (no ``trainer_state.json``, the Trainer's last file) is
removed and the one before it is used. Once the trained model is saved, the folder goes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from typing import Any

from .files import atomic_write_text
from .training_settings import CheckpointSettings

RUN_FILE = "hf_posenc-run.json"
STATE_FILE = "trainer_state.json"  # the Trainer writes it last in a checkpoint: its presence marks a whole one
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def document_digests(docs) -> list[list[str]]:
    """``[name, sha256 of the text]`` per document: what a run trained or measured on, by content."""
    return [[d.name, hashlib.sha256(d.text.encode("utf-8")).hexdigest()] for d in docs]


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))


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

    def __init__(self, settings: CheckpointSettings, output: str, fingerprint: dict[str, Any]):
        self.folder = settings.folder_for(output)
        self.every = settings.every
        self.resume = settings.resume
        self.fingerprint = _normal(fingerprint)
        self.stored: dict[str, Any] | None = None  # the run file of the run being resumed
        self.resumed_step = 0  # the step of the checkpoint training continues from
        self._check(os.path.abspath(output))

    @property
    def active(self) -> bool:
        """Whether this run saves checkpoints (it does when resumed, every as many steps as the run it resumes)."""
        return self.every > 0

    def _check(self, output: str) -> None:
        """Refusals before any compute: a folder inside the output (replaced whole), a folder of files hf_posenc did
        not write, another run's checkpoints, or an earlier run's without --resume."""
        if os.path.commonpath([self.folder, output]) == output:
            raise ValueError(f"--checkpoint-dir {self.folder} lies inside --output {output}, which the finished run "
                             "replaces whole: give a folder beside it (the default is <output>.checkpoints)")
        run_file = os.path.join(self.folder, RUN_FILE)
        if not os.path.isfile(run_file):
            if os.path.isdir(self.folder) and os.listdir(self.folder):
                raise ValueError(f"--checkpoint-dir {self.folder} holds files that no hf-posenc finetune wrote "
                                 f"({', '.join(sorted(os.listdir(self.folder))[:3])}); give another folder")
            if self.resume:
                print(f"--resume: no checkpoint of an earlier run in {self.folder}; training starts at step 0")
            return
        with open(run_file, encoding="utf-8") as f:
            stored = json.load(f)
        done = self.latest_step()
        if not self.resume:
            raise ValueError(f"{self.folder} holds the checkpoints of an earlier run of this output (trained to step "
                             f"{done} of {stored['fingerprint']['training']['steps']}): pass --resume to continue "
                             "it, or remove that folder to train again from the start")
        then, now = _leaves(stored["fingerprint"]), _leaves(self.fingerprint)
        differ = sorted(k for k in set(then) | set(now) if then.get(k) != now.get(k))
        if differ:
            detail = "; ".join(f"{k}: {then.get(k)} then, {now.get(k)} now" for k in differ[:6])
            raise ValueError(f"--resume: the checkpoints in {self.folder} belong to a run with other settings ({detail}); "
                             "resume it with the same ones, or remove that folder to train again from the start")
        self.stored = stored
        self.every = self.every or stored["every"]

    def checkpoints(self) -> list[tuple[int, str]]:
        """The whole checkpoints in the folder, ``(step, path)``, oldest first."""
        if not os.path.isdir(self.folder):
            return []
        found = []
        for name in os.listdir(self.folder):
            m = _CHECKPOINT.fullmatch(name)
            if m and os.path.isfile(os.path.join(self.folder, name, STATE_FILE)):
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
        """Write the run file (a new run), with what was measured before training."""
        if self.stored is not None:
            return
        os.makedirs(self.folder, exist_ok=True)
        self.stored = {"fingerprint": self.fingerprint, "every": self.every, "before": _normal(before), "seconds": {}}
        self._write()

    def saved(self, step: int, seconds: float) -> None:
        """The Trainer saved the checkpoint of ``step`` after ``seconds`` of training in all."""
        self.stored["seconds"][str(step)] = round(seconds, 1)
        self._write()

    def _write(self) -> None:
        atomic_write_text(os.path.join(self.folder, RUN_FILE), json.dumps(self.stored, indent=1))

    def finish(self) -> None:
        """The trained model is saved: its checkpoints go."""
        if os.path.isdir(self.folder):
            shutil.rmtree(self.folder)
