"""Rotary position embedding (RoPE) frequency schedules.

Every scaling is a pure function with one signature::

    fn(geom: RopeGeometry, factor: float, params: dict, seq_len: int | None) -> (inv_freq, attention_factor)

``inv_freq`` is a float32 tensor of ``dim // 2`` inverse frequencies and ``attention_factor`` the
factor that multiplies cos/sin (YaRN's "mscale"). Frequencies are always computed in float32.

References
----------
- RoPE: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv:2104.09864.
- PI: Chen et al., "Extending Context Window of Large Language Models via Positional Interpolation",
  arXiv:2306.15595 (and kaiokendev's "SuperHOT" linear scaling).
- NTK-aware scaling: bloc97, "NTK-Aware Scaled RoPE" (r/LocalLLaMA, 2023): base' = base * s^(d/(d-2)).
- Dynamic NTK: emozilla, "Dynamically Scaled RoPE further increases performance of long context
  LLaMA with zero fine-tuning" (r/LocalLLaMA, 2023).
- YaRN: Peng et al., "YaRN: Efficient Context Window Extension of Large Language Models",
  arXiv:2309.00071, reference code https://github.com/jquesnelle/yarn
  (``scaled_rope/LlamaYaRNScaledRotaryEmbedding.py`` and ``LlamaDynamicYaRNScaledRotaryEmbedding.py``).
- Llama 3.1 frequency smoothing: Meta, ``llama/model.py`` ``apply_scaling`` (2024).
- LongRoPE: Ding et al., "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens",
  arXiv:2402.13753.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class RopeGeometry:
    """What every schedule needs to know about the model.

    base: the model's ``rope_theta``; dim: the rotary dimension (head_dim x partial_rotary_factor);
    original_max_position_embeddings: the context length the model was trained on (L); turning: how many of the
    dim / 2 pairs rotate, None for all of them. transformers' ``proportional`` RoPE (Gemma 4's and LFM3's
    full-attention layers) takes its exponents 2i/d over the whole head (dim = head_dim) and keeps the pairs past
    head_dim x partial_rotary_factor / 2 still (frequency 0): a scaling of it is the scaling of the whole head's
    RoPE, those pairs kept still (:func:`still_pairs`), as transformers applies its ``factor``.
    """

    base: float
    dim: int
    original_max_position_embeddings: int
    turning: int | None = None


def _exponents(dim: int, device=None) -> torch.Tensor:
    """2i/d for i = 0 .. d/2 - 1, in float32."""
    return torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim


def default_inv_freq(base: float, dim: int, device=None) -> torch.Tensor:
    """theta_i = base^(-2i/d): the original RoPE frequencies (RoFormer, eq. 15)."""
    return 1.0 / (base ** _exponents(dim, device))


def still_pairs(inv_freq: torch.Tensor, geom: RopeGeometry) -> torch.Tensor:
    """``inv_freq`` with the pairs past ``geom.turning`` set to 0 (they never rotate); unchanged where all turn."""
    if geom.turning is None or geom.turning >= inv_freq.shape[-1]:
        return inv_freq
    kept = inv_freq.clone()
    kept[..., geom.turning:] = 0.0
    return kept


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``x`` ``[..., n, d]`` (rotate-half layout, as transformers' RoPE) rotated by ``positions`` ``[n]`` times
    the frequencies ``inv_freq`` ``[d / 2]`` (RoFormer, eq. 34); angles in float64 (float32 on MPS, which has
    no float64), the rotation in float32, cast back to ``x``'s dtype."""
    wide = torch.float32 if x.device.type == "mps" else torch.float64
    angles = positions.to(wide)[:, None] * inv_freq.to(device=x.device, dtype=wide)[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    v = x.float()
    half = v.shape[-1] // 2
    rotated = torch.cat((-v[..., half:], v[..., :half]), dim=-1)
    return (v * emb.cos().float() + rotated * emb.sin().float()).to(x.dtype)


def ntk_base(base: float, dim: int, factor: float) -> float:
    """NTK-aware base change: base' = base * s^(d / (d - 2)) (bloc97, 2023)."""
    return base * factor ** (dim / (dim - 2))


def rope_none(geom: RopeGeometry, factor: float, params: dict[str, Any], seq_len=None, device=None):
    """No scaling: the model's own frequencies."""
    return default_inv_freq(geom.base, geom.dim, device), 1.0


def rope_linear(geom: RopeGeometry, factor: float, params: dict[str, Any], seq_len=None, device=None):
    """Position interpolation (Chen et al. 2023): positions divided by s, i.e. every theta_i / s."""
    inv_freq = default_inv_freq(geom.base, geom.dim, device)
    inv_freq /= factor
    return inv_freq, 1.0


def rope_ntk(geom: RopeGeometry, factor: float, params: dict[str, Any], seq_len=None, device=None):
    """Static NTK-aware scaling: the default schedule with base' = base * s^(d/(d-2))."""
    return default_inv_freq(ntk_base(geom.base, geom.dim, factor), geom.dim, device), 1.0


def rope_dynamic_ntk(geom: RopeGeometry, factor: float, params: dict[str, Any], seq_len=None, device=None):
    """Dynamic NTK (emozilla 2023): for a sequence of length l > L the base becomes
    base * (s * l / L - (s - 1))^(d/(d-2)); for l <= L the frequencies are the original ones."""
    L = geom.original_max_position_embeddings
    seq_len = L if seq_len is None else max(int(seq_len), L)
    return default_inv_freq(ntk_base(geom.base, geom.dim, dynamic_ntk_alpha(factor, seq_len, L)), geom.dim, device), 1.0


def dynamic_ntk_alpha(factor: float, seq_len: int, original: int) -> float:
    """The NTK factor alpha that dynamic NTK applies at ``seq_len`` >= L tokens: s * l / L - (s - 1), so that its
    base there is :func:`ntk_base` (base, d, alpha) -- static NTK with factor alpha (what ``--freeze-at`` saves)."""
    return (factor * seq_len / original) - (factor - 1)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN attention temperature sqrt(1/t) = 0.1 * ln(s) + 1 (Peng et al. 2023, eq. 22)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_dim(num_rotations: float, dim: int, base: float, length: int) -> float:
    """Dimension index whose wavelength makes ``num_rotations`` full turns over ``length`` tokens."""
    return (dim * math.log(length / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_ramp_bounds(beta_fast: float, beta_slow: float, dim: int, base: float, length: int, truncate: bool = True):
    """The [low, high] dimension range over which YaRN blends interpolation and extrapolation."""
    low = _yarn_correction_dim(beta_fast, dim, base, length)
    high = _yarn_correction_dim(beta_slow, dim, base, length)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _linear_ramp(low: float, high: float, n: int) -> torch.Tensor:
    if low == high:
        high += 0.001  # avoid dividing by zero, as the reference code does
    return torch.clamp((torch.arange(n, dtype=torch.float32) - low) / (high - low), 0, 1)


def yarn_inv_freq(geom: RopeGeometry, scale: float, beta_fast: float, beta_slow: float, truncate: bool, device=None):
    """YaRN "NTK-by-parts" frequencies (Peng et al. 2023, sec. 3.2): dimensions that turn more than
    beta_fast times over L keep their frequency, those that turn fewer than beta_slow times are
    interpolated by 1/s, and a linear ramp blends the dimensions in between."""
    pos_freqs = geom.base ** _exponents(geom.dim, device)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (scale * pos_freqs)
    low, high = yarn_ramp_bounds(beta_fast, beta_slow, geom.dim, geom.base, geom.original_max_position_embeddings,
                                 truncate)
    keep = 1 - _linear_ramp(low, high, geom.dim // 2).to(device=device, dtype=torch.float)
    return interpolation * (1 - keep) + extrapolation * keep


def rope_yarn(geom: RopeGeometry, factor: float, params: dict[str, Any], seq_len=None, device=None):
    """Static YaRN with scale s = factor; attention factor 0.1 ln s + 1 unless given
    (or DeepSeek's mscale / mscale_all_dim ratio when both are given)."""
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = yarn_mscale(factor)
    inv_freq = yarn_inv_freq(geom, factor, params["beta_fast"], params["beta_slow"], params.get("truncate", True),
                             device)
    return inv_freq, attention_factor


def dynamic_yarn_scale(geom: RopeGeometry, factor: float, params: dict[str, Any], seq_len=None) -> float:
    """Scale used by dynamic YaRN for a sequence of ``seq_len`` tokens: s = l / L once l > L
    (jquesnelle/yarn ``LlamaDynamicYaRNScaledRotaryEmbedding.forward``); with ``finetuned`` the
    scale never drops below ``factor`` (the reference's ``finetuned=True`` start state)."""
    L = geom.original_max_position_embeddings
    floor = factor if params.get("finetuned") else 1.0
    if seq_len is None:
        return floor
    return max(floor, int(seq_len) / L)


def rope_dynamic_yarn(geom: RopeGeometry, factor: float, params: dict[str, Any], seq_len=None, device=None):
    """Dynamic YaRN (Peng et al. 2023, sec. 3.3; jquesnelle/yarn): YaRN whose scale follows the
    current length, s = max(1, l / L); mscale = (0.1 ln s + 1) * attn_factor."""
    scale = dynamic_yarn_scale(geom, factor, params, seq_len)
    if scale <= 1.0:
        return default_inv_freq(geom.base, geom.dim, device), 1.0  # the reference starts with mscale 1
    inv_freq = yarn_inv_freq(geom, scale, params["beta_fast"], params["beta_slow"], True, device)
    return inv_freq, float(yarn_mscale(scale) * params.get("attn_factor", 1.0))


def rope_llama3(geom: RopeGeometry, factor: float, params: dict[str, Any], seq_len=None, device=None):
    """Llama 3.1 smoothing: wavelengths shorter than L / high_freq_factor keep their frequency, longer
    than L / low_freq_factor are divided by s, and those in between are blended smoothly."""
    inv_freq = default_inv_freq(geom.base, geom.dim, device)
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    L = geom.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = L / low, L / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (L / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


def longrope_attention_factor(factor: float, original: int) -> float:
    """LongRoPE's attention factor sqrt(1 + ln s / ln L) (Ding et al. 2024)."""
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def rope_longrope(geom: RopeGeometry, factor: float, params: dict[str, Any], seq_len=None, device=None):
    """LongRoPE: per-dimension rescale factors lambda_i, theta_i / lambda_i, with the ``long_factor``
    list for sequences longer than L and ``short_factor`` otherwise."""
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = longrope_attention_factor(factor, geom.original_max_position_embeddings)
    long = seq_len is not None and int(seq_len) > geom.original_max_position_embeddings
    ext = torch.tensor(params["long_factor" if long else "short_factor"], dtype=torch.float32, device=device)
    shape = torch.arange(0, geom.dim, 2, dtype=torch.int64, device=device).float() / geom.dim
    return 1.0 / (ext * geom.base**shape), attention_factor


def rerotation(positions: torch.Tensor, old: tuple[torch.Tensor, Any], new: tuple[torch.Tensor, Any],
               device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The (cos, sin) ``[b, 1, m, rot / 2]`` that turn keys at ``positions`` ``[b, m]`` stored rotated by ``old``
    = (inv_freq, attention_scaling) into the keys ``new`` gives (:func:`rerotate_keys`); the ratio of the two
    attention scalings is folded into both. Each inv_freq is ``[rot / 2]`` (every row) or ``[b, rot / 2]`` (one
    per row), each scaling a number or a ``[b]`` tensor.

    Rotations by a and b compose to a + b (RoFormer, eq. 34), so ``s_new R(p theta_new) k = (s_new / s_old)
    R(p theta_new - p theta_old) (s_old R(p theta_old) k)``. Each angle is the float32 product transformers'
    rotary module forms (``inv_freq @ position`` in float32) and their difference is taken in float64 (float32
    on MPS), so repeated re-rotations telescope to the angles of a forward over the whole sequence."""
    (inv_old, s_old), (inv_new, s_new) = old, new
    device = device or positions.device
    wide = torch.float32 if torch.device(device).type == "mps" else torch.float64
    p = positions.to(device=device, dtype=torch.float32)[..., None]

    def angles(inv: torch.Tensor) -> torch.Tensor:
        inv = inv.to(device).float()
        return (p * (inv[:, None, :] if inv.dim() == 2 else inv)).to(wide)

    delta = (angles(inv_new) - angles(inv_old))[:, None]
    ratio = torch.as_tensor(s_new, dtype=wide, device=device) / torch.as_tensor(s_old, dtype=wide, device=device)
    ratio = ratio.reshape(-1, 1, 1, 1) if ratio.dim() else ratio
    return (delta.cos() * ratio).float(), (delta.sin() * ratio).float()


def rerotate_keys(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, first: int = 0,
                  interleaved: bool = False) -> torch.Tensor:
    """``keys`` ``[b, h, m, d]`` turned by the (cos, sin) of :func:`rerotation` on their ``rot = 2 * cos.shape[-1]``
    rotary dimensions from ``first`` (MLA's rotated part follows a position-free one), the rest untouched; pairs
    ``(i, i + rot / 2)`` (rotate-half, Llama's) or, ``interleaved``, ``(2i, 2i + 1)`` (Cohere's, GLM's). In place
    (computed in float32, written in ``keys``' dtype); returns ``keys``."""
    half = cos.shape[-1]
    part = keys[..., first : first + 2 * half]
    x1, x2 = (part[..., 0::2], part[..., 1::2]) if interleaved else (part[..., :half], part[..., half:])
    x1, x2 = x1.float(), x2.float()
    first_half = torch.addcmul(x1 * cos, x2, sin, value=-1.0)
    second_half = torch.addcmul(x2 * cos, x1, sin)
    if interleaved:
        part[..., 0::2], part[..., 1::2] = first_half, second_half
    else:
        part[..., :half], part[..., half:] = first_half, second_half
    return keys


# -- a scaling on top of a checkpoint's own --------------------------------------------------------------------------
# A scaling applied to a checkpoint whose RoPE is already scaled (Llama 3.1's llama3 x8, gpt-oss's YaRN x32) acts on
# the frequencies the checkpoint computes now, ``own`` (its rotary module's ``inv_freq``, ``[rot / 2]``), with L =
# ``context``, the context the checkpoint advertises now: it extends from there, keeps what that scaling kept fast and
# scales the rest by the method's own rule. Each returns (new inv_freq in fp32, the attention scaling the method adds,
# multiplied into the checkpoint's own by the caller).

def compose_linear(own: torch.Tensor, context: int, factor: float, params: dict[str, Any]):
    """PI on top (Chen et al. 2023): every frequency divided by s."""
    return (own.double() / factor).float(), 1.0


def compose_ntk(own: torch.Tensor, context: int, factor: float, params: dict[str, Any]):
    """NTK-aware on top: the base change theta' = theta s^(d/(d-2)) multiplies frequency i (of d/2) by
    s^(-2i/(d-2)): the fastest kept, the slowest divided by s."""
    half = own.shape[-1]
    i = torch.arange(half, dtype=torch.float64, device=own.device)
    return (own.double() * factor ** (-2 * i / max(2 * half - 2, 1))).float(), 1.0


def turns_index(own: torch.Tensor, context: int, turns: float) -> float:
    """The (fractional) frequency index at which the frequencies ``own`` turn ``turns`` times within ``context``
    tokens, log-linear between neighbours and past the ends: on plain RoPE frequencies exactly YaRN's correction
    dimension (their log-turns fall linearly with the index)."""
    logs = torch.log(context * own.double() / (2 * math.pi)).tolist()
    target = math.log(turns)
    last = len(logs) - 2
    at = next((i for i in range(last + 1) if logs[i + 1] <= target), last) if target < logs[0] else 0
    drop = logs[at] - logs[at + 1]
    return at + (logs[at] - target) / drop if drop > 0 else float(at)


def compose_yarn(own: torch.Tensor, context: int, factor: float, params: dict[str, Any]):
    """YaRN "NTK-by-parts" on top (Peng et al. 2023, sec. 3.2): frequencies turning more than beta_fast times within
    the checkpoint's current context L keep theirs, those turning fewer than beta_slow times are divided by s, and a
    linear ramp over the index blends those between -- the indices found on the checkpoint's own frequencies
    (:func:`turns_index`), truncated as YaRN truncates them; on plain frequencies exactly :func:`rope_yarn`.
    Attention factor 0.1 ln s + 1 unless given."""
    if params.get("attention_factor") is None and (params.get("mscale") or params.get("mscale_all_dim")):
        raise ValueError("yarn's mscale / mscale_all_dim are not used on top of another scaling: give "
                         "attention_factor, or original_max_position_embeddings to replace the checkpoint's scaling")
    half = own.shape[-1]
    low, high = turns_index(own, context, params["beta_fast"]), turns_index(own, context, params["beta_slow"])
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    keep = 1 - _linear_ramp(max(low, 0), min(high, 2 * half - 1), half).double().to(own.device)
    attention = params.get("attention_factor")
    attention = yarn_mscale(factor) if attention is None else attention
    return (own.double() * (keep + (1 - keep) / factor)).float(), attention


def compose_llama3(own: torch.Tensor, context: int, factor: float, params: dict[str, Any]):
    """Llama 3.1's smoothing on top: wavelengths shorter than L / high_freq_factor kept, longer than
    L / low_freq_factor divided by s, blended in between, L the checkpoint's current context."""
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    inv = own.double()
    wavelen = 2 * math.pi / inv
    smooth = torch.clamp((context / wavelen - low) / (high - low), 0.0, 1.0)
    return (inv * ((1 - smooth) / factor + smooth)).float(), 1.0


def compose_longrope(own: torch.Tensor, context: int, factor: float, params: dict[str, Any]):
    """LongRoPE's per-dimension factors on top: theta_i / lambda_i with the ``long_factor`` list."""
    long = torch.tensor(params["long_factor"], dtype=torch.float64, device=own.device)
    attention = params.get("attention_factor")
    attention = longrope_attention_factor(factor, context) if attention is None else attention
    return (own.double() / long).float(), attention
