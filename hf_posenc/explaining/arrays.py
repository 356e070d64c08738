"""The arrays behind ``hf-posenc explain``'s pictures, each computed by the code that patches (the method's record:
``methods.rope.SCALINGS``' frequencies, ``methods.remapped.REMAPPED``' schemes, the T5 adapter's bucket function on
a patched module, ``encodings.alibi.alibi_slopes`` as the ALiBi swap installs it, a BERT table patched by the
absolute adapter), never re-implemented. Pure arrays: no plotting here (:mod:`.pictures` draws them)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..adapters.learned_absolute import position_table_module
from ..config import PosEncConfig
from ..encodings import rope as R
from ..encodings.alibi import alibi_slopes
from ..methods.remapped import REMAPPED
from ..methods.rope import SCALINGS
from ..patching import patch, unpatch

UNCHANGED, INTERPOLATED, BLENDED, FURTHER, FASTER = ("extrapolated (unchanged)", "interpolated (x factor)",
                                                     "blended", "stretched past the factor", "faster than before")
RTOL = 1e-3  # a wavelength ratio within this of 1 (or of the factor) counts as equal
CHUNK = 1 << 15  # distances per block of the decay bound


def rope_params(cfg: PosEncConfig, geom: R.RopeGeometry) -> dict[str, Any]:
    """``cfg``'s knobs with the defaults that depend on the model filled, as the RoPE adapter fills them."""
    scaling = SCALINGS[cfg.method]
    params = dict(cfg.params)
    return scaling.defaults(params, geom.dim // 2, cfg.factor or 1.0) if scaling.defaults else params


def frequencies(cfg: PosEncConfig, geom: R.RopeGeometry, length: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention temperature) of ``cfg`` for an input of ``length`` tokens (the length-
    dependent methods: that length's), in float64."""
    inv, attention = SCALINGS[cfg.method].computed(geom, cfg.factor or 1.0, rope_params(cfg, geom), seq_len=length)
    return inv.double(), float(attention)


def classify(ratio: torch.Tensor, factor: float) -> list[str]:
    """Each rotary dimension by how its wavelength changed (``ratio`` = new / old)."""
    out = []
    for r in ratio.tolist():
        if abs(r - 1) <= RTOL:
            out.append(UNCHANGED)
        elif factor > 1 and abs(r - factor) <= RTOL * factor:
            out.append(INTERPOLATED)
        elif r < 1:
            out.append(FASTER)
        elif r > factor * (1 + RTOL):
            out.append(FURTHER)
        else:
            out.append(BLENDED)
    return out


def rope_wavelengths(cfg: PosEncConfig, geom: R.RopeGeometry, length: int, before: torch.Tensor | None = None,
                     context: int | None = None, factor: float | None = None) -> dict[str, Any]:
    """Per rotary dimension pair k: wavelength 2 pi / theta_k before and after, their ratio and class, and the
    attention temperature; ``rotating``: how many dimensions complete a rotation within L before and after.
    ``before``: the checkpoint's own frequencies (default: plain RoPE's), over ``context`` tokens (default: the
    geometry's original context), classed against ``factor`` (default: ``cfg``'s)."""
    before = R.default_inv_freq(geom.base, geom.dim).double() if before is None else before.double()
    after, attention = frequencies(cfg, geom, length)
    if geom.turning is not None:  # a proportional RoPE's still pairs have no wavelength: the turning ones drawn
        before, after = before[:geom.turning], after[:geom.turning]
    lam0, lam1 = 2 * math.pi / before, 2 * math.pi / after
    ratio = lam1 / lam0
    L = context or geom.original_max_position_embeddings
    return {"wavelength_before": lam0, "wavelength_after": lam1, "ratio": ratio,
            "classes": classify(ratio, factor or cfg.factor or 1.0), "attention": attention, "original": L,
            "length": length,
            "rotating_before": int((lam0 <= L).sum()), "rotating_after": int((lam1 <= L).sum())}


def decay_bound(inv_freq: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """RoPE's long-range decay (Su et al. 2021, RoFormer, arXiv:2104.09864, section 3.4.3): the relative upper
    bound ``(1 / (d/2)) sum_{j=1}^{d/2} |S_j(m)|``, ``S_j(m) = sum_{k<j} exp(i m theta_k)``, of a query-key
    product at relative distance ``m``, per distance (float64)."""
    out = []
    for part in distances.double().split(CHUNK):  # [chunk, d/2] complex at a time: memory stays bounded
        angles = part[:, None] * inv_freq.double()[None, :]
        out.append(torch.cumsum(torch.polar(torch.ones_like(angles), angles), dim=1).abs().mean(dim=1))
    return torch.cat(out) if out else torch.empty(0, dtype=torch.float64)


def distances(length: int, points: int = 512) -> torch.Tensor:
    """Relative distances 0 .. length - 1, every one up to ``points`` of them, log-spaced beyond."""
    if length <= points:
        return torch.arange(length, dtype=torch.float64)
    return torch.unique(torch.cat([torch.arange(64, dtype=torch.float64),
                                   torch.logspace(math.log10(64), math.log10(length - 1), points - 64,
                                                  dtype=torch.float64).round()]))


def sampled(length: int, resolution: int) -> torch.Tensor:
    """``resolution`` positions spread over 0 .. length - 1 (all of them when there are fewer), the last one
    included."""
    n = min(length, resolution)
    return torch.linspace(0, length - 1, n, dtype=torch.float64).round().long().unique()


def remapped_row(scheme, i: int, length: int, keys: torch.Tensor | None = None) -> torch.Tensor:
    """The relative position the query at ``i`` sees of each key (default: every ``j <= i``; float64): the scheme's
    piece holding ``(i, j)``, its query position minus its key position -- exactly what the attention computes."""
    a, b = next((a, b) for a, b in scheme.blocks(0, length, max(1, length)) if a <= i < b)
    keys = torch.arange(i + 1, dtype=torch.float64) if keys is None else keys.double()
    q = torch.tensor([float(i)], dtype=torch.float64)
    maps = scheme.key_maps()
    out = torch.full_like(keys, math.nan)
    for piece in scheme.pieces(a, b):
        d = i - keys
        inside = (d >= piece.d_min) & (d <= piece.d_max) & (keys >= piece.key_lo) & (keys < piece.key_hi)
        qi = piece.query_at(q) if piece.query_at is not None else q
        kj = maps[piece.key_map](keys) if piece.key_map != "same" else keys
        out = torch.where(inside, qi - kj, out)
    return out


def remapped_map(cfg: PosEncConfig, original: int, length: int, resolution: int = 256) -> dict[str, Any]:
    """The relative position each (query, key) sees under an attention-level method, on ``resolution`` sampled
    queries and keys of a ``length``-token window (NaN above the diagonal), the last query's whole row, the largest
    position any of those takes and the scheme's query scaling."""
    method = REMAPPED[cfg.method]
    params = method.defaults(dict(cfg.params), original)
    scheme = method.scheme(params, original)
    rows = sampled(length, resolution)
    grid = torch.full((len(rows), len(rows)), math.nan, dtype=torch.float64)
    for r, i in enumerate(rows.tolist()):
        cols = rows[rows <= i]
        grid[r, : len(cols)] = remapped_row(scheme, i, length, cols)
    last = remapped_row(scheme, length - 1, length)  # the longest row, every key
    largest = max(float(last.max()), float(torch.nan_to_num(grid, nan=-math.inf).max()))
    scale = scheme.query_scale(rows.double())
    return {"positions": rows, "map": grid, "largest": largest, "original": original, "length": length,
            "params": params, "last_row": last, "score_scale": float(scheme.score_scale),
            "query_scale": None if scale is None else scale.double(), "advertised": method.context(params, original)}


def t5_buckets(cfg: PosEncConfig, length: int, num_buckets: int = 32, max_distance: int = 128) -> dict[str, Any]:
    """T5's bucket of a key ``d`` tokens before the query (bidirectional attention, ``relative_position = -d``),
    before and after ``cfg``, read from a T5 attention module patched by hf_posenc (a tiny random T5 with these
    bucket settings: the bucket function does not depend on the weights)."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=8, d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2,
                      relative_attention_num_buckets=num_buckets, relative_attention_max_distance=max_distance)
    model = T5EncoderModel(config).eval()
    module = model.encoder.block[0].layer[0].SelfAttention
    d = torch.arange(length)

    def buckets() -> torch.Tensor:
        return module._relative_position_bucket(-d, bidirectional=True,
                                                num_buckets=module.relative_attention_num_buckets,
                                                max_distance=module.relative_attention_max_distance)

    before = buckets()
    patch(model, cfg)
    after = buckets()
    last = num_buckets // 2 - 1  # bidirectional: half the buckets per side; keys before the query get 0 .. half-1

    def first_at_last(b: torch.Tensor) -> int | None:
        hits = (b == last).nonzero()
        return int(hits[0]) if len(hits) else None

    return {"distance": d, "before": before, "after": after, "num_buckets": num_buckets,
            "max_distance_before": max_distance, "max_distance_after": int(module.relative_attention_max_distance),
            "last_shared_before": first_at_last(before), "last_shared_after": first_at_last(after)}


def alibi(num_heads: int, length: int) -> dict[str, Any]:
    """ALiBi's bias ``-slope_h * d`` per head against distance (Press et al. 2022), with the slopes the ALiBi swap
    installs (``encodings.alibi.alibi_slopes``)."""
    slopes = alibi_slopes(num_heads).double()
    d = distances(length)
    return {"slopes": slopes, "distance": d, "bias": -slopes[:, None] * d[None, :]}


def cosine_similarity(table: torch.Tensor) -> torch.Tensor:
    t = torch.nn.functional.normalize(table.double(), dim=-1)
    return t @ t.T


def position_table(model) -> torch.Tensor:
    emb = position_table_module(model)
    if emb is None:
        raise ValueError(f"{type(model).__name__} has no learned position table (embeddings.position_embeddings): "
                         "table extension is pictured for BERT-family models")
    return emb.position_embeddings.weight.detach().clone()


def absolute_tables(model, cfg: PosEncConfig) -> dict[str, Any]:
    """A learned position table (BERT) before and after the table extension ``cfg``, patched on ``model`` by
    hf_posenc (then unpatched), and each one's cosine similarity between positions."""
    before = position_table(model)
    patch(model, cfg)
    try:
        after = position_table(model)
    finally:
        unpatch(model)
    return {"before": before, "after": after, "similarity_before": cosine_similarity(before),
            "similarity_after": cosine_similarity(after)}


def binned_mean(values: torch.Tensor, bins: int = 160) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` at distances 1 .. n - 1 averaged over log-spaced bins: (bin centre, mean) -- the decay bound
    oscillates from one distance to the next, its trend is what a reader compares."""
    n = len(values)
    edges = torch.unique(torch.logspace(0, math.log10(max(n - 1, 2)), bins + 1, dtype=torch.float64).floor().long())
    centres, means = [], []
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist()):
        hi = max(hi, lo + 1)
        centres.append((lo + hi - 1) / 2)
        means.append(float(values[lo:hi].mean()))
    return torch.tensor(centres, dtype=torch.float64), torch.tensor(means, dtype=torch.float64)
