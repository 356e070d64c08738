"""The CUDA kernel of the remapped-position attention (:mod:`adapters.remapped_attention`): flash attention that
returns its log-sum-exp, ``torch.ops.aten._scaled_dot_product_flash_attention`` (fp16/bf16, head dim a multiple of 8
up to 256), for the pieces' unmasked core rectangles and causal squares -- the parts whose size grows with the keys --
and memory-efficient attention with an additive bias and its log-sum-exp,
``torch.ops.aten._scaled_dot_product_efficient_attention``, for the masked bands (at most ``block x block`` per piece
and block). fp32 models and autograd stay on the eager kernel.

Grouped-query heads are folded into the query axis for the rectangles (no repeated keys); a causal square repeats
them (folding would break the causal pattern). The square is exactly square, so flash's bottom-right causal
alignment is the top-left one the scheme asks for.

Trust is checked, not assumed: the first use of a (device, dtype, head dim) compares the kernel with a written-out
fp32 reference on small random inputs (a folded rectangle, a causal square and a masked band; output and
log-sum-exp); a kernel that raises or differs is not used for that combination (the eager kernel is), with one
warning saying so.
"""

from __future__ import annotations

import warnings

import torch

from .attention import fold_groups, repeat_heads, unfold_groups

FLASH_DTYPES = (torch.float16, torch.bfloat16)
_checked: dict[tuple[str, torch.dtype, int], bool] = {}  # (device, dtype, head dim) -> the kernel passed its check


def flash_usable(q: torch.Tensor, dropout: float) -> bool:
    """Whether flash computes this call: CUDA, fp16/bf16, a head dim it takes, no dropout, and its check passed."""
    d = q.shape[-1]
    if q.device.type != "cuda" or q.dtype not in FLASH_DTYPES or d % 8 or d > 256 or dropout:
        return False
    key = (str(q.device), q.dtype, d)
    if key not in _checked:
        _checked[key] = _self_check(q.device, q.dtype, d)
    return _checked[key]


def flash_piece(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` ``[b, h, n, d]`` over all of ``k``/``v`` ``[b, h_kv, m, d]`` (``causal``: a square, top-left
    causal): ``(out [b, h, n, dv] float32, lse [b, h, n] float32)``."""
    _, h, n, _ = q.shape
    groups = h // k.shape[1]
    if causal:
        out, lse = _flash(q, repeat_heads(k, groups), repeat_heads(v, groups), True, scale)
    else:
        out, lse = unfold_groups(*_flash(fold_groups(q, k.shape[1]), k, v, False, scale), h, n)
    return out.float(), lse.float()


def band_piece(q, k, v, allowed: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` ``[b, h, n, d]`` over ``k``/``v`` ``[b, h_kv, m, d]`` where ``allowed`` ``[n, m]`` (bool)
    lets it: ``(out, lse)`` float32, as :func:`flash_piece` (a query allowed no key: a finite, meaningless lse that
    the caller replaces by -inf)."""
    b, h, n, _ = q.shape
    hk, m = k.shape[1], k.shape[2]
    groups = h // hk
    padded = -(-m // 16) * 16  # the kernel wants the bias's rows 16-element aligned: a wider buffer, sliced
    bias = torch.full((groups * n, padded), torch.finfo(q.dtype).min, dtype=q.dtype, device=q.device)
    bias[:, :m].masked_fill_(allowed.repeat(groups, 1), 0.0)
    got = _efficient(fold_groups(q, hk), k, v, bias[:, :m].expand(b, hk, groups * n, m), scale)
    out, lse = unfold_groups(*got, h, n)
    return out.float(), lse.float()


def _efficient(q, k, v, bias, scale: float):
    got = torch.ops.aten._scaled_dot_product_efficient_attention(q.contiguous(), k.contiguous(), v.contiguous(), bias,
                                                                 True, 0.0, False, scale=scale)
    return got[0], got[1]


def _flash(q, k, v, causal: bool, scale: float):
    got = torch.ops.aten._scaled_dot_product_flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), 0.0,
                                                             causal, False, scale=scale)
    return got[0], got[1]


def reference(q, k, v, causal: bool, scale: float, allowed: torch.Tensor | None = None):
    """What :func:`flash_piece` (and, with ``allowed``, :func:`band_piece`) computes, written out in fp32 (heads
    repeated, softmax by its log-sum-exp)."""
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_heads(k, groups).float(), repeat_heads(v, groups).float()
    scores = torch.matmul(q.float(), k.transpose(-1, -2)) * scale
    if causal:
        n = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v), lse


def _self_check(device, dtype: torch.dtype, d: int) -> bool:
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(1, 4, 48, d, generator=gen).to(device, dtype)
    k, v = (torch.randn(1, 2, 48, d, generator=gen).to(device, dtype) for _ in range(2))
    rows, cols = torch.arange(16, device=device)[:, None], torch.arange(37, device=device)[None, :]
    band = (cols >= rows) & (cols <= rows + 20)  # 37 keys: not a multiple of the kernel's alignment
    try:
        for kind, (qq, kk, vv) in (("rectangle", (q[:, :, :16], k, v)), ("causal", (q, k, v)),
                                   ("band", (q[:, :, :16], k[:, :, :37], v[:, :, :37]))):
            if kind == "band":
                out, lse = band_piece(qq, kk, vv, band, d ** -0.5)
                ref_out, ref_lse = reference(qq, kk, vv, False, d ** -0.5, band)
            else:
                out, lse = flash_piece(qq, kk, vv, kind == "causal", d ** -0.5)
                ref_out, ref_lse = reference(qq, kk, vv, kind == "causal", d ** -0.5)
            if not (torch.allclose(out, ref_out, atol=3e-2, rtol=3e-2) and torch.allclose(lse, ref_lse, atol=3e-2)):
                raise ValueError(f"the {kind} differs from the reference by "
                                 f"{(out - ref_out).abs().max().item():.3g} (output), "
                                 f"{(lse - ref_lse).abs().max().item():.3g} (log-sum-exp)")
    except Exception as err:  # a kernel this torch or GPU lacks, or one that computes something else
        warnings.warn(f"hf_posenc: fused attention with log-sum-exp on {device} ({dtype}, head dim {d}) failed its "
                      f"check ({err}); the remapped attention uses its eager kernel there", RuntimeWarning,
                      stacklevel=3)
        return False
    return True
