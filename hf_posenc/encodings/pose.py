"""Positional skip-wise training (PoSE; Zhu et al., "PoSE: Efficient Context Window Extension of LLMs via
Positional Skip-wise Training", ICLR 2024, arXiv:2309.10400, Sec. 3.2): train on windows of W tokens whose
position ids cover the target context [0, T) by skipping.

The window is cut into N chunks of lengths l_0..l_{N-1} (sum W; cut points drawn uniformly, so every chunk
has at least one token). Chunk i starts at st_i = l_0 + ... + l_{i-1} and is given the positions
st_i + u_i, ..., st_i + u_i + l_i - 1, where the skipping biases are drawn in order,
u_0 = 0 and u_i ~ U{u_{i-1}, ..., T - W}, so positions never decrease and the last one is at most T - 1.
(u_0 = 0 follows the authors' revised code, which starts every window at position 0 so that large relative
distances are covered more evenly.) Within a chunk positions are consecutive: the model sees short distances
as they are, and every distance up to T - 1 across chunks. The tokens of the window are consecutive text;
only their position ids skip.
"""

from __future__ import annotations

import torch

MAX_TARGET = 2**24  # float32 holds every whole number up to here: positions past it collapse


def check_pose(window: int, target: int, chunks: int) -> None:
    """Refuse windows, targets and chunk counts that make no PoSE window, naming the value."""
    for name, value in (("--pose-window", window), ("--target-length", target), ("--pose-chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    if window < 2:
        raise ValueError(f"--pose-window must be at least 2 tokens (a token and the one it predicts), got {window}")
    if target > MAX_TARGET:
        raise ValueError(f"--target-length {target} is past {MAX_TARGET:,} positions, where float32 positions stop "
                         "being exact (neighbouring positions would rotate alike)")
    if window >= target:
        raise ValueError(f"--pose-window ({window}) must be shorter than --target-length ({target}): PoSE trains on "
                         "windows shorter than the context they cover; for windows of the full length, drop "
                         "--pose-window and train at --seq-len")
    if chunks > window:
        raise ValueError(f"--pose-chunks ({chunks}) cannot exceed --pose-window ({window}): each chunk holds a token")


def chunk_positions(lengths: list[int], skips: list[int]) -> torch.Tensor:
    """Chunk ``i`` of ``lengths[i]`` tokens at positions ``st_i + skips[i] + (0 .. lengths[i] - 1)``."""
    return torch.cat([torch.arange(length, dtype=torch.long) + start + skip
                      for length, skip, start in zip(lengths, skips, _starts(lengths))])


def _starts(lengths: list[int]) -> list[int]:
    out, at = [], 0
    for length in lengths:
        out.append(at)
        at += length
    return out


def pose_position_ids(window: int, target: int, chunks: int, generator: torch.Generator) -> torch.Tensor:
    """The ``[window]`` position ids (int64) of one PoSE training window, drawn with ``generator``."""
    check_pose(window, target, chunks)
    cuts = torch.randperm(window - 1, generator=generator)[: chunks - 1].add_(1).sort().values.tolist()
    bounds = [0, *cuts, window]
    skips = [0]
    for _ in range(1, chunks):  # u_i drawn from [u_{i-1}, T - W]
        skips.append(int(torch.randint(skips[-1], target - window + 1, (1,), generator=generator)))
    return chunk_positions([b - a for a, b in zip(bounds, bounds[1:])], skips)


def pose_batch(count: int, window: int, target: int, chunks: int, seed: int) -> torch.Tensor:
    """``[count, window]`` position ids, row ``i`` drawn from a generator seeded with ``(seed, i)``: the same rows
    whatever the batch size, the order of the data or the number of processes."""
    rows = []
    for i in range(count):
        g = torch.Generator().manual_seed((seed * 1_000_003 + i) % 2**63)
        rows.append(pose_position_ids(window, target, chunks, g))
    return torch.stack(rows) if rows else torch.zeros(0, window, dtype=torch.long)
