"""The cells of ``eval ppl``, by their keys (stored as the lists of ``as_list``, the same since the first release):
a window's perplexity, its key-token perplexity (LongPPL) and an evaluator's key positions; and the truncated
baseline every context gain past L is measured against."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import PosEncConfig
from .cells import NUMBER
from .key_tokens import KEY_FIELDS, POSITION_FIELDS
from .variants import Variant

WINDOW_FIELDS = {"tokens": NUMBER, "nll_sum": NUMBER, "bucket_sum": list, "bucket_cnt": list}


@dataclass(frozen=True)
class WindowCell:
    """A window's perplexity: ``length`` tokens of document ``doc`` (its token ``digest``) from token ``begin``."""

    length: int
    doc: str
    digest: str
    begin: int

    @property
    def window(self) -> "WindowCell":  # as every cell of a window names it
        return self

    def as_list(self) -> list:
        return [self.length, self.doc, self.digest, self.begin]


@dataclass(frozen=True)
class KeyTokensCell:
    """A window's key-token perplexity (LongPPL): judged by the method's own model with the truncated ``stride`` and
    thresholds ``alpha``/``beta``, or by the ``evaluator`` of that identity (its :class:`KeyPositionsCell`)."""

    window: WindowCell
    stride: int
    alpha: float
    beta: float
    evaluator: str | None = None

    def as_list(self) -> list:
        tail = ["evaluator", self.evaluator] if self.evaluator is not None else []
        return self.window.as_list() + ["key_tokens", self.stride, self.alpha, self.beta] + tail


@dataclass(frozen=True)
class KeyPositionsCell:
    """The positions of a window's key tokens as the ``evaluator`` judges them (its own cell)."""

    window: WindowCell
    stride: int
    alpha: float
    beta: float
    evaluator: str

    def as_list(self) -> list:
        return self.window.as_list() + ["key_positions", self.stride, self.alpha, self.beta, self.evaluator]


def ppl_cell(key: list) -> WindowCell | KeyTokensCell | KeyPositionsCell:
    """The cell of a stored key (the inverse of ``as_list``)."""
    window = WindowCell(*key[:4])
    if len(key) == 4:
        return window
    kind, stride, alpha, beta, *rest = key[4:]
    if kind == "key_positions":
        return KeyPositionsCell(window, stride, alpha, beta, *rest)
    return KeyTokensCell(window, stride, alpha, beta, rest[1] if rest else None)


CELL_FIELDS = {WindowCell: WINDOW_FIELDS, KeyTokensCell: KEY_FIELDS, KeyPositionsCell: POSITION_FIELDS}


@dataclass(frozen=True)
class Baseline:
    variant: Variant
    stride: int


def truncated_variant(original: int | None, stride: int | None, lengths: list[int],
                      checkpoint: PosEncConfig | None = None) -> Baseline | None:
    """The truncated-context baseline of a run (None when no length exceeds the original context): the unpatched
    model, or ``checkpoint`` (the RoPE scaling a checkpoint was saved with, restated: the checkpoint as it is),
    labelled with its context and stride (a cell computed with another stride is another cell)."""
    if original is None or max(lengths) <= original:
        return None
    stride = stride or max(1, original // 4)
    if not 1 <= stride < original:
        raise ValueError(f"--truncated-stride must be from 1 to the original context - 1 ({original - 1}: every "
                         f"scored token keeps at least one token before it), got {stride}")
    if checkpoint is not None:
        return Baseline(Variant(f"checkpoint-truncated-{original}-stride-{stride}", checkpoint), stride)
    return Baseline(Variant(f"none-truncated-{original}-stride-{stride}", PosEncConfig("none")), stride)


def add_context_gain(results: dict[str, dict], baseline: str) -> None:
    """Per variant and length past the original context: ``context_gain`` = the baseline's perplexity of the tokens
    past L over the variant's (> 1: the longer context helped; < 1: it hurt)."""
    for label, per_len in results.items():
        for n, r in per_len.items():
            base = results[baseline].get(n, {}).get("past_original")
            if r.get("past_original") and base and label != baseline:
                r["context_gain"] = base["ppl"] / r["past_original"]["ppl"]
