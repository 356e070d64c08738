"""Parity with transformers' own RoPE types, on every tested family, below and above the original context."""

import math

import pytest
import torch
from helpers import ORIGINAL, THETA, clone_with_config, ids, logits, tiny_model

import hf_posenc
from hf_posenc.encodings import rope as R

FACTOR = 2.0
LENGTHS = (40, 150)  # below and above the original context of 64
HALF = 8  # rotary dim / 2 of the tiny models (head_dim 16)
SHORT = [1.0 + 0.05 * i for i in range(HALF)]
LONG = [1.0 + 0.4 * i for i in range(HALF)]

# hf_posenc method + knobs  ->  the rope_parameters transformers gets for the same thing, written out by hand
CASES = {
    "pi": (dict(factor=FACTOR), {"rope_type": "linear", "factor": FACTOR}, int(FACTOR * ORIGINAL)),
    "dynamic_ntk": (dict(factor=FACTOR), {"rope_type": "dynamic", "factor": FACTOR}, ORIGINAL),
    "yarn": (dict(factor=4.0), {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
             4 * ORIGINAL),
    "yarn_knobs": (
        dict(factor=4.0, beta_fast=16.0, beta_slow=2.0, attention_factor=1.3),
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL, "beta_fast": 16.0,
         "beta_slow": 2.0, "attention_factor": 1.3},
        4 * ORIGINAL,
    ),
    "llama3": (
        dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0),
        {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": ORIGINAL, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0},
        8 * ORIGINAL,
    ),
    "longrope": (
        dict(factor=FACTOR, short_factor=SHORT, long_factor=LONG),
        {"rope_type": "longrope", "factor": FACTOR, "original_max_position_embeddings": ORIGINAL,
         "short_factor": SHORT, "long_factor": LONG},
        int(FACTOR * ORIGINAL),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("length", LENGTHS)
def test_native_parity(family, case, length):
    """A single unpadded call of a fresh model: where transformers' dynamic type and hf_posenc's per-row,
    history-free dynamic NTK agree (a padded batch or a call after a longer one: tests/test_dynamic_matrix.py)."""
    kwargs, native, max_pos = CASES[case]
    method = case.split("_knobs")[0]
    model = tiny_model(family)
    ref = clone_with_config(model, {"rope_theta": THETA, **native}, max_pos)
    x = ids(length)
    unpatched = logits(model, x)
    hf_posenc.patch(model, method, **kwargs)
    out = logits(model, x)
    diff = (out - logits(ref, x)).abs().max().item()
    assert diff <= 1e-5, f"{family}/{case} at {length} tokens: max abs diff {diff}"
    if length > ORIGINAL:  # the comparison is not vacuous: the method really changes the model there
        assert (out - unpatched).abs().max().item() > 1e-3


def test_llama3_really_smooths(family):
    """The llama3 case must exercise all three wavelength bands, or the parity above proves little."""
    from hf_posenc.encodings.rope import RopeGeometry, default_inv_freq, rope_llama3

    geom = RopeGeometry(THETA, 16, ORIGINAL)
    base = default_inv_freq(THETA, 16)
    scaled, _ = rope_llama3(geom, 8.0, {"low_freq_factor": 1.0, "high_freq_factor": 4.0})
    ratio = base / scaled
    assert (ratio == 1).any() and torch.isclose(ratio, torch.tensor(8.0)).any()
    assert ((ratio > 1.01) & (ratio < 7.99)).any()


@pytest.mark.parametrize("length", LENGTHS)
def test_ntk_is_default_rope_with_rescaled_base(family, length):
    model = tiny_model(family)
    dim = 16
    new_theta = THETA * FACTOR ** (dim / (dim - 2))
    ref = clone_with_config(model, {"rope_type": "default", "rope_theta": new_theta}, int(FACTOR * ORIGINAL))
    hf_posenc.patch(model, "ntk", factor=FACTOR)
    x = ids(length)
    assert (logits(model, x) - logits(ref, x)).abs().max().item() <= 1e-5
    assert model.config.rope_parameters["rope_theta"] == pytest.approx(new_theta, rel=1e-12)


def reference_dynamic_yarn(base, dim, original, seq_len, beta_fast=32, beta_slow=1):
    """Dynamic YaRN written out from the paper (arXiv:2309.00071, sec. 3.2-3.3) in float64, as an
    independent check: s = max(1, l/L); r(d) = L / lambda_d; gamma ramps from 0 at r < beta_slow to 1 at
    r > beta_fast over the floored/ceiled correction dims; h(theta_d) = (1-gamma) theta_d/s + gamma theta_d."""
    s = max(1.0, seq_len / original)
    theta = [base ** (-2 * i / dim) for i in range(dim // 2)]
    if s == 1.0:
        return torch.tensor(theta, dtype=torch.float64), 1.0

    def corr(rot):
        return dim * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), dim - 1)
    out = []
    for i, t in enumerate(theta):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0 -> keep, 1 -> interpolate
        gamma = 1 - ramp
        out.append((1 - gamma) * t / s + gamma * t)
    return torch.tensor(out, dtype=torch.float64), 0.1 * math.log(s) + 1


@pytest.mark.parametrize("length", LENGTHS)
def test_dynamic_yarn_follows_the_paper(family, length):
    model = tiny_model(family)
    ref = tiny_model(family)
    hf_posenc.patch(model, "dynamic_yarn", factor=4.0)
    x = ids(length)
    out = logits(model, x)
    inv_freq, mscale = reference_dynamic_yarn(THETA, 16, ORIGINAL, length)
    # the frequencies of a call live only during it (no history): the schedule is checked directly
    ours, scaling = R.rope_dynamic_yarn(R.RopeGeometry(THETA, 16, ORIGINAL), 4.0, hf_posenc.get_config(model).params,
                                        seq_len=length)
    assert torch.allclose(ours.double(), inv_freq, rtol=1e-6, atol=0)
    assert scaling == pytest.approx(mscale, rel=1e-12)
    # the same frequencies set by hand on an unpatched copy give the same logits
    ref.model.rotary_emb.inv_freq = inv_freq.float()
    ref.model.rotary_emb.attention_scaling = mscale
    assert (out - logits(ref, x)).abs().max().item() <= 1e-5
    if length > ORIGINAL:
        assert mscale > 1.0  # the long case really scales


def test_none_keeps_the_checkpoints_own_scaling():
    """``none`` is the baseline: a checkpoint that already scales its RoPE (Llama 3.1) keeps that scaling."""
    rp = {"rope_type": "llama3", "rope_theta": THETA, "factor": 8.0, "original_max_position_embeddings": 32,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    model = tiny_model("llama", rope_parameters=dict(rp))
    x = ids(100)
    before = logits(model, x)
    hf_posenc.patch(model, "none")
    assert torch.equal(logits(model, x), before)
    assert model.config.rope_parameters == rp and model.config.max_position_embeddings == ORIGINAL


def test_none_is_identity(family):
    model = tiny_model(family)
    x = ids(100)
    before = logits(model, x)
    hf_posenc.patch(model, "none")
    assert torch.equal(before, logits(model, x))
