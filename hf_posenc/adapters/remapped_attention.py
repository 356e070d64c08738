"""One attention function for every remapped-position method (``hf_posenc.encodings.remap``): each piece of
a scheme runs as fused attention that returns its log-sum-exp, and the pieces are merged exactly by it.

Transformers hands the attention function queries and keys already rotated at their positions ``i`` and
``j``. RoPE composes (rotating by ``a`` then ``b`` is rotating by ``a + b``), so a piece that reads the
query at ``query_at(i)`` rotates the given query further by ``query_at(i) - i`` (angles in float64), and
likewise the keys: the keys in the KV cache stay as transformers stored them.

Queries run in blocks (``RemapState.block`` rows; DCA's never cross a chunk). For one block a piece allows,
per query, an interval of keys whose ends move with the query (``i - d_max``, ``i - d_min``) or stay
(``key_lo``, ``key_hi``). Its keys split into a *core* every query of the block reads (a plain rectangle:
no mask) and at most two ragged edges as wide as the block: a causal square (the kernel's own causal flag)
or a band with a small boolean mask. Memory stays ``heads x block x block`` beyond the kernel's own.

Kernels, chosen per call in :func:`kernel`: on CPU without autograd, ``aten._scaled_dot_product_flash_attention_for_cpu``,
which returns the log-sum-exp, with grouped-query heads folded into the query axis (no repeated keys); on CUDA in
fp16/bf16 without autograd, flash attention for the core rectangles and causal squares and memory-efficient
attention with a bias for the small masked bands (:mod:`cuda_kernels`, checked against a written-out reference on
first use); with autograd (the
fused kernels' backward ignores the log-sum-exp's gradient), fp32 on a GPU and other devices, the eager kernel
(matmul, fp32 softmax), which is also the reference.

Positions come from the KV cache and the padding mask: in a row whose first real key is at cache index
``s``, index ``t`` is position ``t - s`` (left padding as ``generate`` makes it, exactly as the row alone).
Masks with holes (packed documents) are refused; sliding-window models are refused at patch time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..encodings.remap import Piece, Scheme
from ..encodings.rope import apply_rotary
from .attention import CacheOffset, fold_groups, register_attention, repeat_heads, unfold_groups
from .cache_argument import passed_cache
from .cuda_kernels import band_piece, flash_piece, flash_usable

NAME = "hf_posenc_remapped"
STATE_ATTR = "_hf_posenc_remapped"
KEPT_ATTR = "_hf_posenc_rotated_keys"  # on a KV cache object: the rotated keys it goes with (KeyViews)


class RemapState(CacheOffset):
    """The scheme, the model's RoPE frequencies, the query block size, and the padding of the current call."""

    def __setstate__(self, state: dict) -> None:  # unpickled in a fresh process: the attention function is registered
        self.__dict__.update(state)
        register()

    def __init__(self, scheme: Scheme, inv_freq: torch.Tensor, block: int = 256):
        super().__init__()
        self.scheme = scheme
        self.inv_freq = inv_freq.detach().float().clone()
        self.block = block
        self.tables = RotationTables(scheme, self.inv_freq)
        self._starts: dict[tuple, list[int] | None] | None = None  # this forward call's row starts, by mask shape
        self._cache = None  # this forward call's KV cache

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": None, "_starts": None}

    def body_hook(self, module, args, kwargs) -> None:
        super().body_hook(module, args, kwargs)
        self._starts = {}  # a new forward call: its layers share its mask, and nothing of an earlier call is kept
        self._cache = passed_cache(module, args, kwargs)

    def body_done(self, module, args, kwargs, output) -> None:
        self._starts, self._cache = None, None

    def rotated_keys(self, module, key: torch.Tensor) -> dict | None:
        """The rotated keys this layer kept in the call's KV cache from earlier decoding steps (see
        :class:`KeyViews`), or None where keeping them would not be safe: no cache, a batch of several rows (beam
        search reorders them in place), autograd, a layer without an index, a quantized cache."""
        cache, layer = self._cache, getattr(module, "layer_idx", None)
        if cache is None or key.shape[0] != 1 or not isinstance(layer, int) or torch.is_grad_enabled():
            return None
        if any(hasattr(held, "_quantize") for held in getattr(cache, "layers", None) or ()):
            return None  # a quantized cache hands keys back rounded after the call that gave them: not kept
        held = cache.__dict__.setdefault(KEPT_ATTR, {})
        return held.setdefault((layer, self.view_key()), {})

    def view_key(self) -> tuple:
        """What the rotated keys depend on besides the keys: the scheme and its knobs, the frequencies (both fixed
        for the state's life, so computed once)."""
        if "_view" not in self.__dict__:
            self._view = (type(self.scheme).__name__, tuple(sorted((k, repr(v)) for k, v in vars(self.scheme).items())),
                          tuple(self.inv_freq.tolist()))
        return self._view

    def row_starts(self, attention_mask, k_total: int) -> list[int] | None:
        """The cache index of each row's first real key. Computed from the mask's content; within one forward
        call of the model body (whose layers all get the same mask) once per mask shape, never across calls."""
        if attention_mask is None:
            return None
        if self._starts is None:  # an attention call outside a body call (a layer run alone): no sharing
            return padding_starts(attention_mask, k_total)
        key = (tuple(attention_mask.shape), k_total)
        if key not in self._starts:
            self._starts[key] = padding_starts(attention_mask, k_total)
        return self._starts[key]


def padding_starts(attention_mask: torch.Tensor, k_total: int) -> list[int] | None:
    """Per row, the index of the first key any query may read; None when every row starts at 0. Real keys
    must be contiguous (left or right padding): a mask with holes is refused."""
    allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask > torch.finfo(attention_mask.dtype).min / 2
    valid = allowed[:, 0].any(dim=1)[:, :k_total]  # [batch, keys]
    starts = []
    for row in valid:
        idx = row.nonzero().flatten()
        if len(idx) == 0:
            starts.append(k_total)
            continue
        first, last = int(idx[0]), int(idx[-1])
        if last - first + 1 != len(idx):
            raise ValueError("remapped-position attention takes padding masks (left or right padding), not masks with "
                             "holes inside a row (packed documents); run such rows one by one.")
        starts.append(first)
    return None if not any(starts) else starts


def remapped_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """An attention function with transformers' signature: returns ``([batch, q, heads, dim], None)``."""
    state: RemapState = module.__dict__[STATE_ATTR]
    b, h, q, d = query.shape
    k_total = state.keys_held(q, key.shape[2])
    key, value = key[:, :, :k_total], value[:, :, :k_total]  # a static cache's empty slots never take part
    past = state.query_start(q, k_total)
    scale = (scaling if scaling is not None else d**-0.5) * state.scheme.score_scale
    dropout = dropout if module.training else 0.0
    starts = state.row_starts(attention_mask, k_total)
    if starts is None:
        kept = state.rotated_keys(module, key) if q <= state.block else None
        out = attend(state, query, key, value, past, scale, dropout, kept)
    else:
        out = query.new_zeros(b, h, q, value.shape[-1])
        for r, s0 in enumerate(starts):
            first = max(0, s0 - past)  # the row's first real query in this call
            if first < q:
                rows = slice(r, r + 1)
                out[rows, :, first:] = attend(state, query[rows, :, first:], key[rows, :, s0:], value[rows, :, s0:],
                                              past + first - s0, scale, dropout)
    return out.transpose(1, 2).contiguous(), None


def attend(state: RemapState, query, key, value, p0: int, scale: float, dropout: float,
           kept: dict | None = None) -> torch.Tensor:
    """Attention of queries at positions ``p0 ..`` over keys at positions ``0 ..`` under ``state.scheme``:
    ``[batch, heads, q, dim]``; ``kept``: rotated keys of earlier steps (:meth:`RemapState.rotated_keys`)."""
    scheme, inv_freq = state.scheme, state.inv_freq
    q_len, k_len = query.shape[2], key.shape[2]
    q_pos = torch.arange(p0, p0 + q_len, device=query.device)
    factor = scheme.query_scale(q_pos)
    if factor is not None:
        query = query * factor.to(query.dtype)[:, None]
    keys = KeyViews(key, state.tables, whole=q_len > state.block, kept=kept, unchanged=min(p0, k_len))
    outs = []
    for a, e in scheme.blocks(p0, p0 + q_len, state.block):
        qa, pos = query[:, :, a - p0 : e - p0], q_pos[a - p0 : e - p0]
        parts = []
        for piece in scheme.pieces(a, e):
            qr = qa if piece.query_at is None else turned(qa, piece.query_at(pos) - pos, inv_freq)
            for seg in segments(piece, a, e, k_len):
                kr = keys.get(piece.key_map, seg.start, seg.stop)
                parts.append(kernel(qr, kr, value[:, :, seg.start : seg.stop], seg, scale, dropout))
        outs.append(merge(parts, qa, value.shape[-1]))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def turned(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``x`` rotated further by ``delta`` positions (none where every ``delta`` is 0)."""
    return x if not bool(delta.any()) else apply_rotary(x, delta, inv_freq)


class KeyViews:
    """The keys read at each of the scheme's key maps. With ``whole`` (several query blocks, whose key ranges
    overlap) each map's keys are rotated once per call; else (one block: decoding) only the range a piece
    reads, so that the pieces of one query rotate each key at most once.

    ``kept`` (decoding one row with a KV cache): the rotated keys of earlier calls, kept on the cache object
    itself (so they live and die with it, and a new cache starts empty), per layer and map in a buffer grown by
    doubling with the count of keys it holds. Keys below ``unchanged`` (the cache length when the call started)
    are those of earlier calls, unchanged since (a one-row cache is only appended to, or cut: a cut below the
    kept count is followed); only keys past what is kept are rotated, so a decoding step rotates one key per map."""

    def __init__(self, key: torch.Tensor, tables: "RotationTables", whole: bool, kept: dict | None = None,
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


class RotationTables:
    """Per key map, the cos and sin that turn keys at positions ``0 .. n - 1`` from ``p`` to ``map(p)``: angles
    ``(map(p) - p) * inv_freq`` in float64 as :func:`encodings.rope.apply_rotary` takes them, kept in float32 and
    grown by doubling. They depend on positions alone, so every layer and every call shares them (no trig per
    layer and step); they are not pickled (rebuilt on first use). Keys whose map leaves them where they are
    (DCA's first chunk) are not rotated at all."""

    def __init__(self, scheme: Scheme, inv_freq: torch.Tensor):
        self.scheme, self.inv_freq = scheme, inv_freq  # the scheme, not its maps (lambdas): the state pickles
        self.held: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor, int]] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "held": {}}

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
        """``keys`` ``[b, h, n, d]`` at positions ``start ..`` read at ``map(p)``, in their dtype (the rotate-half
        layout, as :func:`encodings.rope.apply_rotary`)."""
        n = keys.shape[2]
        cos, sin, unmoved = self.table(name, start + n, keys.device)
        if start + n <= unmoved:
            return keys
        c, s = cos[start : start + n], sin[start : start + n]
        v = keys.float()
        half = v.shape[-1] // 2
        x1, x2 = v[..., :half], v[..., half:]
        if torch.is_grad_enabled() and keys.requires_grad:  # out= takes no autograd
            return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(keys.dtype)
        out = torch.empty_like(v)  # written in place: no concatenated copy, no temporaries
        torch.mul(x1, c, out=out[..., :half]).addcmul_(x2, s, value=-1)
        torch.mul(x2, c, out=out[..., half:]).addcmul_(x1, s)
        return out.to(keys.dtype)


@dataclass
class Segment:
    """Keys ``start .. stop - 1`` for one block of queries; ``lo``/``hi`` the first/last key each query
    reads (None: all of them), ``causal`` when that is exactly a top-left causal square."""

    start: int
    stop: int
    lo: torch.Tensor | None = None
    hi: torch.Tensor | None = None
    causal: bool = False


def _bounds(piece: Piece, i: torch.Tensor, k_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    lo = i - piece.d_max if piece.d_max != float("inf") else torch.zeros_like(i)
    hi = i - piece.d_min
    lo = lo.clamp(min=piece.key_lo)
    hi = hi.clamp(max=min(k_len, piece.key_hi) - 1)
    return lo, hi


def segments(piece: Piece, a: int, e: int, k_len: int) -> list[Segment]:
    """The core rectangle and the ragged edges of ``piece`` for queries at ``a .. e - 1``."""
    i = torch.arange(a, e)
    lo, hi = _bounds(piece, i, k_len)
    first, last = int(lo[0]), int(hi[-1])
    if first > last:
        return []
    if e - a == 1:  # one query (decoding): every key it reads, unmasked
        return [Segment(first, last + 1)]
    core_lo, core_hi = int(lo[-1]), int(hi[0]) - 1  # the last key every query reads starts the causal edge
    if core_lo > core_hi + 1:  # no key is read by every query: one masked segment
        return [_edge(first, last + 1, lo, hi)]
    out = []
    if first < core_lo:
        out.append(_edge(first, core_lo, lo, hi))
    if core_lo <= core_hi:
        out.append(Segment(core_lo, core_hi + 1))
    if core_hi + 1 <= last:
        out.append(_edge(core_hi + 1, last + 1, lo, hi))
    return out


def _edge(start: int, stop: int, lo: torch.Tensor, hi: torch.Tensor) -> Segment:
    lo, hi = (lo - start).clamp(min=0), (hi - start).clamp(max=stop - start - 1)
    rows = torch.arange(len(lo))
    causal = bool((lo == 0).all()) and bool((hi == rows).all())
    return Segment(start, stop, lo, hi, causal)


def kernel(q, k, v, seg: Segment, scale: float, dropout: float):
    """Attention of ``q`` ``[b, h, n, d]`` over ``k``/``v`` ``[b, h_kv, m, d]`` as allowed by ``seg``:
    ``(out [b, h, n, dv] float32, lse [b, h, n] float32)``, ``lse = -inf`` for a query that reads no key."""
    _, h, n, _ = q.shape
    groups = h // k.shape[1]
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    on_gpu = not grad and flash_usable(q, dropout)  # CUDA, fp16/bf16: see cuda_kernels
    if on_gpu and (seg.lo is None or seg.causal):
        return flash_piece(q, k, v, seg.causal, scale)
    fused = q.device.type == "cpu" and not grad
    mask = None
    if on_gpu:  # a masked band
        out, lse = band_piece(q, k, v, _allowed(seg, k.shape[2], q.device), scale)
        return out, _no_key(lse, seg, q.device)
    if seg.lo is not None and not (seg.causal and fused):
        allowed = _allowed(seg, k.shape[2], q.device)
        # finite, so that a query reading no key keeps a finite log-sum-exp (and gradient); its lse is set below
        mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, torch.finfo(q.dtype).min)
    if fused and seg.causal:  # top-left causal square: the kernel's own flag, heads not folded
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, repeat_heads(k, groups), repeat_heads(v, groups), dropout, True, scale=scale)
    else:
        qf = fold_groups(q, k.shape[1])
        mf = None if mask is None else mask.expand(groups, n, mask.shape[-1]).reshape(groups * n, -1)
        if fused:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qf, k, v, dropout, False,
                                                                                  attn_mask=mf, scale=scale)
        else:
            out, lse = eager(qf, k, v, mf, scale, dropout)
        out, lse = unfold_groups(out, lse, h, n)
    return out.float(), _no_key(lse.float(), seg, q.device)


def _allowed(seg: Segment, keys: int, device) -> torch.Tensor:
    """``[n, keys]`` bool: the keys each query of a masked ``seg`` reads (``seg.lo`` to ``seg.hi``)."""
    cols = torch.arange(keys, device=device)
    return (cols[None, :] >= seg.lo.to(device)[:, None]) & (cols[None, :] <= seg.hi.to(device)[:, None])


def _no_key(lse: torch.Tensor, seg: Segment, device) -> torch.Tensor:
    """``lse`` with -inf for the queries of ``seg`` that read no key (the kernels give them a finite value)."""
    if seg.lo is not None:
        empty = (seg.hi < seg.lo).to(device)
        if bool(empty.any()):
            lse = lse.masked_fill(empty, float("-inf"))
    return lse


def eager(q, k, v, mask, scale: float, dropout: float):
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None])
    if dropout:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    return torch.matmul(probs, v.float()), lse


def merge(parts, like: torch.Tensor, dv: int) -> torch.Tensor:
    """The pieces' attentions merged by their log-sum-exp: one softmax over all their keys."""
    if not parts:
        return like.new_zeros(*like.shape[:3], dv)
    lse = torch.stack([p[1] for p in parts])
    total = torch.logsumexp(lse, dim=0)
    weights = torch.exp(lse - total).nan_to_num(0.0)  # a query with no key at all (padding): zeros
    out = sum(w[..., None] * o for w, (o, _) in zip(weights, parts))
    return out.to(like.dtype)


def register() -> str:
    """``hf_posenc_remapped`` in transformers' attention and mask registries."""
    return register_attention(NAME, remapped_attention)
