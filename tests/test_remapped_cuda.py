"""The CUDA kernel path of the remapped-position attention (adapters/cuda_kernels.py).

Everywhere: its logic (grouped heads folded into the query axis, causal squares, merging by log-sum-exp, the check
that refuses a kernel computing something else) runs on the CPU with the CPU's fused kernel standing in for flash,
against the decoder written out in test_remapped. With CUDA: the real flash kernel in bf16 against the same
written-out reference (fp32, CPU), cached decode against the full forward, left padding against each row alone."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from helpers import cached_last_logits, ids, logits, tiny_model
from test_remapped import KNOBS, patched, reference

from hf_posenc.adapters import cuda_kernels, remapped_attention

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (the CPU tests above cover the same logic)")


def _cpu_flash(q, k, v, causal, scale):  # the CPU's fused kernel, top-left causal, in flash's place
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def _cpu_efficient(q, k, v, bias, scale):  # ... and with an additive bias, in memory-efficient attention's place
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias.contiguous(),
                                                                     scale=scale)


@pytest.fixture
def flash_on_cpu(monkeypatch):
    """flash_piece taken for every core rectangle and causal square on the CPU; the calls are counted."""
    calls = {"causal": 0, "rectangle": 0, "band": 0}

    def spy(q, k, v, causal, scale):
        calls["causal" if causal else "rectangle"] += 1
        return _cpu_flash(q, k, v, causal, scale)

    def band_spy(q, k, v, bias, scale):
        calls["band"] += 1
        return _cpu_efficient(q, k, v, bias, scale)

    monkeypatch.setattr(cuda_kernels, "_flash", spy)
    monkeypatch.setattr(cuda_kernels, "_efficient", band_spy)
    monkeypatch.setattr(remapped_attention, "flash_usable", lambda q, dropout: True)
    return calls


@pytest.mark.parametrize("method", list(KNOBS))
def test_the_flash_path_matches_the_written_out_decoder(method, flash_on_cpu):
    model = patched("qwen2", method, block=16)  # 4 heads over 2 KV heads: folded
    x = ids(200, batch=2)
    assert (logits(model, x) - reference(model, x, method, KNOBS[method])).abs().max().item() <= 1e-5
    assert flash_on_cpu["causal"] > 0 and flash_on_cpu["rectangle"] > 0 and flash_on_cpu["band"] > 0
    full = logits(model, x[:1, :150])
    assert (cached_last_logits(model, x[:1, :150], 97) - full[:, 96:149]).abs().max().item() <= 1e-5


def test_query_blocks_are_larger_on_the_fused_gpu_path_only():
    """2,048 query rows a block where flash and memory-efficient attention compute (CUDA, fp16/bf16, no autograd):
    launches, not work, bound small blocks there (BENCHMARKS.md); 256 for the eager kernel, whose fp32 scores grow
    with the block; a block the state names is kept everywhere."""
    state = patched("qwen2", "self_extend").model.layers[0].self_attn.__dict__[remapped_attention.STATE_ATTR]
    assert state.block is None
    assert state.rows(torch.zeros(1, 4, 8, 16)) == 256
    assert state.rows(SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, requires_grad=False)) == 2048
    assert state.rows(SimpleNamespace(is_cuda=True, dtype=torch.float32, requires_grad=False)) == 256
    assert state.rows(SimpleNamespace(is_cuda=True, dtype=torch.float16, requires_grad=True)) == 256
    with torch.no_grad():
        assert state.rows(SimpleNamespace(is_cuda=True, dtype=torch.float16, requires_grad=True)) == 2048
    state.block = 64
    assert state.rows(SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, requires_grad=False)) == 64


def test_flash_piece_folds_grouped_heads_and_keeps_the_square_causal(monkeypatch):
    monkeypatch.setattr(cuda_kernels, "_flash", _cpu_flash)
    monkeypatch.setattr(cuda_kernels, "_efficient", _cpu_efficient)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g),
               torch.randn(2, 2, 9, 16, generator=g))
    for causal in (False, True):
        out, lse = cuda_kernels.flash_piece(q, k, v, causal, 0.25)
        ref_out, ref_lse = cuda_kernels.reference(q, k, v, causal, 0.25)
        assert (out - ref_out).abs().max().item() <= 1e-5 and (lse - ref_lse).abs().max().item() <= 1e-5
    one, one_lse = cuda_kernels.flash_piece(q[:, :, -1:], k, v, False, 0.25)  # decoding: one query, every key
    assert (one - ref_out[:, :, -1:]).abs().max().item() <= 1e-5
    rows, cols = torch.arange(9)[:, None], torch.arange(9)[None, :]
    band = (cols >= rows - 3) & (cols <= rows)
    out, lse = cuda_kernels.band_piece(q, k, v, band, 0.25)
    ref_out, ref_lse = cuda_kernels.reference(q, k, v, False, 0.25, band)
    assert (out - ref_out).abs().max().item() <= 1e-5 and (lse - ref_lse).abs().max().item() <= 1e-5


def test_a_kernel_that_computes_something_else_is_not_used(monkeypatch):
    monkeypatch.setattr(cuda_kernels, "_flash", _cpu_flash)
    monkeypatch.setattr(cuda_kernels, "_efficient", _cpu_efficient)
    assert cuda_kernels._self_check("cpu", torch.float32, 16) is True

    def log2_lse(q, k, v, causal, scale):  # a log-sum-exp in base 2 would merge the pieces wrongly
        out, lse = _cpu_flash(q, k, v, causal, scale)
        return out, lse / torch.log(torch.tensor(2.0))

    monkeypatch.setattr(cuda_kernels, "_flash", log2_lse)
    with pytest.warns(RuntimeWarning, match="failed its check .*differs from the reference"):
        assert cuda_kernels._self_check("cpu", torch.float32, 16) is False
    monkeypatch.setattr(cuda_kernels, "_flash", _cpu_flash)

    def unaligned(q, k, v, bias, scale):  # a kernel that refuses the bias: found by the check, not by a user
        raise RuntimeError("attn_bias is not correctly aligned")

    monkeypatch.setattr(cuda_kernels, "_efficient", unaligned)
    with pytest.warns(RuntimeWarning, match="failed its check .*not correctly aligned"):
        assert cuda_kernels._self_check("cpu", torch.float32, 16) is False
    assert not cuda_kernels.flash_usable(torch.zeros(1, 1, 1, 16), 0.0)  # CPU: never the CUDA kernels


@needs_cuda
@pytest.mark.parametrize("method", list(KNOBS))
def test_cuda_bf16_matches_the_written_out_decoder(method):
    cpu = patched("qwen2", method)
    x = ids(200, batch=2)
    ref = reference(cpu, x, method, KNOBS[method])
    gpu = patched("qwen2", method).to("cuda", torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the flash check must pass on a GPU
        out = logits(gpu, x.cuda()).cpu()
    assert cuda_kernels._checked.get(("cuda:0", torch.bfloat16, 16)) is True
    assert (out - ref).abs().max().item() <= 0.05 * ref.abs().max().item()
    fp32 = logits(patched("qwen2", method).cuda(), x.cuda()).cpu()  # fp32 on a GPU: the eager kernel
    assert (fp32 - ref).abs().max().item() <= 1e-4


@needs_cuda
@pytest.mark.parametrize("method", list(KNOBS))
def test_cuda_cached_decode_and_left_padding(method):
    model = patched("qwen2", method, block=16).to("cuda", torch.bfloat16)
    x = ids(150).cuda()
    full = logits(model, x)
    steps = cached_last_logits(model, x, 97)
    assert (steps - full[:, 96:149]).abs().max().item() <= 0.05 * full.abs().max().item()
    a, b = ids(170, seed=3).cuda(), ids(151, seed=4).cuda()
    pad = 170 - 151
    batch = torch.cat([a, torch.cat([torch.zeros(1, pad, dtype=torch.long, device="cuda"), b], 1)])
    mask = torch.ones(2, 170, dtype=torch.long, device="cuda")
    mask[1, :pad] = 0
    with torch.no_grad():
        out = model(batch, attention_mask=mask).logits.float()
    alone = logits(model, b)
    assert (out[1, pad:] - alone[0]).abs().max().item() <= 0.05 * alone.abs().max().item()


@needs_cuda
def test_cuda_generation_runs_on_a_larger_head_dim():
    model = tiny_model("qwen3", head_dim=64).cuda().to(torch.bfloat16)
    model.config._attn_implementation = "sdpa"
    import hf_posenc

    hf_posenc.patch(model, "self_extend", group_size=4, window=16)
    x = ids(120).cuda()
    gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False)
    assert gen.shape[1] == 128 and cuda_kernels._checked.get(("cuda:0", torch.bfloat16, 64)) is True
