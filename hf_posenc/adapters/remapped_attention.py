"""One attention function for every remapped-position method (``hf_posenc.encodings.remap``): each piece of
a scheme runs as fused attention that returns its log-sum-exp, and the pieces are merged exactly by it.

Transformers hands the attention function queries and keys already rotated at their positions ``i`` and
``j``. RoPE composes (rotating by ``a`` then ``b`` is rotating by ``a + b``), so a piece that reads the
query at ``query_at(i)`` rotates the given query further by ``query_at(i) - i`` (angles in float64), and
likewise the keys: the keys in the KV cache stay as transformers stored them. Each layer rotates with its own
RoPE (:class:`remapped_keys.RotationTables`: its frequencies, scaled or not, and the dimensions it rotates).

Queries run in blocks (``RemapState.block`` rows, else 2,048 on the fused GPU path and 256 elsewhere; DCA's never
cross a chunk). For one block a piece allows, per query, an interval of keys whose ends move with the query
(``i - d_max``, ``i - d_min``) or stay (``key_lo``, ``key_hi``). Its keys split into a *core* every query of the block
reads (a plain rectangle: no mask) and at most two ragged edges as wide as the block: a causal square (the kernel's
own causal flag) or a band with a small boolean mask. Memory stays ``heads x block x block`` beyond the kernel's
own.

Kernels, chosen per call in :func:`kernel`: on CPU without autograd,
``aten._scaled_dot_product_flash_attention_for_cpu``, which returns the log-sum-exp, with grouped-query heads folded
into the query axis (no repeated keys); on CUDA in fp16/bf16 without autograd, flash attention for the core rectangles
and causal squares and memory-efficient attention with a bias for the small masked bands (:mod:`cuda_kernels`, checked
against a written-out reference on first use); with autograd (the fused kernels' backward ignores the log-sum-exp's
gradient), fp32 on a GPU, other devices, soft-capped scores (Gemma 2) and values narrower than the keys (MLA), the eager
kernel (matmul, fp32 softmax), which is also the reference. Attention sinks (gpt-oss: one learned logit per head in
every softmax) join the merge as one more piece with no value.

Positions come from the KV cache and the padding mask: in a row whose first real key is at cache index
``s``, index ``t`` is position ``t - s`` (left padding as ``generate`` makes it, exactly as the row alone).
Masks with holes (packed documents) are refused. Layers the method leaves alone (sliding-window layers of a
hybrid model: no table) run the attention implementation the model had (:func:`delegated`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..encodings.remap import Piece, Scheme
from .attention import CacheOffset, fold_groups, register_attention, repeat_heads, unfold_groups
from .cache_argument import passed_argument, passed_cache
from .cuda_kernels import FLASH_DTYPES, band_piece, flash_piece, flash_usable
from .mrope import check_text_positions
from .multimodal_inputs import check_text_call
from .remapped_keys import KeyViews, RotationTables

NAME = "hf_posenc_remapped"
STATE_ATTR = "_hf_posenc_remapped"
TABLES_ATTR = "_hf_posenc_remapped_rope"  # on an attention module: its RotationTables, None for a layer left alone
KEPT_ATTR = "_hf_posenc_rotated_keys"  # on a KV cache object: the rotated keys it goes with (KeyViews)
# Query rows per block when the state names none. On the fused GPU path each block costs a dozen kernel launches and
# their Python whatever its size, so blocks are larger there (its bands of heads x block x block in fp16/bf16 stay
# small beside the model); the eager kernel (fp32, autograd) keeps 256, its fp32 scores being heads x block x keys.
DEFAULT_BLOCK = {"eager": 256, "fused_gpu": 2048}


class RemapState(CacheOffset):
    """The scheme, the query block size, the cache layers it computes (``layers``; None: all), the attention
    implementation of the layers it leaves alone (``delegate``), and the padding of the current call."""

    def __setstate__(self, state: dict) -> None:  # unpickled in a fresh process: the attention function is registered
        self.__dict__.update(state)
        register()

    mrope = False  # whether the model's RoPE is multimodal: each call's positions are checked to be text's
    # (class default: a state pickled by a release without it)

    def __init__(self, scheme: Scheme, block: int | None = None, layers: frozenset[int] | None = None,
                 delegate: str = "sdpa", mrope: bool = False):
        super().__init__()
        self.scheme, self.block, self.layers, self.delegate = scheme, block, layers, delegate
        self.mrope = mrope
        self._starts: dict[tuple, list[int] | None] | None = None  # this forward call's row starts, by mask shape
        self._cache = None  # this forward call's KV cache

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": None, "_starts": None}

    def rows(self, query: torch.Tensor) -> int:
        """Query rows per block: ``block`` where set, else :data:`DEFAULT_BLOCK`'s for the kernel ``query`` takes."""
        if self.block:
            return self.block
        grad = torch.is_grad_enabled() and query.requires_grad
        fused_gpu = query.is_cuda and query.dtype in FLASH_DTYPES and not grad
        return DEFAULT_BLOCK["fused_gpu" if fused_gpu else "eager"]

    def inputs_hook(self, module, args, kwargs) -> None:
        """A pre-hook on a multimodal model: a call with images, videos or audio is refused before anything runs."""
        check_text_call(module, args, kwargs, self.method)

    def body_hook(self, module, args, kwargs) -> None:
        if self.mrope:
            check_text_positions(passed_argument(module, args, kwargs, ("position_ids",)), self.method)
        super().body_hook(module, args, kwargs)
        self._starts = {}  # a new forward call: its layers share its mask, and nothing of an earlier call is kept
        self._cache = passed_cache(module, args, kwargs)

    def body_done(self, module, args, kwargs, output) -> None:
        self._starts, self._cache = None, None

    def rotated_keys(self, module, key: torch.Tensor, tables: RotationTables) -> dict | None:
        """The rotated keys this layer kept in the call's KV cache from earlier decoding steps (see
        :class:`KeyViews`), or None where keeping them would not be safe: no cache, a batch of several rows (beam
        search reorders them in place), autograd, a layer without an index, a quantized cache."""
        cache, layer = self._cache, getattr(module, "layer_idx", None)
        if cache is None or key.shape[0] != 1 or not isinstance(layer, int) or torch.is_grad_enabled():
            return None
        if any(hasattr(held, "_quantize") for held in getattr(cache, "layers", None) or ()):
            return None  # a quantized cache hands keys back rounded after the call that gave them: not kept
        held = cache.__dict__.setdefault(KEPT_ATTR, {})
        return held.setdefault((layer, self.view_key(), tables.identity()), {})

    def view_key(self) -> tuple:
        """What the rotated keys depend on besides the keys and the layer's RoPE: the scheme and its knobs (fixed
        for the state's life, so computed once)."""
        if "_view" not in self.__dict__:
            self._view = (type(self.scheme).__name__, tuple(sorted((k, repr(v)) for k, v in vars(self.scheme).items())))
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


@dataclass(frozen=True)
class Scoring:
    """How scores become weights besides the positions: ``scale`` (times the scheme's score scale), dropout,
    Gemma 2's soft-capping (``cap * tanh(s / cap)`` before the mask) and gpt-oss's sinks (``[heads]`` logits)."""

    scale: float
    dropout: float = 0.0
    softcap: float | None = None
    sinks: torch.Tensor | None = None


def padding_starts(attention_mask: torch.Tensor, k_total: int) -> list[int] | None:
    """Per row, the index of the first key any query may read; None when every row starts at 0. Real keys
    must be contiguous (left or right padding): a mask with holes is refused."""
    allowed = attention_mask if attention_mask.dtype == torch.bool \
        else attention_mask > torch.finfo(attention_mask.dtype).min / 2
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
    tables: RotationTables | None = module.__dict__.get(TABLES_ATTR)
    if tables is None:
        return delegated(state.delegate, module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                         **kwargs)
    b, h, q, d = query.shape
    k_total = state.keys_held(q, key.shape[2])
    key, value = key[:, :, :k_total], value[:, :, :k_total]  # a static cache's empty slots never take part
    past = state.query_start(q, k_total)
    scoring = Scoring((scaling if scaling is not None else d**-0.5) * state.scheme.score_scale,
                      dropout if module.training else 0.0, kwargs.get("softcap"), kwargs.get("s_aux"))
    starts = state.row_starts(attention_mask, k_total)
    if starts is None:
        kept = state.rotated_keys(module, key, tables) if q <= state.rows(query) else None
        out = attend(state, tables, query, key, value, past, scoring, kept, held=past - state.skipped(q))
    else:
        out = query.new_zeros(b, h, q, value.shape[-1])
        for r, s0 in enumerate(starts):
            first = max(0, s0 - past)  # the row's first real query in this call
            if first < q:
                rows = slice(r, r + 1)
                out[rows, :, first:] = attend(state, tables, query[rows, :, first:], key[rows, :, s0:],
                                              value[rows, :, s0:], past + first - s0, scoring)
    return out.transpose(1, 2).contiguous(), None


def delegated(impl: str, module, query, key, value, attention_mask, **kwargs):
    """A layer the method leaves alone, under the implementation the model had: sdpa, or the eager function of
    the model's own modeling file (which adds its mask: the boolean mask this function's mask builder gives is
    made additive, and a mask left out -- causal, nothing else to mask -- is written out)."""
    if impl == "sdpa":
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    q, k = query.shape[2], key.shape[2]
    if attention_mask is None:
        attention_mask = torch.ones(q, k, dtype=torch.bool, device=query.device).tril(k - q)[None, None]
    if attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask, torch.finfo(query.dtype).min)
    return eager_function(module)(module, query, key, value, attention_mask, **kwargs)


def eager_function(module):
    """The eager attention function of ``module``'s modeling file, or None."""
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


def attend(state: RemapState, tables: RotationTables, query, key, value, p0: int, scoring: Scoring,
           kept: dict | None = None, held: int | None = None) -> torch.Tensor:
    """Attention of queries at positions ``p0 ..`` over keys at positions ``0 ..`` under ``state.scheme``:
    ``[batch, heads, q, dim]``; ``kept``: rotated keys of earlier steps (:meth:`RemapState.rotated_keys`), valid for
    the ``held`` keys the cache had before this call (default ``p0``: a layer gets every query of the call; Gemma 4's
    KV-shared layers under ``logits_to_keep`` get the last ones, after keys new in this call)."""
    scheme = state.scheme
    q_len, k_len = query.shape[2], key.shape[2]
    q_pos = torch.arange(p0, p0 + q_len, device=query.device)
    factor = scheme.query_scale(q_pos)
    if factor is not None:
        query = query * factor.to(query.dtype)[:, None]
    rows = state.rows(query)
    keys = KeyViews(key, tables, whole=q_len > rows, kept=kept, unchanged=min(p0 if held is None else held, k_len))
    outs = []
    for a, e in scheme.blocks(p0, p0 + q_len, rows):
        qa, pos = query[:, :, a - p0 : e - p0], q_pos[a - p0 : e - p0]
        parts = []
        for piece in scheme.pieces(a, e):
            qr = qa if piece.query_at is None else tables.turn(qa, piece.query_at(pos) - pos)
            for seg in segments(piece, a, e, k_len):
                kr = keys.get(piece.key_map, seg.start, seg.stop)
                parts.append(kernel(qr, kr, value[:, :, seg.start : seg.stop], seg, scoring))
        if scoring.sinks is not None:
            parts.append(sink(scoring.sinks, qa, value.shape[-1]))
        outs.append(merge(parts, qa, value.shape[-1]))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def sink(sinks: torch.Tensor, like: torch.Tensor, dv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sinks as one more piece: no value, the sink's logit as its log-sum-exp for every query of a head."""
    b, h, n, _ = like.shape
    lse = sinks.float().reshape(1, h, 1).expand(b, h, n)
    return like.new_zeros(b, h, n, dv, dtype=torch.float32), lse


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


def kernel(q, k, v, seg: Segment, scoring: Scoring):
    """Attention of ``q`` ``[b, h, n, d]`` over ``k``/``v`` ``[b, h_kv, m, d]`` as allowed by ``seg``:
    ``(out [b, h, n, dv] float32, lse [b, h, n] float32)``, ``lse = -inf`` for a query that reads no key."""
    _, h, n, _ = q.shape
    groups, scale, dropout = h // k.shape[1], scoring.scale, scoring.dropout
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    plain = not grad and scoring.softcap is None and v.shape[-1] == q.shape[-1]  # what the fused kernels compute
    on_gpu = plain and flash_usable(q, dropout)  # CUDA, fp16/bf16: see cuda_kernels
    if on_gpu and (seg.lo is None or seg.causal):
        return flash_piece(q, k, v, seg.causal, scale)
    fused = plain and q.device.type == "cpu"
    mask = None
    if on_gpu:  # a masked band
        out, lse = band_piece(q, k, v, _allowed(seg, k.shape[2], q.device), scale)
        return out, _no_key(lse, seg, q.device)
    if seg.lo is not None and not (seg.causal and fused):
        allowed = _allowed(seg, k.shape[2], q.device)
        # finite, so that a query reading no key keeps a finite log-sum-exp (and gradient); its lse is set below
        mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(
            ~allowed, torch.finfo(q.dtype).min)
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
            out, lse = eager(qf, k, v, mf, scoring)
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


def eager(q, k, v, mask, scoring: Scoring):
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scoring.scale
    if scoring.softcap is not None:
        scores = torch.tanh(scores / scoring.softcap) * scoring.softcap
    if mask is not None:
        scores = scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None])
    if scoring.dropout:
        probs = torch.nn.functional.dropout(probs, p=scoring.dropout)
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
