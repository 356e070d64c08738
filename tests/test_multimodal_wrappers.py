"""The language model inside a multimodal wrapper (Gemma 3's ``Gemma3ForConditionalGeneration``, which is what
Gemma 3 4B/12B/27B load as): found through ``model.language_model``, so a method computes there exactly what it
computes on the text model with the same weights (``Gemma3ForCausalLM``). The re-rotated cache of dynamic NTK turns
the full-attention layers' keys only (it turned every layer's before, the sliding ones too: keys 0.38 off, no error);
an attention-level method runs on text and refuses a call with images before the vision tower runs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, DynamicCache, Gemma3ForCausalLM, Gemma3ForConditionalGeneration

import hf_posenc

TEXT = dict(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, sliding_window=8, max_position_embeddings=64,
            layer_types=["sliding_attention", "full_attention"] * 2,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 50000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})
VISION = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)
IMAGE = 90


def pair():
    """The multimodal model and the text model holding its language model's weights."""
    cfg = AutoConfig.for_model("gemma3", text_config=dict(TEXT, model_type="gemma3_text"), vision_config=VISION,
                               mm_tokens_per_image=4, image_token_id=IMAGE)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    wrapped = Gemma3ForConditionalGeneration(cfg).eval()
    text_cfg = AutoConfig.for_model("gemma3_text", **TEXT)
    text_cfg._attn_implementation = "eager"
    text = Gemma3ForCausalLM(text_cfg).eval()
    text.load_state_dict({k.replace("model.language_model.", "model."): v for k, v in wrapped.state_dict().items()
                          if k.startswith(("model.language_model.", "lm_head."))})
    return wrapped, text


def tokens(n, seed=1):
    return torch.randint(3, 89, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def cache_gaps(model, n_prompt=60, n=68):
    """Per layer, how far the keys cached while decoding from ``n_prompt`` to ``n`` tokens are from those of one
    forward over all ``n``."""
    seq, config = tokens(n, seed=3), model.config.get_text_config()
    cache = DynamicCache(config=config)
    model(input_ids=seq[:, :n_prompt], past_key_values=cache, use_cache=True)
    for i in range(n_prompt, n):
        model(input_ids=seq[:, i : i + 1], past_key_values=cache, use_cache=True)
    fresh = DynamicCache(config=config)
    model(input_ids=seq, past_key_values=fresh, use_cache=True)
    return [(cache.layers[i].keys - fresh.layers[i].keys).abs().max().item() for i in range(len(cache.layers))]


def test_the_re_rotated_cache_turns_the_same_layers_as_on_the_text_model():
    wrapped, text = pair()
    gaps = {}
    for name, model in (("wrapped", wrapped), ("text", text)):
        hf_posenc.patch(model, "dynamic_ntk", factor=2.0)  # cache="consistent"
        gaps[name] = cache_gaps(model)
    assert gaps["wrapped"] == pytest.approx(gaps["text"], abs=1e-6)
    assert max(gaps["wrapped"][:2]) <= 1e-5  # the first sliding layer (RoPE unchanged) and the first full layer


@pytest.mark.parametrize("method,knobs", [("self_extend", {"group_size": 4, "window": 16}),
                                          ("dca", {"chunk_size": 48, "local_window": 4})])
def test_an_attention_level_method_on_text_equals_the_text_model_and_refuses_images(method, knobs):
    wrapped, text = pair()
    x = tokens(120)
    with torch.no_grad():
        before = wrapped(input_ids=x).logits
        want = hf_posenc.patch(text, method, **knobs)(x).logits
        got = hf_posenc.patch(wrapped, method, **knobs)(input_ids=x).logits
    assert (got - want).abs().max().item() <= 1e-5 and (got - before).abs().max().item() > 1e-4
    calls = []
    wrapped.model.vision_tower.register_forward_pre_hook(lambda *a: calls.append(1))
    ids = x.clone()
    ids[0, 10:14] = IMAGE
    for called in (wrapped, wrapped.model):  # the base model called alone too (Gemma3Model)
        with pytest.raises(ValueError, match=f"{method} \\(hf_posenc\\) computes causal attention over text "
                                             "positions; this call has pixel_values"):
            called(input_ids=ids, pixel_values=torch.randn(1, 3, 28, 28))
    assert not calls
    with torch.no_grad():  # text alone through generate (it passes an empty mm_encoder_outputs)
        runs = [m.generate(input_ids=x[:, :56], max_new_tokens=12, min_new_tokens=12, do_sample=False,
                           pad_token_id=0) for m in (wrapped, text)]
    assert torch.equal(runs[0], runs[1])
