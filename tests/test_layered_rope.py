"""Per-layer-type RoPE (Gemma 3: sliding-window layers with one rope_theta, global layers with another,
``rope_parameters`` keyed by layer type): scalings change the chosen types only and equal transformers'
native per-type rope_parameters; saved checkpoints reload in plain transformers."""

import copy

import pytest
import torch
from helpers import ORIGINAL, ids, logits, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM

import hf_posenc

FULL, SLIDING = 50_000.0, 7_000.0  # rope_theta of each type (not Gemma's defaults: read from the config)
HEAD_DIM = 16


def gemma_config(rope_parameters=None, max_position_embeddings=ORIGINAL):
    cfg = AutoConfig.for_model(
        "gemma3_text", vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM, sliding_window=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope_parameters or {"full_attention": {"rope_type": "default", "rope_theta": FULL},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": SLIDING}},
    )
    cfg._attn_implementation = "eager"
    return cfg


def gemma(seed=0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(gemma_config(), dtype=torch.float32).eval()


def native_clone(model, full=None, sliding=None, max_position_embeddings=ORIGINAL):
    """The same weights, built by transformers from native per-type rope_parameters."""
    rp = {"full_attention": {"rope_theta": FULL, "rope_type": "default", **(full or {})},
          "sliding_attention": {"rope_theta": SLIDING, "rope_type": "default", **(sliding or {})}}
    ref = AutoModelForCausalLM.from_config(gemma_config(rp, max_position_embeddings), dtype=torch.float32).eval()
    ref.load_state_dict(model.state_dict())
    return ref


NATIVE = {  # method -> the native rope_parameters of one type, written out here (factor 2, original 64)
    "pi": {"rope_type": "linear", "factor": 2.0},
    "ntk": {"rope_theta": FULL * 2.0 ** (HEAD_DIM / (HEAD_DIM - 2))},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": ORIGINAL},
    "llama3": {"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": ORIGINAL,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "dynamic_ntk": {"rope_type": "dynamic", "factor": 2.0},
}


@pytest.mark.parametrize("method", list(NATIVE))
def test_scaling_the_global_layers_equals_native_gemma3(method):
    model = gemma()
    rotary = model.model.rotary_emb
    sliding_before = rotary.sliding_attention_inv_freq.clone()
    before = logits(model, ids(150))
    hf_posenc.patch(model, method, factor=2.0)
    cfg = hf_posenc.get_config(model)
    assert cfg.params["layer_types"] == ["full_attention"]  # the default on a model with sliding layers
    assert torch.equal(rotary.sliding_attention_inv_freq, sliding_before)
    new_max = ORIGINAL if method == "dynamic_ntk" else 2 * ORIGINAL
    ref = native_clone(model, full=NATIVE[method], max_position_embeddings=new_max)
    for n in (40, 150, 40):  # dynamic methods: grow past the original context, then come back
        assert (logits(model, ids(n)) - logits(ref, ids(n))).abs().max().item() <= 1e-5, (method, n)
    hf_posenc.unpatch(model)
    assert torch.equal(logits(model, ids(150)), before)
    assert model.model.rotary_emb.rope_type == {"full_attention": "default", "sliding_attention": "default"}


def test_every_layer_type_when_asked():
    model = gemma()
    hf_posenc.patch(model, "yarn", factor=2.0, layer_types=["sliding_attention", "full_attention"])
    yarn = NATIVE["yarn"]
    ref = native_clone(model, full=yarn, sliding=yarn, max_position_embeddings=2 * ORIGINAL)
    assert (logits(model, ids(150)) - logits(ref, ids(150))).abs().max().item() <= 1e-5
    assert hf_posenc.get_config(model).params["layer_types"] == ["full_attention", "sliding_attention"]


def test_longrope_on_one_layer_type():
    model = gemma()
    short, long = [1.0 + 0.05 * i for i in range(HEAD_DIM // 2)], [2.0 + 0.1 * i for i in range(HEAD_DIM // 2)]
    hf_posenc.patch(model, "longrope", factor=2.0, short_factor=short, long_factor=long)
    ref = native_clone(model, full={"rope_type": "longrope", "factor": 2.0,
                                    "original_max_position_embeddings": ORIGINAL,
                                    "short_factor": short, "long_factor": long}, max_position_embeddings=2 * ORIGINAL)
    for n in (40, 150):
        assert (logits(model, ids(n)) - logits(ref, ids(n))).abs().max().item() <= 1e-5, n


def test_saved_gemma3_reloads_in_plain_transformers_and_hf_posenc(tmp_path):
    model = gemma()
    hf_posenc.patch(model, "yarn", factor=2.0)
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    rp = plain.config.rope_parameters
    assert rp["full_attention"]["rope_type"] == "yarn" and rp["sliding_attention"]["rope_type"] == "default"
    x = ids(150)
    assert (logits(plain, x) - logits(model, x)).abs().max().item() <= 1e-5
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert hf_posenc.get_config(again) == hf_posenc.get_config(model)
    assert (logits(again, x) - logits(model, x)).abs().max().item() <= 1e-6


def test_patching_one_gemma_leaves_another_alone():
    model, other = gemma(), gemma()
    x = ids(150)
    before = logits(other, x)
    other_types = copy.deepcopy(other.model.rotary_emb.rope_type)
    hf_posenc.patch(model, "pi", factor=2.0)
    assert torch.equal(logits(other, x), before) and other.model.rotary_emb.rope_type == other_types
    assert other.config.rope_parameters["full_attention"]["rope_type"] == "default"


def test_layer_type_errors_are_clear():
    with pytest.raises(ValueError, match="layer_types has \\['global'\\], which this model does not have; its RoPE "
                                         "layer types: \\['full_attention', 'sliding_attention'\\]"):
        hf_posenc.patch(gemma(), "yarn", factor=2.0, layer_types=["global"])
    with pytest.raises(ValueError, match="layer_types must be a non-empty list"):
        hf_posenc.PosEncConfig("pi", 2.0, params={"layer_types": "full_attention"})
    with pytest.raises(ValueError, match="has one RoPE for all layers"):
        hf_posenc.patch(tiny_model("llama"), "pi", factor=2.0, layer_types=["full_attention"])
    with pytest.raises(ValueError, match="family swap\\) on per-layer-type RoPE"):
        hf_posenc.patch(gemma(), "alibi")
    listed = hf_posenc.list_methods()
    assert "gemma3_text" in listed["yarn"]["families"] and "gemma3_text" not in listed["alibi"]["families"]
    model = gemma()
    with pytest.raises(ValueError):
        hf_posenc.patch(model, "yarn", factor=2.0, layer_types=["global"])
    assert not hf_posenc.is_patched(model)


def test_other_per_layer_type_decoders_are_found_generically():
    """OLMo 3 (not in the tested list): found by its rotary layout, scaled like Gemma 3, equal to native; listed by
    hf-posenc methods from the family census (adapters/family_census.py)."""
    def olmo3(rp, max_position_embeddings=ORIGINAL):
        cfg = AutoConfig.for_model(
            "olmo3", vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=max_position_embeddings, sliding_window=24,
            layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters=rp, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        cfg._attn_implementation = "eager"
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()

    base = {"full_attention": {"rope_type": "default", "rope_theta": FULL},
            "sliding_attention": {"rope_type": "default", "rope_theta": SLIDING}}
    torch.manual_seed(0)
    model = olmo3(copy.deepcopy(base))
    assert "olmo3" in hf_posenc.list_methods()["yarn"]["families"]
    hf_posenc.patch(model, "yarn", factor=2.0)
    scaled = {**base, "full_attention": {**base["full_attention"], **NATIVE["yarn"]}}
    ref = olmo3(scaled, 2 * ORIGINAL)
    ref.load_state_dict(model.state_dict())
    assert (logits(model, ids(150)) - logits(ref, ids(150))).abs().max().item() <= 1e-5
    assert model.config.rope_parameters["sliding_attention"] == base["sliding_attention"]


def test_nope_on_the_global_layers_only(tmp_path):
    """Interleaved RoPE/NoPE (as Llama 4 and Command A do): nope on a per-layer-type model removes RoPE from
    layer_types (default: the global layers). Reference: transformers' own model with the rotary output of
    the global type replaced by cos = 1, sin = 0 (no rotation), the sliding layers untouched."""
    model = gemma()
    x = ids(150)
    before = logits(model, x)
    hf_posenc.patch(model, "nope")
    assert hf_posenc.get_config(model).params["layer_types"] == ["full_attention"]
    ref = native_clone(model)

    def no_rotation(module, args, kwargs, output):
        if kwargs.get("layer_type", args[2] if len(args) > 2 else None) == "full_attention":
            cos, sin = output
            return torch.ones_like(cos), torch.zeros_like(sin)
        return output

    ref.model.rotary_emb.register_forward_hook(no_rotation, with_kwargs=True)
    assert (logits(model, x) - logits(ref, x)).abs().max().item() <= 1e-5
    assert (logits(model, x) - before).abs().max().item() > 1e-4
    model.save_pretrained(tmp_path)
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32, attn_implementation="eager").eval()
    assert (logits(again, x) - logits(model, x)).abs().max().item() <= 1e-6
    hf_posenc.unpatch(model)
    assert torch.equal(logits(model, x), before)
    hf_posenc.patch(model, "nope", layer_types=["full_attention", "sliding_attention"])  # every layer
    everywhere = native_clone(model)
    everywhere.model.rotary_emb.register_forward_hook(
        lambda m, a, k, out: (torch.ones_like(out[0]), torch.zeros_like(out[1])), with_kwargs=True)
    assert (logits(model, x) - logits(everywhere, x)).abs().max().item() <= 1e-5
    assert "gemma3_text" in hf_posenc.list_methods()["nope"]["families"]
    with pytest.raises(ValueError, match="applies to decoders with per-layer-type RoPE .*model_type='bert' has none"):
        hf_posenc.patch(AutoModelForCausalLM.from_config(AutoConfig.for_model(
            "bert", vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
            is_decoder=True)), "nope", layer_types=["full_attention"])
