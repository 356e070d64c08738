"""Remapped relative positions: training-free context extension by changing the relative position that a
query at position ``i`` sees of a key at ``j`` (``d = i - j``), piecewise.

Each scheme cuts the causal ``[query x key]`` plane into *pieces*. Within one piece the query is read at
position ``query_at(i)`` and the key at ``key_at(j)``, so the RoPE score sees the relative position
``query_at(i) - key_at(j)``; a piece covers the keys with ``d_min <= i - j <= d_max`` and
``key_lo <= j < key_hi``. The pieces of a scheme do not overlap and together cover every ``j <= i``, so
attention over the whole row is the log-sum-exp merge of the pieces' attentions (one softmax, exactly).

Pure position arithmetic: no model, no attention. ``hf_posenc.adapters.remapped_attention`` runs it.

- ``SelfExtend`` -- Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning",
  arXiv:2401.01325: ``r = d`` for ``d < W``, else ``floor(i/G) + W - W/G - floor(j/G)``.
- ``ReRoPE`` -- Su 2023, "Rectified Rotary Position Embeddings" (kexue.fm/archives/9708, bojone/rerope):
  ``r = min(d, w)``; queries scaled by ``max(1, ln(i + 1) / ln L)`` (the reference patch's log-n scaling).
- ``LeakyReRoPE`` -- same source: ``r = d`` for ``d < w``, else ``w + (d - w) / k``.
- ``String`` -- An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?",
  arXiv:2410.18745 (HKUNLP/STRING): ``r = d`` for ``d < S``, else ``d - S + W``; cos and sin scaled by
  ``attention_factor`` (so every score by its square), as the reference does. Here the key at ``d = S``
  belongs to the shifted piece only (the reference's two flash windows both count it).
- ``DualChunk`` -- An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models" (DCA),
  arXiv:2402.17463 (HKUNLP/ChunkLlama): chunks of ``c = s - w`` positions; keys are read at ``j mod c``;
  a query reads at ``i mod c`` within its own chunk, at ``c + min(i mod c, w)`` against the previous chunk,
  and at ``s`` against older chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

Positions = Callable[[torch.Tensor], torch.Tensor]
INF = math.inf


@dataclass(frozen=True)
class Piece:
    """One region of the causal plane and the positions its queries and keys are read at.

    ``query_at``: new query positions from positions (float tensor); None keeps them. ``key_map``: the name
    of the scheme's key map (``"same"``: keys keep their positions)."""

    query_at: Positions | None = None
    key_map: str = "same"
    d_min: int = 0
    d_max: float = INF
    key_lo: int = 0
    key_hi: float = INF


class Scheme:
    """A remapping of relative positions: its pieces, its key maps, optional query scaling and score scale."""

    score_scale: float = 1.0  # every score multiplied by this (STRING's attention factor squared)

    def key_maps(self) -> dict[str, Positions]:
        return {}

    def pieces(self, a: int, b: int) -> list[Piece]:
        """The pieces for the queries at positions ``a .. b - 1`` (one block of ``blocks``)."""
        raise NotImplementedError

    def blocks(self, a: int, b: int, size: int) -> Iterator[tuple[int, int]]:
        """Query blocks covering positions ``a .. b - 1``, each at most ``size`` long and inside one region
        where ``pieces`` holds."""
        for s in range(a, b, size):
            yield s, min(b, s + size)

    def query_scale(self, positions: torch.Tensor) -> torch.Tensor | None:
        """A factor per query position (float), or None."""
        return None

    def longest(self, original: int) -> int | None:
        """The longest input whose remapped relative positions all stay below ``original``; None: any."""
        return None


class SelfExtend(Scheme):
    def __init__(self, group_size: int, window: int):
        self.g, self.w = group_size, window

    def key_maps(self):
        return {"grouped": lambda j: torch.div(j, self.g, rounding_mode="floor")}

    def pieces(self, a, b):
        g, w = self.g, self.w
        return [Piece(d_max=w - 1),
                Piece(query_at=lambda i: torch.div(i, g, rounding_mode="floor") + (w - w // g), key_map="grouped",
                      d_min=w)]

    def longest(self, original):
        return (original - self.w) * self.g + self.w


def log_n_scale(positions: torch.Tensor, original: int) -> torch.Tensor:
    """``max(1, ln(p + 1) / ln L)``: ReRoPE's query scaling (bojone/rerope), so that attention entropy stays
    as it was at the trained length ``L``."""
    return (torch.log(positions.double() + 1) / math.log(original)).clamp(min=1.0).float()


class ReRoPE(Scheme):
    def __init__(self, window: int, original: int, logn_scaling: bool, leak: float | None = None):
        self.w, self.original, self.logn, self.leak = window, original, logn_scaling, leak

    def key_maps(self):
        if self.leak is None:
            return {"origin": lambda j: torch.zeros_like(j)}
        return {"leaky": lambda j: j / self.leak}

    def pieces(self, a, b):
        w, k = self.w, self.leak
        if k is None:
            far = Piece(query_at=lambda i: torch.full_like(i, w), key_map="origin", d_min=w)
        else:
            far = Piece(query_at=lambda i: i / k + (w - w / k), key_map="leaky", d_min=w)
        return [Piece(d_max=w - 1), far]

    def query_scale(self, positions):
        return log_n_scale(positions, self.original) if self.logn else None

    def longest(self, original):
        return None if self.leak is None else int(self.w + (original - 1 - self.w) * self.leak) + 1


class String(Scheme):
    def __init__(self, shifted_offset: int, local_window: int, attention_factor: float):
        self.offset, self.local = shifted_offset, local_window
        self.score_scale = attention_factor**2

    def pieces(self, a, b):
        shift = self.local - self.offset
        return [Piece(d_max=self.offset - 1), Piece(query_at=lambda i: i + shift, d_min=self.offset)]

    def longest(self, original):
        return original + self.offset - self.local


class DualChunk(Scheme):
    def __init__(self, chunk_size: int, local_window: int):
        self.s, self.w = chunk_size, local_window
        self.c = chunk_size - local_window

    def key_maps(self):
        return {"in_chunk": lambda j: torch.remainder(j, self.c)}

    def blocks(self, a, b, size):
        s = a
        while s < b:
            e = min(b, s + size, (s // self.c + 1) * self.c)  # never across a chunk boundary
            yield s, e
            s = e

    def pieces(self, a, b):
        c, w, s = self.c, self.w, self.s
        n = a // c  # the chunk of every query of the block
        out = [Piece(query_at=lambda i: torch.remainder(i, c), key_map="in_chunk", key_lo=n * c)]
        if n >= 1:
            out.append(Piece(query_at=lambda i: c + torch.remainder(i, c).clamp(max=w), key_map="in_chunk",
                             key_lo=(n - 1) * c, key_hi=n * c))
        if n >= 2:
            out.append(Piece(query_at=lambda i: torch.full_like(i, s), key_map="in_chunk", key_hi=(n - 1) * c))
        return out
