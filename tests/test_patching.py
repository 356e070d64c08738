"""Isolation, exact unpatch, no compounding, generation with the KV cache, and bad input."""

import pytest
import torch
from helpers import ORIGINAL, THETA, clone_with_config, greedy, ids, logits, tiny_config, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

import hf_posenc

METHODS = {
    "none": {},
    "pi": dict(factor=2.0),
    "ntk": dict(factor=2.0),
    "dynamic_ntk": dict(factor=2.0),
    "yarn": dict(factor=2.0),
    "dynamic_yarn": dict(factor=2.0),
    "llama3": dict(factor=4.0),
    "longrope": dict(factor=2.0),
}


def test_patch_returns_same_model_and_records_config():
    model = tiny_model("llama")
    assert hf_posenc.patch(model, "yarn", factor=4.0) is model
    cfg = hf_posenc.get_config(model)
    assert cfg.method == "yarn" and cfg.factor == 4.0 and cfg.original_max_position_embeddings == ORIGINAL
    assert model.config.max_position_embeddings == 4 * ORIGINAL
    assert model.config.hf_posenc["method"] == "yarn"
    assert hf_posenc.get_config(tiny_model("llama")) is None


def test_other_instance_sharing_the_config_is_untouched():
    cfg = tiny_config("llama")
    torch.manual_seed(0)
    a = AutoModelForCausalLM.from_config(cfg).eval()
    torch.manual_seed(0)
    b = AutoModelForCausalLM.from_config(cfg).eval()
    assert a.config is b.config
    x = ids(150)
    before = logits(b, x)
    hf_posenc.patch(a, "yarn", factor=4.0)
    assert not torch.allclose(logits(a, x), before)
    assert torch.equal(logits(b, x), before)
    assert b.config.rope_parameters == {"rope_type": "default", "rope_theta": THETA}
    assert b.config.max_position_embeddings == ORIGINAL and not hasattr(b.config, "hf_posenc")
    assert type(a.model.rotary_emb).forward is type(b.model.rotary_emb).forward  # no class was touched


@pytest.mark.parametrize("method", sorted(METHODS))
def test_unpatch_is_bit_identical(family, method):
    model = tiny_model(family)
    x_long, x_short = ids(150), ids(30)
    before_long, before_short = logits(model, x_long), logits(model, x_short)
    config_before = model.config.to_dict()
    hf_posenc.patch(model, method, **METHODS[method])
    logits(model, x_long)  # let dynamic methods update their state
    hf_posenc.unpatch(model)
    assert torch.equal(logits(model, x_long), before_long)
    assert torch.equal(logits(model, x_short), before_short)
    assert model.config.to_dict() == config_before
    assert not model.model.rotary_emb._forward_pre_hooks
    assert hf_posenc.get_config(model) is None


def test_patching_twice_starts_from_the_original():
    x = ids(150)
    once = logits(hf_posenc.patch(tiny_model("qwen2"), "pi", factor=4.0), x)
    model = tiny_model("qwen2")
    hf_posenc.patch(model, "pi", factor=2.0)
    hf_posenc.patch(model, "pi", factor=4.0)
    assert torch.equal(logits(model, x), once)
    hf_posenc.patch(model, "pi", factor=4.0)
    assert torch.equal(logits(model, x), once)
    assert model.config.max_position_embeddings == 4 * ORIGINAL
    assert model.config.hf_posenc["original"]["max_position_embeddings"] == ORIGINAL
    hf_posenc.unpatch(model)
    assert torch.equal(logits(model, x), logits(tiny_model("qwen2"), x))


def test_refused_repatch_keeps_the_previous_patch():
    model = tiny_model("llama")
    hf_posenc.patch(model, "yarn", factor=2.0)
    x = ids(150)
    before = logits(model, x)
    with pytest.raises(ValueError):
        hf_posenc.patch(model, "pi", factor=2.0, original_max_position_embeddings=10_000)
    assert hf_posenc.get_config(model).method == "yarn"
    assert torch.equal(logits(model, x), before)


# -- generation --------------------------------------------------------------------------------

NATIVE_FOR_GENERATE = {
    "pi": ({"rope_type": "linear", "factor": 2.0}, 2 * ORIGINAL),
    "dynamic_ntk": ({"rope_type": "dynamic", "factor": 2.0}, ORIGINAL),
    "yarn": ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": ORIGINAL}, 2 * ORIGINAL),
    "longrope": (
        {"rope_type": "longrope", "factor": 2.0, "original_max_position_embeddings": ORIGINAL,
         "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
        2 * ORIGINAL,
    ),
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_generate_with_cache_crossing_the_original_context(method):
    """cache="stale" is transformers' own behaviour for its dynamic types (the default, "consistent", is
    tested against recomputation in test_consistent_cache.py)."""
    stale = {"cache": "stale"} if "cache" in hf_posenc.list_methods()[method]["params"] else {}
    model = hf_posenc.patch(tiny_model("llama"), method, **METHODS[method], **stale)
    prompt = ids(58)  # 58 + 12 new tokens cross the original 64
    seq, scores = greedy(model, prompt)
    assert seq.shape == (1, 70) and torch.isfinite(scores).all()
    if method in NATIVE_FOR_GENERATE:
        rp, max_pos = NATIVE_FOR_GENERATE[method]
        ref = clone_with_config(tiny_model("llama"), {"rope_theta": THETA, **rp}, max_pos)
        ref_seq, ref_scores = greedy(ref, prompt)
        assert torch.equal(seq, ref_seq)
        assert (scores - ref_scores).abs().max().item() <= 1e-5


def test_dynamic_methods_recompute_as_the_cache_grows():
    """Documented behaviour: the prompt is encoded with the frequencies for its own length; each decoded
    token past the original context is rotated with the frequencies of the grown length (the cached keys are
    re-rotated to them); the module keeps its patch-time frequencies between calls."""
    from hf_posenc.encodings.rope import RopeGeometry, rope_dynamic_ntk

    model = hf_posenc.patch(tiny_model("llama"), "dynamic_ntk", factor=2.0)
    rotary = model.model.rotary_emb
    original = rotary.inv_freq.clone()
    seen = []

    def record(module, args, kwargs, out):
        positions = args[1] if len(args) > 1 else kwargs["position_ids"]
        seen.append((positions.clone(), out[0].clone()))

    rotary.register_forward_hook(record, with_kwargs=True)
    greedy(model, ids(60), n=20)  # the last forward feeds position 78 (the 20th new token is only sampled)
    assert torch.equal(rotary.inv_freq, original)  # nothing kept from the call
    positions, cos = seen[-1]
    assert positions.flatten().tolist() == [78]
    expected, _ = rope_dynamic_ntk(RopeGeometry(THETA, 16, ORIGINAL), 2.0, {}, seq_len=79)
    angles = 78 * expected.double()
    assert torch.allclose(cos[0, 0].double(), torch.cat([angles, angles]).cos(), atol=1e-6)
    assert not torch.allclose(expected, original)
    short = ids(30)
    seen.clear()
    logits(model, short)  # a short call afterwards: the original frequencies
    angles = torch.arange(30).double()[:, None] * original.double()[None]
    assert torch.allclose(seen[-1][1][0].double(), torch.cat([angles, angles], -1).cos(), atol=1e-6)


# -- bad input ---------------------------------------------------------------------------------


def test_unsupported_family_lists_supported():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=64))
    with pytest.raises(ValueError) as err:
        hf_posenc.patch(gpt2, "yarn", factor=2.0)
    msg = str(err.value)
    assert "model_type='gpt2'" in msg and "llama" in msg and "qwen2" in msg and "mistral" in msg


def test_not_a_model():
    with pytest.raises(ValueError, match="needs a transformers model"):
        hf_posenc.patch("llama", "yarn", factor=2.0)


def test_unknown_method_suggests():
    with pytest.raises(ValueError, match="Did you mean 'dynamic_ntk'"):
        hf_posenc.patch(tiny_model("llama"), "dynamic_nkt", factor=2.0)


def test_factor_below_one_names_the_value():
    with pytest.raises(ValueError, match="got 0.9"):
        hf_posenc.patch(tiny_model("llama"), "pi", factor=0.9)


def test_unknown_parameter_lists_allowed():
    with pytest.raises(ValueError, match=r"does not take parameter\(s\) \['beta_fast'\]; it takes: high_freq_factor, "
                                         r"layer_types, low_freq_factor"):
        hf_posenc.patch(tiny_model("llama"), "llama3", factor=2.0, beta_fast=3)


def test_original_larger_than_model_context():
    with pytest.raises(ValueError, match="original_max_position_embeddings=128 is larger than the model's "
                                         "max_position_embeddings=64"):
        hf_posenc.patch(tiny_model("llama"), "yarn", factor=2.0, original_max_position_embeddings=128)


def test_original_conflicting_with_recorded_scaling():
    model = tiny_model("llama", rope_parameters={"rope_type": "yarn", "rope_theta": THETA, "factor": 2.0,
                                                 "original_max_position_embeddings": 32})
    with pytest.raises(ValueError, match="conflicts with the checkpoint, which records 32"):
        hf_posenc.patch(model, "pi", factor=2.0, original_max_position_embeddings=48)
    hf_posenc.patch(model, "pi", factor=4.0, original_max_position_embeddings=32)  # the recorded 32: replaced
    assert hf_posenc.get_config(model).method == "pi"
    assert hf_posenc.get_config(model).original_max_position_embeddings == 32
    assert model.config.max_position_embeddings == 128
    hf_posenc.unpatch(model)
    hf_posenc.patch(model, "pi", factor=4.0)  # without it: on top of the checkpoint's YaRN, from its context 64
    assert hf_posenc.get_config(model).original_max_position_embeddings == 64
    assert model.config.max_position_embeddings == 256


def test_missing_original_length():
    model = tiny_model("llama")
    model.config.__dict__["max_position_embeddings"] = None  # (the strict config refuses a plain assignment)
    with pytest.raises(ValueError, match="original_max_position_embeddings is missing"):
        hf_posenc.patch(model, "yarn", factor=2.0)
    hf_posenc.patch(model, "yarn", factor=2.0, original_max_position_embeddings=64)
    assert model.config.max_position_embeddings == 128


def test_longrope_list_length_checked():
    with pytest.raises(ValueError, match="long_factor must have 8 entries"):
        hf_posenc.patch(tiny_model("llama"), "longrope", factor=2.0, long_factor=[1.0, 2.0])


def test_generic_family_found_without_being_listed():
    """A decoder not in the tested list but with the standard rotary module is patched generically."""
    cfg = AutoConfig.for_model(
        "olmo2", vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=ORIGINAL,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    torch.manual_seed(0)
    cfg_ref = AutoConfig.for_model(**{**cfg.to_dict(),
                                      "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": THETA}})
    ref = AutoModelForCausalLM.from_config(cfg_ref).eval()
    ref.load_state_dict(model.state_dict())
    hf_posenc.patch(model, "pi", factor=2.0)
    x = ids(100)
    assert (logits(model, x) - logits(ref, x)).abs().max().item() <= 1e-5
