"""Self-Extend (Jin et al. 2024) against a decoder written out here: RoPE applied from scratch to the raw
queries and keys at the neighbour positions (i, j) and at the grouped ones (floor(i/G) + W - W/G,
floor(j/G)), the neighbour score where i - j < W, the grouped one elsewhere, one softmax."""

import math

import pytest
import torch
from helpers import ORIGINAL, THETA, cached_last_logits, ids, logits, tiny_model, written_out_decoder

import hf_posenc


def rope(x, pos, dim):
    inv = 1.0 / (THETA ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = pos.double()[:, None] * inv[None, :]
    cos, sin = torch.cat((ang, ang), -1).cos().float(), torch.cat((ang, ang), -1).sin().float()
    half = dim // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def reference(model, input_ids, group, window):
    pos = torch.arange(input_ids.shape[1])
    gq, gk = pos // group + window - window // group, pos // group
    rel = pos[:, None] - pos[None, :]

    def scores(q, k, d):
        near = rope(q, pos, d) @ rope(k, pos, d).transpose(-1, -2)
        far = rope(q, gq, d) @ rope(k, gk, d).transpose(-1, -2)
        return torch.where(rel < window, near, far) / math.sqrt(d)

    return written_out_decoder(model, input_ids, scores)


@pytest.mark.parametrize("family,group,window,block", [("llama", 4, 16, 512), ("qwen2", 8, 24, 32),
                                                        ("qwen3", 3, 12, 7), ("mistral", 2, 8, 50)])
def test_self_extend_matches_the_written_out_decoder(family, group, window, block):
    model = tiny_model(family)
    model.config._attn_implementation = "sdpa"
    hf_posenc.patch(model, "self_extend", group_size=group, window=window)
    model.model.layers[0].self_attn._hf_posenc_remapped.block = block
    assert model.config.max_position_embeddings == (ORIGINAL - window) * group + window
    x = ids(200, batch=2)
    assert (logits(model, x) - reference(model, x, group, window)).abs().max().item() <= 1e-5


def test_self_extend_cache_generate_save_and_unpatch(tmp_path):
    model = tiny_model("llama")
    x = ids(120)
    before = logits(model, x)
    hf_posenc.patch(model, "self_extend", group_size=4)
    assert hf_posenc.get_config(model).params["window"] == ORIGINAL // 4  # default: a quarter of the context
    full = logits(model, x)
    assert (cached_last_logits(model, x, 100) - full[:, 99:119]).abs().max().item() <= 1e-5
    gen = model.generate(x[:, :90], attention_mask=torch.ones(1, 90, dtype=torch.long), max_new_tokens=10,
                         do_sample=False)
    assert torch.equal(logits(model, gen)[:, 89:-1].argmax(-1), gen[:, 90:])
    model.save_pretrained(tmp_path)
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert hf_posenc.get_config(again) == hf_posenc.get_config(model)
    assert (logits(again, x) - full).abs().max().item() <= 1e-5
    hf_posenc.unpatch(model)
    assert torch.equal(logits(model, x), before) and model.config._attn_implementation == "eager"


def test_self_extend_errors_are_clear():
    with pytest.raises(ValueError, match="window must be a multiple of group_size \\(4\\), got window=10"):
        hf_posenc.PosEncConfig("self_extend", params={"group_size": 4, "window": 10})
    with pytest.raises(ValueError, match="group_size must be an integer >= 2"):
        hf_posenc.PosEncConfig("self_extend", params={"group_size": 1})
    with pytest.raises(ValueError, match=f"window=64 must be shorter than the original context \\({ORIGINAL}\\)"):
        hf_posenc.patch(tiny_model("llama"), "self_extend", group_size=4, window=64)
    sliding = tiny_model("mistral", sliding_window=32)  # every layer slides: nothing to extend
    with pytest.raises(ValueError, match="self_extend replaces full attention; model_type='mistral' has none "
                                         "\\(its layers: \\['sliding_attention'\\]; sliding_window=32\\)"):
        hf_posenc.patch(sliding, "self_extend")
    assert not hf_posenc.is_patched(sliding)
