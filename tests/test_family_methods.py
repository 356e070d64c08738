"""The families the llama-only matrices leave out -- Qwen3 (q/k norms, explicit head_dim), Mistral
WITH a sliding window (24, crossed by every sequence here) and Gemma 3 (per-layer-type RoPE: sliding and full
layers with different rope_theta) -- with each attention-level method, the family swaps and RoPE scalings:

* a left-padded batch row equals the row alone (positions from the mask, as generate passes them);
* greedy ``generate`` with the KV cache equals recomputing each row's whole sequence without a cache;
* ``hf_posenc.save_pretrained`` -> ``hf_posenc.from_pretrained`` gives the same logits and config;
* what a family cannot take is refused by name.

fp32 throughout: "equal" means within 1e-5 (measured ~2e-7 to ~5e-7)."""

from __future__ import annotations

import io
import logging
import math

import pytest
import torch
from helpers import SMALL_WINDOW_KNOBS, ids, logits, tiny_model, written_out_decoder
from test_layered_rope import gemma

import hf_posenc
from hf_posenc.encodings.alibi import alibi_slopes

EXACT = 1e-5
WINDOW = 24  # Mistral's and Gemma 3's sliding window here
PROMPT, PAD, NEW = 70, 11, 6  # row 1 is 59 real tokens: past every window below, within the original 64

KNOBS = SMALL_WINDOW_KNOBS
ATTENTION_LEVEL = ("self_extend", "dca", "string", "rerope", "leaky_rerope")

# (family, method) pairs each family accepts; LongRoPE (and the dynamic scalings) under left padding and caches
# are tested in tests/test_dynamic_matrix.py and stay out here
ACCEPTED = {
    "qwen3": ATTENTION_LEVEL + ("alibi", "nope", "learned", "sinusoidal", "yarn", "llama3"),
    "mistral_sw": ("alibi", "nope", "learned", "sinusoidal", "yarn", "llama3"),
    "gemma3": ("self_extend", "dca", "nope", "yarn", "llama3", "pi"),
}
CASES = [(f, m) for f, ms in ACCEPTED.items() for m in ms]
PADDED_CASES = [(f, m, ("eager", "sdpa")[i % 2]) for i, (f, m) in enumerate(CASES)]  # each impl on every other case


def build(family: str):
    if family == "gemma3":
        return gemma()
    if family == "mistral_sw":
        return tiny_model("mistral", sliding_window=WINDOW)
    return tiny_model(family)


def patched(family: str, method: str, impl: str = "eager"):
    model = build(family)
    model.config._attn_implementation = impl
    return hf_posenc.patch(model, method, **KNOBS[method])


def padded_batch():
    x = ids(PROMPT, seed=5, batch=2)
    mask = torch.ones_like(x)
    mask[1, :PAD] = 0
    x[1, :PAD] = 0
    return x, mask


@torch.no_grad()
def forward(model, x, mask=None):
    mask = torch.ones_like(x) if mask is None else mask
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(x, attention_mask=mask, position_ids=position_ids, use_cache=False).logits.float()


# -- a left-padded row equals the row alone ------------------------------------------------------------------------
@pytest.mark.parametrize("family,method,impl", PADDED_CASES)
def test_a_left_padded_row_equals_the_row_alone(family, method, impl):
    model = patched(family, method, impl)
    x, mask = padded_batch()
    out = forward(model, x, mask)
    assert (out[0] - forward(model, x[:1])[0]).abs().max().item() <= EXACT
    alone = forward(model, x[1:2, PAD:])[0]
    assert (out[1, PAD:] - alone).abs().max().item() <= EXACT, (family, method, impl)
    if method not in ("pi", "yarn", "llama3"):  # scalings leave short contexts almost alone; the rest must act
        assert (alone - forward(build(family), x[1:2, PAD:])[0]).abs().max().item() > 1e-3


# -- cached greedy generate equals recomputation -------------------------------------------------------------------
def generate_gap(model) -> float:
    """Max |logit| difference between greedy cached ``generate`` on the padded batch (its default cache) and
    each row's whole sequence recomputed alone without a cache."""
    x, mask = padded_batch()
    with torch.no_grad():
        out = model.generate(x, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    seqs, steps = out.sequences, torch.stack(out.logits, 1).float()
    assert seqs.shape[1] == PROMPT + NEW
    worst = 0.0
    for r, pad in enumerate((0, PAD)):
        full = logits(model, seqs[r : r + 1, pad:])[0, PROMPT - pad - 1 : -1]
        worst = max(worst, (full - steps[r]).abs().max().item())
    return worst


@pytest.mark.parametrize("family,method", [c for c in CASES if c != ("mistral_sw", "alibi")])
def test_cached_greedy_generate_equals_recomputation(family, method):
    assert generate_gap(patched(family, method)) <= EXACT, (family, method)


# alibi reads only i - j: a cache sliding over the model's own window keeps it exact
@pytest.mark.parametrize("cache_implementation", [None, "dynamic", "static"])
def test_alibi_on_sliding_window_mistral_generates(cache_implementation):
    model = patched("mistral_sw", "alibi")
    if cache_implementation:
        model.generation_config.cache_implementation = cache_implementation
    assert generate_gap(model) <= EXACT


# -- save / load round trip ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("family,method", CASES)
def test_save_and_load_round_trip(family, method, tmp_path):
    model = patched(family, method)
    hf_posenc.save_pretrained(model, str(tmp_path))
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert hf_posenc.get_config(again) == hf_posenc.get_config(model)
    if family == "mistral_sw":
        assert again.config.sliding_window == WINDOW
    x = ids(100, seed=9)  # past the original 64 (learned: within its 128-position table)
    assert (logits(again, x) - logits(model, x)).abs().max().item() <= EXACT, (family, method)


def test_reloading_a_learned_swap_reports_no_unexpected_key(tmp_path):
    from transformers.utils import logging as hf_logging

    model = patched("qwen3", "learned")
    hf_posenc.save_pretrained(model, str(tmp_path))
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    hf_logging.get_logger("transformers").addHandler(handler)
    try:
        again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    finally:
        hf_logging.get_logger("transformers").removeHandler(handler)
    x = ids(100, seed=9)
    assert (logits(again, x) - logits(model, x)).abs().max().item() <= EXACT  # the table did load
    assert "UNEXPECTED" not in buf.getvalue(), buf.getvalue()


def test_a_load_report_naming_any_other_key_is_kept_whole():
    from hf_posenc.checkpoints.loading import _ReportOwnKeysQuietly

    def report(*rows):
        table = "\n".join(f"{key} | {status} |  | " for key, status in rows)
        return logging.LogRecord("transformers.modeling_utils", logging.WARNING, "", 0,
                                 f"Qwen3ForCausalLM LOAD REPORT from: x\nKey | Status |  | \n---\n{table}\n", None,
                                 None)

    quiet = _ReportOwnKeysQuietly(True)
    assert not quiet.filter(report(("model.hf_posenc_positions.weight", "UNEXPECTED")))
    assert quiet.filter(report(("model.hf_posenc_positions.weight", "UNEXPECTED"), ("lm_head.weight", "MISSING")))
    assert quiet.filter(report(("model.layers.0.extra.weight", "UNEXPECTED")))
    assert quiet.filter(report(("model.hf_posenc_positions.weight", "MISMATCH")))


# -- Mistral's sliding window under ALiBi, written out -------------------------------------------------------------
@pytest.mark.parametrize("block", [None, 16])
def test_alibi_on_sliding_window_mistral_keeps_the_window(block):
    """softmax(q k^T / sqrt(d) - slope * (i - j)) over keys with 0 <= i - j < 24, left padding masked."""
    model = patched("mistral_sw", "alibi", impl="sdpa")
    state = model.model.layers[0].self_attn._hf_posenc_alibi
    state.block, state.full_limit = (block, 0) if block else (10**6, 2**28)
    x, mask = padded_batch()
    slopes = alibi_slopes(model.config.num_attention_heads)
    t = x.shape[1]
    pos = torch.arange(t)
    dist = (pos[:, None] - pos[None, :]).float()
    band = (dist < WINDOW)[None, None]

    def scores(q, k, d):
        s = q @ k.transpose(-1, -2) / math.sqrt(d) - slopes[:, None, None] * dist.abs()
        return s.masked_fill(~band, float("-inf"))

    want = written_out_decoder(model, x, scores, allowed=mask[:, None, None, :].bool())
    with torch.no_grad():
        got = model(x, attention_mask=mask).logits.float()
    assert (got[0] - want[0]).abs().max().item() <= EXACT
    # row 1 alone starts at its first real token; its window is the same band of 24
    assert (got[1, PAD:] - want[1, PAD:]).abs().max().item() <= EXACT
    no_window = hf_posenc.patch(tiny_model("mistral", sliding_window=None), "alibi")
    assert (logits(no_window, x[:1]) - got[:1]).abs().max().item() > 1e-3  # the window really cut keys off


# -- refusals by name ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ATTENTION_LEVEL)
def test_attention_level_methods_refuse_a_sliding_window_mistral_by_name(method):
    with pytest.raises(ValueError, match=f"{method} replaces full attention; model_type='mistral' has none \\(its "
                                         f"layers: \\['sliding_attention'\\]; sliding_window={WINDOW}\\)"):
        patched("mistral_sw", method)


@pytest.mark.parametrize("method", ("alibi", "learned", "sinusoidal"))
def test_gemma3_refuses_what_needs_one_plain_rope_by_name(method):
    model = gemma()
    x = ids(40)
    before = logits(model, x)
    with pytest.raises(ValueError, match="per-layer-type"):
        hf_posenc.patch(model, method, **KNOBS[method])
    assert not hf_posenc.is_patched(model)
    assert torch.equal(logits(model, x), before)  # a refusal leaves nothing behind
