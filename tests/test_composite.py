"""Composite models (a vision tower plus a language model, its RoPE described by ``config.text_config``):
LLaVA over LLaMA, and Gemma 3 with vision (per-layer-type RoPE inside a composite). Scalings change the
language model's RoPE, equal transformers' native ``text_config.rope_parameters``, and reload."""

import copy

import pytest
import torch
from helpers import ORIGINAL, THETA, ids, tiny_config
from transformers import (
    AutoConfig,
    CLIPVisionConfig,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    LlavaConfig,
    LlavaForConditionalGeneration,
    SiglipVisionConfig,
)

import hf_posenc

YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": ORIGINAL}


def llava_config(rope_parameters=None, max_position_embeddings=ORIGINAL):
    text = tiny_config("llama", rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": THETA},
                       max_position_embeddings=max_position_embeddings)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
                              image_size=30, patch_size=6, projection_dim=32)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_id=95)
    cfg._attn_implementation = "eager"
    return cfg


def gemma_vlm_config(full=None, max_position_embeddings=ORIGINAL):
    text = AutoConfig.for_model(
        "gemma3_text", vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=24,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=max_position_embeddings,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": THETA, **(full or {})},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 7_000.0}})
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
                                image_size=28, patch_size=7)
    cfg = Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                       image_token_id=95, boi_token_id=93, eoi_token_id=94)
    cfg._attn_implementation = "eager"
    return cfg


def build(cls, cfg, seed=0):
    torch.manual_seed(seed)
    return cls(cfg).eval()


@torch.no_grad()
def lm_logits(model, n):
    return model(input_ids=ids(n, batch=1) % 90).logits  # text only (no image tokens)


@pytest.mark.parametrize("kind", ["llava", "gemma3"])
def test_scaling_the_language_model_of_a_composite_equals_native(kind, tmp_path):
    if kind == "llava":
        cls, make, native = (LlavaForConditionalGeneration, llava_config,
                             lambda: llava_config({"rope_theta": THETA, **YARN}, 2 * ORIGINAL))
    else:
        cls, make, native = (Gemma3ForConditionalGeneration, gemma_vlm_config,
                             lambda: gemma_vlm_config(YARN, 2 * ORIGINAL))
    shared = make()
    model, other = build(cls, shared), build(cls, shared)  # two instances of one config object
    before = lm_logits(model, 150)
    hf_posenc.patch(model, "yarn", factor=2.0)
    ref = cls(native()).eval()
    ref.load_state_dict(model.state_dict())
    assert (lm_logits(model, 150) - lm_logits(ref, 150)).abs().max().item() <= 1e-5
    assert torch.equal(lm_logits(other, 150), before)  # the other instance and the shared config are untouched
    assert shared.text_config.max_position_embeddings == ORIGINAL
    assert model.config.text_config.max_position_embeddings == 2 * ORIGINAL

    model.save_pretrained(tmp_path)
    plain = cls.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert (lm_logits(plain, 150) - lm_logits(model, 150)).abs().max().item() <= 1e-5
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert type(again) is cls and hf_posenc.get_config(again) == hf_posenc.get_config(model)
    assert (lm_logits(again, 150) - lm_logits(model, 150)).abs().max().item() <= 1e-6
    hf_posenc.unpatch(again)  # built from the original config: unpatching gives the base model back
    assert (lm_logits(again, 150) - before).abs().max().item() <= 1e-5  # (sdpa here, eager before)

    hf_posenc.unpatch(model)
    assert torch.equal(lm_logits(model, 150), before)
    assert model.config.text_config.max_position_embeddings == ORIGINAL


def test_composite_card_and_errors(tmp_path):
    model = build(LlavaForConditionalGeneration, llava_config())
    with pytest.raises(ValueError, match="family swap\\) on a composite model \\('llava' with its language model in "
                                         "text_config\\)"):
        hf_posenc.patch(model, "alibi")
    assert not hf_posenc.is_patched(model)
    hf_posenc.patch(model, "pi", factor=4.0)
    hf_posenc.save_pretrained(model, tmp_path, base_model="llava-hf/llava-1.5-7b-hf")
    card = (tmp_path / "README.md").read_text()
    assert f"| original context (tokens) | {ORIGINAL} |" in card
    assert f"| new `max_position_embeddings` | {4 * ORIGINAL} |" in card and "'rope_type': 'linear'" in card
    saved = copy.deepcopy(model.config.to_dict())
    assert saved["hf_posenc"]["original"] == {
        "text_config.max_position_embeddings": ORIGINAL,
        "text_config.rope_parameters": {"rope_type": "default", "rope_theta": THETA},
    }
