"""The one interface between the evaluations and what computes them.

A :class:`Scorer` answers the three questions every evaluation asks of a causal LM: the negative log-likelihood of
each token given those before it, the most likely token after each of the last positions, and a greedy
continuation. The transformers model is one (:class:`hf_posenc.eval.scoring.TransformersScorer`, the chunked LM
head); a serving engine is another (:class:`hf_posenc.engines.vllm_engine.EngineLM`). The metrics ask
:func:`hf_posenc.eval.scoring.as_scorer` for one and never ask which engine it is; adding an engine is one module
that implements this protocol.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


class EngineError(RuntimeError):
    """The engine could not start or answer; the message holds its reason and the end of its log."""


class EngineRefused(Exception):
    """The engine would not take an input (its own words in the message)."""


def token_rows(input_ids: torch.Tensor) -> list[list[int]]:
    """``[T]`` or ``[batch, T]`` token ids as lists of ints, one per row (what an engine takes)."""
    ids = input_ids[None] if input_ids.dim() == 1 else input_ids
    return [[int(t) for t in row] for row in ids.cpu()]


def check_start(start: int, length: int) -> None:
    """The first scored token of a row of ``length`` tokens: one at least has a context, one at least is scored."""
    if not 1 <= start < length:
        raise ValueError(f"start must be in [1, {length - 1}], got {start}")


@runtime_checkable
class Scorer(Protocol):
    """``input_device``: where token ids go; ``config`` / ``generation_config``: the model's (the evaluations read a
    few of their fields)."""

    input_device: torch.device
    config: Any
    generation_config: Any

    def token_nll(self, input_ids: torch.Tensor, start: int = 1) -> torch.Tensor:
        """NLL (float32, nats) of tokens ``start .. T-1`` of each row given the tokens before:
        ``[batch, T - start]``."""

    def argmax_last(self, input_ids: torch.Tensor, n: int) -> torch.Tensor:
        """The most likely token after each of the last ``n`` positions of each row: ``[batch, n]`` (on the CPU)."""

    def greedy(self, input_ids: torch.Tensor, max_new_tokens: int, stop: list[int]) -> list[list[int]]:
        """Each row's greedy continuation, the new tokens only (at most ``max_new_tokens``, up to a ``stop``)."""
