"""RoPE scalings on transformers' proportional RoPE: Gemma 4's full-attention layers (head width 32 there, 16 in its
sliding layers: a heterogeneous config) and LFM3's. Its frequencies are base^(-2i / head_dim) for the first
head_dim x partial_rotary_factor / 2 pairs and 0 for the rest. A scaling is the scaling of the whole head's RoPE with
those pairs kept still: PI is transformers' own ``factor`` of that type (saved natively, reloaded by plain
transformers); the others are written out here from transformers' own computation of the same type on a RoPE over the
whole head, and come back through hf_posenc.from_pretrained."""

from types import SimpleNamespace

import pytest
import torch
from helpers import ids
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posenc
from hf_posenc.adapters.narrow_twin import narrow_twin

GEMMA4 = dict(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, global_head_dim=32, sliding_window=8, vocab_size_per_layer_input=96,
              hidden_size_per_layer_input=16, max_position_embeddings=64,
              layer_types=["sliding_attention", "full_attention"] * 2)
KNOBS = {"yarn": {}, "ntk": {}, "llama3": {}, "longrope": {}, "dynamic_ntk": {"cache": "stale"}}
LONG = 100  # past the tiny models' 64 positions


def gemma4(seed=0, **overrides):
    cfg = AutoConfig.for_model("gemma4_text", **{**GEMMA4, **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def lfm3():
    torch.manual_seed(0)
    model = narrow_twin(AutoConfig.for_model("lfm3")).eval()
    model.config._attn_implementation = "eager"
    return model


BUILD = {"gemma4_text": gemma4, "lfm3": lfm3}


@torch.no_grad()
def out(model, x):
    return model(x).logits


def full_rope(model) -> tuple[dict, int, int]:
    """The full-attention layers' rope_parameters, head width and number of turning pairs."""
    cfg = model.config
    rp = cfg.rope_parameters["full_attention"]
    width = (cfg.per_layer_config["full_attention"].head_dim if getattr(cfg, "is_heterogeneous", False)
             else cfg.head_dim)
    return rp, width, int(rp["partial_rotary_factor"] * width // 2)


def written_out(method: str, rp: dict, width: int, turning: int, original: int, factor: float = 2.0):
    """transformers' own ``method`` on a plain RoPE over the whole head of ``width`` (a llama config), the pairs past
    ``turning`` set to 0, as the whole head's RoPE scaled with those pairs kept still."""
    native = {"yarn": {"rope_type": "yarn"}, "ntk": None,
              "llama3": {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0},
              "longrope": {"rope_type": "longrope", "short_factor": [1.0] * (width // 2),
                           "long_factor": [factor] * (width // 2)}}[method]
    base = rp["rope_theta"]
    if native is None:  # NTK-aware: the base raised by factor^(d / (d - 2)), no other change
        parameters, seq = {"rope_type": "default", "rope_theta": base * factor ** (width / (width - 2))}, {}
    else:
        parameters, seq = {**native, "rope_theta": base, "factor": factor,
                           "original_max_position_embeddings": original}, {}
    plain = LlamaConfig(hidden_size=width * 2, num_attention_heads=2, head_dim=width, rope_parameters=parameters,
                        max_position_embeddings=int(original * factor))
    if parameters["rope_type"] == "default":
        inv = 1.0 / (parameters["rope_theta"] ** (torch.arange(0, width, 2, dtype=torch.int64).float() / width))
        attention = 1.0
    else:
        inv, attention = ROPE_INIT_FUNCTIONS[parameters["rope_type"]](plain, "cpu", **seq)
    inv = inv.clone()
    inv[turning:] = 0.0
    return inv, attention


@pytest.mark.parametrize("family", ["gemma4_text", "lfm3"])
def test_ntk_is_saved_as_the_proportional_type_with_its_new_base(family, tmp_path):
    """NTK-aware scaling only raises the base: transformers' proportional RoPE with that rope_theta computes it."""
    model = BUILD[family]()
    rp, width, turning = full_rope(model)
    x = ids(LONG) % 90 + 3
    hf_posenc.patch(model, "ntk", factor=2.0)
    saved = model.config.rope_parameters["full_attention"]
    assert saved["rope_type"] == "proportional" and "factor" not in saved
    assert saved["rope_theta"] == pytest.approx(rp["rope_theta"] * 2.0 ** (width / (width - 2)), rel=1e-12)
    got = out(model, x)
    model.save_pretrained(tmp_path)
    assert model.config.hf_posenc["native"] is True
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    assert (out(plain, x) - got).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", ["gemma4_text", "lfm3"])
def test_pi_is_saved_as_the_proportional_factor_and_reloads_in_plain_transformers(family, tmp_path):
    model = BUILD[family]()
    rope = model.model.rotary_emb
    sliding = {k: v.clone() for k, v in rope._buffers.items() if not k.startswith("full_attention")}
    x = ids(LONG) % 90 + 3
    before, context = out(model, x), model.config.max_position_embeddings
    _, width, turning = full_rope(model)
    own = rope.full_attention_inv_freq.clone()
    hf_posenc.patch(model, "pi", factor=2.0)
    assert torch.equal(rope.full_attention_inv_freq, own / 2)
    assert bool((rope.full_attention_inv_freq[turning:] == 0).all()) and turning < width // 2
    assert all(torch.equal(v, rope._buffers[k]) for k, v in sliding.items())  # the sliding layers' RoPE unchanged
    assert model.config.rope_parameters["full_attention"]["rope_type"] == "proportional"
    assert model.config.rope_parameters["full_attention"]["factor"] == 2.0
    assert model.config.max_position_embeddings == 2 * context
    got = out(model, x)
    assert not torch.allclose(got, before)
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    assert (out(plain, x) - got).abs().max().item() <= 1e-5
    hf_posenc.unpatch(model)
    assert torch.equal(rope.full_attention_inv_freq, own) and torch.equal(out(model, x), before)


@pytest.mark.parametrize("method", list(KNOBS))
@pytest.mark.parametrize("family", ["gemma4_text", "lfm3"])
def test_each_scaling_is_the_whole_heads_with_the_still_pairs_kept_still(family, method, tmp_path):
    model = BUILD[family]()
    rope = model.model.rotary_emb
    rp, width, turning = full_rope(model)
    original = model.config.max_position_embeddings
    sliding = rope.sliding_attention_inv_freq.clone() if hasattr(rope, "sliding_attention_inv_freq") else None
    x = ids(LONG) % 90 + 3
    hf_posenc.patch(model, method, factor=2.0, **KNOBS[method])
    if method != "dynamic_ntk":  # (its frequencies within the original context are the checkpoint's)
        want, attention = written_out(method, rp, width, turning, original)
        assert torch.allclose(rope.full_attention_inv_freq, want, rtol=1e-6, atol=0)
        assert rope.full_attention_attention_scaling == pytest.approx(attention, rel=1e-6)
    assert bool((rope.full_attention_inv_freq[turning:] == 0).all())
    if sliding is not None:
        assert torch.equal(rope.sliding_attention_inv_freq, sliding)
    got = out(model, x)
    model.save_pretrained(tmp_path)
    back = hf_posenc.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    assert (out(back, x) - got).abs().max().item() <= 1e-5


def decoded(model, x, prompt: int = 70):
    """The logits of ``x`` decoded one token at a time after a prompt, with a DynamicCache."""
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        steps = [model(x[:, :prompt], past_key_values=cache, use_cache=True).logits]
        steps += [model(x[:, i:i + 1], past_key_values=cache, use_cache=True).logits for i in range(prompt, x.shape[1])]
    return torch.cat(steps, 1)


def shared(layers: int):
    """Gemma 4 whose last ``layers`` layers read the keys and values of earlier ones (Gemma 4 E2B/E4B's KV sharing)."""
    return gemma4(num_hidden_layers=6, layer_types=["sliding_attention", "full_attention"] * 3,
                  num_kv_shared_layers=layers)


@pytest.mark.parametrize("layers", [0, 2])
def test_cached_decoding_of_a_scaled_proportional_rope_equals_recomputation(layers):
    model = shared(layers)
    hf_posenc.patch(model, "yarn", factor=2.0)
    x = ids(LONG) % 90 + 3
    assert (decoded(model, x) - out(model, x)).abs().max().item() <= 1e-5


def test_kv_shared_layers_hold_no_keys_to_re_rotate():
    """transformers gives Gemma 4's KV-shared layers a DummyLayer in the cache; re-rotating the cached keys of a
    length-dependent scaling raised AttributeError on it. They are skipped (their keys are another layer's, which is
    re-rotated), and the re-rotated cache is closer to recomputation than stale keys."""
    x = ids(LONG) % 90 + 3
    gaps = {}
    for cache in ("consistent", "stale"):
        model = shared(2)
        hf_posenc.patch(model, "dynamic_ntk", factor=2.0, cache=cache)
        gaps[cache] = (decoded(model, x) - out(model, x))[:, 70:].abs().max().item()  # the decoded tokens
    assert gaps["consistent"] < gaps["stale"]


def test_a_composition_over_a_scaled_proportional_rope_is_refused_by_name():
    model = gemma4()
    full = dict(model.config.rope_parameters["full_attention"], factor=2.0)
    model.config.rope_parameters = {**model.config.rope_parameters, "full_attention": full}
    model.config.max_position_embeddings = 128
    with pytest.raises(ValueError, match="a proportional RoPE with factor=2.0, whose pairs past partial_rotary_factor "
                                         "never turn; a longrope cannot hold them"):
        hf_posenc.patch(model, "yarn", factor=2.0)
    assert not hf_posenc.is_patched(model)


def test_explain_refuses_a_composition_over_a_scaled_proportional_rope_by_name(tmp_path):
    from hf_posenc.explaining import explain

    cfg = gemma4().config
    cfg.rope_parameters = {**cfg.rope_parameters, "full_attention": dict(cfg.rope_parameters["full_attention"],
                                                                         factor=4.0)}
    cfg.save_pretrained(tmp_path / "pi4")
    with pytest.raises(ValueError, match="a proportional RoPE with factor=4.0, whose pairs past partial_rotary_factor"):
        explain("yarn:factor=2", str(tmp_path / "e"), model=str(tmp_path / "pi4"))
    assert not (tmp_path / "e").exists()


def test_every_engine_refuses_a_scaled_proportional_rope_by_name(tmp_path):
    """vLLM 0.32 builds a proportional RoPE without its factor: serving the PI checkpoint there would compute the
    unscaled model. serve-config says so for every engine; eval --engine vllm refuses the variant."""
    from hf_posenc.engines.registry import support_names
    from hf_posenc.eval.engine_choice import EngineChoice
    from hf_posenc.serving.launch_settings import serve_config
    from hf_posenc.serving.support import known_status

    model = gemma4()
    hf_posenc.patch(model, "pi", factor=2.0)
    model.save_pretrained(tmp_path / "pi")
    launches = serve_config(str(tmp_path / "pi"))
    assert {launch.computes for launch in launches} == {"cannot"} and len(launches) == 5
    assert all("Gemma4RotaryEmbedding) from rope_theta and partial_rotary_factor alone, without a factor"
               in launch.reason and not launch.command for launch in launches)
    rows = known_status(model.config.hf_posenc, rope=model.config.rope_parameters)  # the card's serving table
    assert {row["status"] for row in rows} == {"cannot"} and len(rows) == len(support_names())
    variant = SimpleNamespace(label="pi", method="pi", config=SimpleNamespace(params={}))
    why, shorter = EngineChoice._unserved(variant, gemma4(), 128)
    assert why.startswith("transformers' proportional RoPE") and not shorter
    sliding = SimpleNamespace(label="pi", method="pi", config=SimpleNamespace(params={
        "layer_types": ["sliding_attention"]}))  # the full layers' proportional RoPE left as it is
    assert EngineChoice._unserved(sliding, gemma4(), 128) == (None, False)
    plain = gemma4()
    plain.save_pretrained(tmp_path / "plain")
    assert "cannot" not in {launch.computes for launch in serve_config(str(tmp_path / "plain"), ["vllm"])}


def test_per_pair_factors_over_two_head_widths_are_refused_by_name():
    model = gemma4()
    with pytest.raises(ValueError, match="longrope gives one factor per rotary pair, and the layer types it would "
                                         "change have different numbers of pairs \\(full_attention: 16, "
                                         "sliding_attention: 8\\)"):
        hf_posenc.patch(model, "longrope", factor=2.0, layer_types=["sliding_attention", "full_attention"])
    assert not hf_posenc.is_patched(model)
    hf_posenc.patch(model, "yarn", factor=2.0, layer_types=["sliding_attention", "full_attention"])
    rope = model.model.rotary_emb  # each layer type scaled with its own head width
    assert rope.sliding_attention_inv_freq.shape[-1] == 8 and rope.full_attention_inv_freq.shape[-1] == 16


def test_explain_draws_the_turning_pairs_of_gemma4s_full_layers(tmp_path):
    from hf_posenc.explaining import explain

    gemma4().config.save_pretrained(tmp_path / "gemma4")
    report = explain("yarn:factor=2", str(tmp_path / "e"), model=str(tmp_path / "gemma4"))
    text = (tmp_path / "e" / "explain.md").read_text()
    assert "A proportional RoPE: 4 of the head's 16 pairs turn" in text and "head_dim 32, rope_theta 1e+06" in text
    assert "Of the 4 rotary dimension pairs" in text and report
