"""The settings of a fine-tuning run, typed and checked on creation (before any model is loaded).

:class:`TrainSettings` holds what decides the trained weights (the schedule, the batch, the loss, the packing, the
precision); :class:`CheckpointSettings` what only decides how the run survives an interruption (how often it saves
a resumable checkpoint, where, and whether to continue from one). A run resumed from a checkpoint must have the same
:class:`TrainSettings` as the run that saved it (:mod:`hf_posenc.training.resume` compares them).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

PACKINGS = ("document", "stream", "stream-restart")
MIXED_PRECISIONS = ("no", "bf16", "fp16")
DTYPES = ("float32", "bfloat16", "float16")


def _whole(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")


def _number(name: str, value: Any, least: float, strict: bool) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or value < least or (strict and value == least):
        raise ValueError(f"{name} must be a number {'>' if strict else '>='} {least:g}, got {value!r}")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")


@dataclass(frozen=True)
class TrainSettings:
    """How a patched model is trained (``hf-posenc finetune``'s training flags, one field each).

    seq_len: tokens per packed training block and per held-out window. steps: optimizer steps. learning_rate: the
    peak (AdamW, linear warm-up over ``warmup_steps``, cosine decay). batch_size: blocks per device step;
    grad_accum: device steps per optimizer step. gradient_checkpointing: recompute activations in the backward pass.
    eval_windows: held-out windows of ``seq_len`` tokens per document. seed: data order, PoSE's skips,
    initialisation. chunked_loss: the loss over chunks of the LM head (never ``[tokens, vocab]`` logits).
    packing: how documents become blocks (``document``: none straddles two; ``stream``; ``stream-restart``: position
    ids start again after each EOS). dtype: the precision weights are loaded and trained in. mixed_precision:
    ``bf16``/``fp16`` autocast over float32 weights. s2_attn_group: LongLoRA's shifted sparse attention in groups of
    that many tokens while training (None: full attention). context_parallel_size: processes each sequence is split
    across. device: the torch device (None: cuda where there is one, else cpu); not part of the fingerprint (a run may
    resume on another device).
    """

    seq_len: int = 1024
    steps: int = 40
    learning_rate: float = 1e-4
    batch_size: int = 1
    grad_accum: int = 1
    warmup_steps: int = 0
    weight_decay: float = 0.0
    gradient_checkpointing: bool = True
    eval_windows: int = 4
    seed: int = 0
    chunked_loss: bool = True
    packing: str = "document"
    dtype: str = "float32"
    mixed_precision: str = "no"
    s2_attn_group: int | None = None
    context_parallel_size: int = 1
    device: str | None = None

    def __post_init__(self) -> None:
        _whole("--seq-len", self.seq_len, 2)
        for name, least in (("steps", 1), ("batch_size", 1), ("grad_accum", 1), ("warmup_steps", 0),
                            ("eval_windows", 1), ("context_parallel_size", 1)):
            _whole(f"--{name.replace('_', '-')}", getattr(self, name), least)
        _whole("--seed", self.seed, -2**63)
        _number("--learning-rate", self.learning_rate, 0.0, strict=True)
        _number("--weight-decay", self.weight_decay, 0.0, strict=False)
        _choice("--packing", self.packing, PACKINGS)
        _choice("--dtype", self.dtype, DTYPES)
        _choice("--mixed-precision", self.mixed_precision, MIXED_PRECISIONS)
        for name in ("gradient_checkpointing", "chunked_loss"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.s2_attn_group is not None:
            _whole("--s2-attn-group", self.s2_attn_group, 2)
        if self.device is not None and (not isinstance(self.device, str) or not self.device.strip()):
            raise ValueError(f"--device must be a torch device such as cpu, cuda or cuda:1, got {self.device!r}")

    def fingerprint(self) -> dict[str, Any]:
        """What a resumed run must share with the run that saved the checkpoint: every field but the device."""
        return {k: v for k, v in asdict(self).items() if k != "device"}


@dataclass(frozen=True)
class CheckpointSettings:
    """Resumable training. every: optimizer steps between checkpoints (weights, optimizer and scheduler state, RNG
    states, the losses so far) in ``folder`` (default ``<output>.checkpoints`` beside the output); the last two are
    kept, and the folder is removed once the trained model is saved. resume: continue the run whose checkpoints are
    in the folder (its settings must be the same); without it, a folder holding an earlier run's checkpoints is
    refused rather than trained over."""

    every: int = 0
    folder: str | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        _whole("--checkpoint-every", self.every, 0)
        if self.folder is not None and (not isinstance(self.folder, str) or not self.folder.strip()):
            raise ValueError(f"--checkpoint-dir must be a folder's path, got {self.folder!r}")
        if not isinstance(self.resume, bool):
            raise ValueError(f"resume must be True or False, got {self.resume!r}")

    def folder_for(self, output: str) -> str:
        """The checkpoint folder of a run writing ``output``."""
        return os.path.abspath(self.folder or os.path.normpath(output) + ".checkpoints")
