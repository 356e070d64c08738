"""How an engine is set up (:class:`EngineSettings`), for serve-check and for an evaluation alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineSettings:
    """The engine that computes and how it is started.

    Args:
        name: the engine (an ``--engine`` value); None: the command's default (serve-check: ``vllm``; an
            evaluation: ``transformers``, this process).
        python: the interpreter that has vLLM (its own environment; None: this one, or ``HF_POSENC_VLLM_PYTHON``).
        tensor_parallel_size: vLLM's GPUs per model.
        args: more ``vllm.LLM`` keywords.
        allow_long: serve-check only: start vLLM for the longest length even past what it derives from
            ``config.json`` (``VLLM_ALLOW_LONG_MAX_MODEL_LEN``, as a deployment forcing ``--max-model-len`` does).
    """

    name: str | None = None
    python: str | None = None
    tensor_parallel_size: int = 1
    args: dict[str, Any] = field(default_factory=dict)
    allow_long: bool = False

    def given(self) -> list[str]:
        """The flags of the settings that differ from their defaults (the ones that set up vLLM)."""
        return [flag for flag, set_ in (("--allow-long", self.allow_long), ("--engine-python", self.python),
                                        ("--tensor-parallel-size", self.tensor_parallel_size != 1),
                                        ("--engine-arg", bool(self.args))) if set_]
