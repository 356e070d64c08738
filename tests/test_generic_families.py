"""Decoders outside the tested list, found by their rotary layout: each RoPE scaling x2 saved and loaded back. Where the
block says native, plain transformers must rebuild the same logits from config.json; where it does not
(transformers would read the parameters otherwise), hf_posenc.from_pretrained must. Plus the families
whose config needs care: Phi-3 (turns "yarn" into "longrope", keeps its own original length), Mixtral
(head_dim None), DeepSeek-V3 (attention scale derived from YaRN's mscale_all_dim)."""

import logging

import pytest
import torch
from helpers import ORIGINAL, ids
from transformers import AutoConfig, AutoModelForCausalLM

import hf_posenc
from hf_posenc.adapters.rope_decoder import ALREADY_SCALED_FAMILIES, GENERIC_FAMILIES, PROVEN_SCALINGS

SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=ORIGINAL, pad_token_id=0, bos_token_id=1, eos_token_id=2)
EXTRA = {
    "deepseek_v3": dict(num_key_value_heads=4, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, kv_lora_rank=16,
                        q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        first_k_dense_replace=1, n_group=1, topk_group=1),
}
# gpt-oss's YaRN x32 over 4,096 serves the 131,072 tokens it advertises; narrowed to 64 tokens, its YaRN is made to
# serve those 64 (x2 over 32), so that 150 tokens are past the context a scaling on top extends
EXTRA["gpt_oss"] = dict(rope_parameters={**AutoConfig.for_model("gpt_oss").rope_parameters, "factor": 2.0,
                                         "original_max_position_embeddings": ORIGINAL // 2})
GENERIC = list(GENERIC_FAMILIES)  # the families hf-posenc methods lists for the scalings these tests prove


def build(model_type, seed=0, **overrides):
    cfg = AutoConfig.for_model(model_type, **{**SMALL, **EXTRA.get(model_type, {}), **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


@torch.no_grad()
def out(model, x):
    return model(x).logits


@pytest.mark.parametrize("method", PROVEN_SCALINGS)
@pytest.mark.parametrize("model_type", GENERIC)
def test_generic_family_saves_and_loads_back(model_type, method, tmp_path):
    model = build(model_type)
    x = ids(150) % 90 + 3
    before = out(model, x)
    own = model.config.rope_parameters.get("rope_type", "default")
    assert (own != "default") == (model_type in ALREADY_SCALED_FAMILIES)  # what hf-posenc methods says of them
    if own != "default" and method == "dynamic_ntk":  # already scaled (gpt_oss: yarn x32, apertus: llama3)
        with pytest.raises(ValueError, match=f"already scaled \\(rope_type='{own}'\\), and 'dynamic_ntk' follows"):
            hf_posenc.patch(model, method, factor=2.0)
        return
    hf_posenc.patch(model, method, factor=2.0)
    if own != "default":  # on top of the checkpoint's own scaling, from its current context
        assert hf_posenc.get_config(model).method == "longrope"
    got = out(model, x)
    assert (got - before).abs().max().item() > 1e-6  # it changed the model
    model.save_pretrained(tmp_path)
    if model.config.hf_posenc["native"]:
        again = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
        assert again.config.rope_parameters == model.config.rope_parameters
    else:
        again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32, attn_implementation="eager").eval()
    assert (out(again, x) - got).abs().max().item() <= 1e-5
    hf_posenc.unpatch(model)
    assert torch.equal(out(model, x), before)


def test_phi3_yarn_is_not_written_natively_and_longrope_is(tmp_path, caplog):
    model = build("phi3")  # Phi3Config keeps original_max_position_embeddings (4096) outside rope_parameters
    with caplog.at_level(logging.WARNING):
        hf_posenc.patch(model, "yarn", factor=2.0)
    assert not model.config.hf_posenc["native"] and "Phi3Config does not accept them" in caplog.text
    assert model.config.rope_parameters["rope_type"] == "default"  # plain transformers would run longrope
    hf_posenc.patch(model, "longrope", factor=2.0)
    assert model.config.hf_posenc["native"]
    assert model.config.original_max_position_embeddings == ORIGINAL  # the value transformers reads
    x = ids(150) % 90 + 3
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    assert (out(plain, x) - out(model, x)).abs().max().item() <= 1e-5


def test_mixtral_gets_an_explicit_head_dim_so_that_transformers_can_load_yarn():
    model = build("mixtral")
    assert model.config.head_dim is None
    hf_posenc.patch(model, "yarn", factor=2.0)
    assert model.config.hf_posenc["native"] and model.config.head_dim == 16


@pytest.mark.parametrize("knobs", [{}, {"mscale": 1.0, "mscale_all_dim": 1.0}])
def test_deepseek_attention_scale_follows_mscale_all_dim(knobs):
    model = build("deepseek_v3")
    attn = model.model.layers[0].self_attn
    base = attn.scaling
    hf_posenc.patch(model, "yarn", factor=4.0, **knobs)
    if knobs:  # softmax scale * mscale(s, mscale_all_dim)^2, with mscale = 0.1 ln s + 1 (DeepSeek-V2's YaRN)
        assert attn.scaling == pytest.approx(base * (0.1 * torch.log(torch.tensor(4.0)).item() + 1.0) ** 2, rel=1e-6)
    else:
        assert attn.scaling == base
    native = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32).eval()
    native.load_state_dict(model.state_dict())
    assert native.model.layers[0].self_attn.scaling == attn.scaling
    x = ids(150) % 90 + 3
    assert (out(native, x) - out(model, x)).abs().max().item() <= 1e-5
    hf_posenc.unpatch(model)
    assert attn.scaling == base
    with pytest.raises(ValueError, match="attention scale depends on its RoPE parameters"):
        hf_posenc.patch(model, "alibi")


MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                   "beta_fast": 32.0, "beta_slow": 1.0, "llama_4_scaling_beta": 0.1}


def test_ministral3_keeps_its_query_temperature_and_refuses_a_composition_that_would_move_it(tmp_path):
    """Ministral 3 scales its queries by 1 + beta ln(1 + floor(position / original_max_position_embeddings)), read
    from rope_parameters at every forward. A patch used to drop llama_4_scaling_beta (the patched forward failed in
    transformers' attention); a composition (a longrope over the current 64 tokens) would move the temperature's
    16 to 64, so it is refused by name; replacing the scaling keeps the key and plain transformers reads it back."""
    model = build("ministral3", rope_parameters=dict(MINISTRAL3_ROPE))
    with pytest.raises(ValueError, match=r"model_type='ministral3' scales its queries by position from it "
                                         r"\(llama_4_scaling_beta=0.1: 1 \+ beta ln\(1 \+ floor\(position / 16\)\)\); "
                                         "a composition over its 64 tokens would compute that from 64 instead"):
        hf_posenc.patch(model, "yarn", factor=2.0)
    assert not hf_posenc.is_patched(model)
    hf_posenc.patch(model, "yarn", factor=8.0, original_max_position_embeddings=16)
    assert model.config.rope_parameters["llama_4_scaling_beta"] == 0.1
    x, pos = ids(40) % 90 + 3, torch.arange(40)[None] * 5  # positions up to 195: the temperature grows
    with torch.no_grad():
        got = model(x, position_ids=pos).logits
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        assert (plain(x, position_ids=pos).logits - got).abs().max().item() <= 1e-5
    assert plain.config.rope_parameters["llama_4_scaling_beta"] == 0.1


@pytest.mark.parametrize("method", [*PROVEN_SCALINGS, "nope", "alibi"])
def test_a_rotary_module_that_ignores_its_frequency_buffer_is_refused_by_name(method):
    """PhiMoE's rotary module recomputes its frequencies from the config at every forward: writing its inv_freq
    changed nothing, so every scaling and the NoPE swap were silent no-ops there (logits equal to the unpatched
    model's at 100 tokens, past its 64), and the ALiBi swap added ALiBi on top of the RoPE it meant to remove."""
    model = build("phimoe")
    x = ids(100) % 90 + 3
    before = out(model, x)
    with pytest.raises(ValueError, match=f"{method} writes the rotary frequencies of PhimoeRotaryEmbedding, but that "
                                         "module computes its cos/sin from the config at every forward"):
        hf_posenc.patch(model, method, **({} if method in ("nope", "alibi") else {"factor": 2.0}))
    assert not hf_posenc.is_patched(model)
    assert torch.equal(out(model, x), before)
