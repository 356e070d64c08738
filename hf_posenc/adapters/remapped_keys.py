"""Queries and keys read at remapped positions: rotated further from where transformers rotated them, on the
dimensions a layer's RoPE rotates (all of the head; the first ones under partial rotary, Phi; the last ones
under MLA, DeepSeek's decoupled RoPE part), with that layer's own frequencies (a checkpoint's scaled ones
included: RoPE composes, so rotating by ``a`` then ``b`` is rotating by ``a + b``; the scaling of cos and sin
that transformers applied stays, a rotation keeps norms). The other dimensions are left as they are.

Every rotation is in the rotate-half layout of the rotated dimensions (transformers' RoPE; DeepSeek's
interleaved weights come out of its rotation in that layout too)."""

from __future__ import annotations

import torch

from ..encodings.remap import Scheme
from ..encodings.rope import apply_rotary


def turned(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor, first: int = 0) -> torch.Tensor:
    """``x`` rotated further by ``delta`` positions on the ``2 * len(inv_freq)`` dimensions from ``first`` (none
    where every ``delta`` is 0)."""
    if not bool(delta.any()):
        return x
    stop = first + 2 * inv_freq.shape[-1]
    if first == 0 and stop == x.shape[-1]:
        return apply_rotary(x, delta, inv_freq)
    return torch.cat((x[..., :first], apply_rotary(x[..., first:stop], delta, inv_freq), x[..., stop:]), dim=-1)


class RotationTables:
    """Per key map, the cos and sin that turn keys at positions ``0 .. n - 1`` from ``p`` to ``map(p)``: angles
    ``(map(p) - p) * inv_freq`` in float64 as :func:`encodings.rope.apply_rotary` takes them, kept in float32 and
    grown by doubling. They depend on positions alone, so every layer of one RoPE and every call shares them (no
    trig per layer and step); they are not pickled (rebuilt on first use). Keys whose map leaves them where they
    are (DCA's first chunk) are not rotated at all. ``first``: the first rotated dimension of the head."""

    def __init__(self, scheme: Scheme, inv_freq: torch.Tensor, first: int = 0):
        self.scheme, self.inv_freq = scheme, inv_freq.detach().float().clone()  # the scheme, not its maps: pickles
        self.first = first
        self.held: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor, int]] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "held": {}}

    def identity(self) -> tuple:
        """What rotated keys depend on besides the keys and the scheme: the frequencies and the rotated dimensions."""
        if "_identity" not in self.__dict__:
            self._identity = (tuple(self.inv_freq.tolist()), self.first)
        return self._identity

    def turn(self, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """``x`` (queries) rotated further by ``delta`` positions."""
        return turned(x, delta, self.inv_freq, self.first)

    def table(self, name: str, stop: int, device) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(cos, sin) ``[size, d / 2]`` for positions ``0 .. size - 1`` (``size >= stop``) and the number of
        leading positions the map leaves in place."""
        key = (name, str(device))
        held = self.held.get(key)
        if held is None or held[0].shape[0] < stop:
            size = max(1024, 1 << (stop - 1).bit_length())
            wide = torch.float32 if device.type == "mps" else torch.float64
            pos = torch.arange(size, device=device)
            delta = self.scheme.key_maps()[name](pos) - pos
            moved = (delta != 0).nonzero()
            unmoved = int(moved[0]) if len(moved) else size
            angles = delta.to(wide)[:, None] * self.inv_freq.to(device=device, dtype=wide)[None]
            held = self.held[key] = (angles.cos().float(), angles.sin().float(), unmoved)
        return held

    def rotate(self, keys: torch.Tensor, name: str, start: int) -> torch.Tensor:
        """``keys`` ``[b, h, n, d]`` at positions ``start ..`` read at ``map(p)``, in their dtype."""
        n = keys.shape[2]
        cos, sin, unmoved = self.table(name, start + n, keys.device)
        if start + n <= unmoved:
            return keys
        c, s = cos[start : start + n], sin[start : start + n]
        v = keys.float()
        lo, half = self.first, c.shape[-1]
        mid, hi = lo + half, lo + 2 * half
        x1, x2 = v[..., lo:mid], v[..., mid:hi]
        if torch.is_grad_enabled() and keys.requires_grad:  # out= takes no autograd
            return torch.cat((v[..., :lo], x1 * c - x2 * s, x2 * c + x1 * s, v[..., hi:]), dim=-1).to(keys.dtype)
        out = torch.empty_like(v)  # written in place: no concatenated copy, no temporaries
        if lo or hi < v.shape[-1]:
            out[..., :lo], out[..., hi:] = v[..., :lo], v[..., hi:]
        torch.mul(x1, c, out=out[..., lo:mid]).addcmul_(x2, s, value=-1)
        torch.mul(x2, c, out=out[..., mid:hi]).addcmul_(x1, s)
        return out.to(keys.dtype)


class KeyViews:
    """The keys read at each of the scheme's key maps. With ``whole`` (several query blocks, whose key ranges
    overlap) each map's keys are rotated once per call; else (one block: decoding) only the range a piece
    reads, so that the pieces of one query rotate each key at most once.

    ``kept`` (decoding one row with a KV cache): the rotated keys of earlier calls, kept on the cache object
    itself (so they live and die with it, and a new cache starts empty), per layer and map in a buffer grown by
    doubling with the count of keys it holds. Keys below ``unchanged`` (the cache length when the call started)
    are those of earlier calls, unchanged since (a one-row cache is only appended to, or cut: a cut below the
    kept count is followed); only keys past what is kept are rotated, so a decoding step rotates one key per map."""

    def __init__(self, key: torch.Tensor, tables: RotationTables, whole: bool, kept: dict | None = None,
                 unchanged: int = 0):
        self.key, self.tables, self.whole, self.kept, self.unchanged = key, tables, whole, kept, unchanged
        self.done: dict[str, torch.Tensor] = {}

    def get(self, name: str, start: int, stop: int) -> torch.Tensor:
        if name == "same":
            return self.key[:, :, start:stop]
        if self.kept is not None:  # kept only when the call is one block (not whole)
            return self._kept(name, stop)[:, :, start:stop]
        if not self.whole:
            return self.tables.rotate(self.key[:, :, start:stop], name, start)
        if name not in self.done:
            self.done[name] = self.tables.rotate(self.key, name, 0)
        return self.done[name][:, :, start:stop]

    def _kept(self, name: str, stop: int) -> torch.Tensor:
        """The kept buffer of ``name``, holding the rotated keys ``0 .. stop - 1`` (rotating those it lacked)."""
        buffer, count = self.kept.get(name, (None, 0))
        k = self.key
        if buffer is not None and (buffer.dtype != k.dtype or buffer.device != k.device
                                   or buffer.shape[:2] != k.shape[:2] or buffer.shape[3] != k.shape[3]):
            buffer, count = None, 0  # keys of another kind: start afresh
        count = min(count, self.unchanged)  # keys from the call's start on are new (a cut cache grew again)
        self.kept[name] = (buffer, count)
        if stop > count:
            if buffer is None or buffer.shape[2] < stop:
                grown = k.new_empty(*k.shape[:2], max(1024, 1 << (stop - 1).bit_length()), k.shape[3])
                if buffer is not None:
                    grown[:, :, :count] = buffer[:, :, :count]
                buffer = grown
            buffer[:, :, count:stop] = self.tables.rotate(self.key[:, :, count:stop], name, count)
            self.kept[name] = (buffer, stop)
        return buffer
