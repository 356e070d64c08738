"""cache="consistent" for length-dependent RoPE: cached generation equals recomputing the whole sequence at every
step; cache="stale" keeps transformers' behaviour; the math of the re-rotation itself."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers import ORIGINAL, THETA, greedy, ids, tiny_model

import hf_posenc
from hf_posenc.adapters.cache_argument import with_cache
from hf_posenc.encodings import rope as R

DYNAMIC = {"dynamic_ntk": {"factor": 2.0}, "dynamic_yarn": {"factor": 2.0}, "longrope": {"factor": 2.0}}


@torch.no_grad()
def recomputed_greedy(model, prompt, mask, n):
    """Greedy decoding by a full forward over the whole sequence at every step (no cache)."""
    seq, scores = prompt, []
    for _ in range(n):
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(seq, attention_mask=mask, position_ids=position_ids, use_cache=False).logits[:, -1].float()
        scores.append(logits)
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=-1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
    return seq, torch.stack(scores, 1)


def assert_decodes_as_recomputed(model):
    """Greedy generate from 56 tokens to 80 (crossing the original 64) equals recomputing the sequence each step."""
    prompt = ids(56)
    mask = torch.ones_like(prompt)
    seq, scores = greedy(model, prompt, 24, mask)
    ref_seq, ref_scores = recomputed_greedy(model, prompt, mask, 24)
    assert torch.equal(seq, ref_seq)
    assert (scores - ref_scores).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("method", sorted(DYNAMIC))
def test_consistent_cache_equals_recomputing_the_sequence(method, family):
    model = hf_posenc.patch(tiny_model(family), method, cache="consistent", **DYNAMIC[method])
    assert_decodes_as_recomputed(model)


def test_stale_cache_drifts_from_recomputing_and_consistent_is_the_default():
    """The knob matters: with stale keys the cached logits stray from a recomputation past the original context,
    several times further than with re-rotated keys."""
    stale = hf_posenc.patch(tiny_model("llama"), "dynamic_ntk", factor=4.0, cache="stale")
    consistent = hf_posenc.patch(tiny_model("llama"), "dynamic_ntk", factor=4.0)
    assert hf_posenc.get_config(consistent).params["cache"] == "consistent"
    prompt = ids(56)
    mask = torch.ones_like(prompt)
    _, ref_scores = recomputed_greedy(stale, prompt, mask, 24)
    inside = ORIGINAL - 56  # steps whose length stays within the original context agree either way
    errors = {}
    for name, model in (("stale", stale), ("consistent", consistent)):
        _, scores = greedy(model, prompt, 24, mask)
        assert (scores[:, :inside] - ref_scores[:, :inside]).abs().max().item() <= 1e-5
        errors[name] = (scores - ref_scores).abs().max().item()
    assert errors["stale"] > 5 * errors["consistent"] and errors["consistent"] <= 1e-4, errors


LAYOUTS = {  # family -> config: how its attention applies RoPE, and where the rotated key part is cached
    "llama": {},  # rotate-half pairs (i, i + d / 2) on the whole head
    "phi": dict(partial_rotary_factor=0.5),  # partial rotary: the first half of the head
    "cohere": {},  # interleaved pairs (2i, 2i + 1)
    "glm": {},  # partial rotary, interleaved pairs
    "deepseek_v3": dict(num_key_value_heads=4, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, kv_lora_rank=16,
                        q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        first_k_dense_replace=2, n_group=1, topk_group=1),  # MLA: the rotated part cached as values
    "exaone4": dict(head_dim=16, sliding_window=16, layer_types=["full_attention", "sliding_attention"]),  # global NoPE
}


@pytest.mark.parametrize("family", list(LAYOUTS))
def test_every_rotary_layout_re_rotates_to_the_recomputed_cache(family):
    """Re-rotation gives every cached key the rotation of a forward over the whole sequence: the cached tensors of
    the layers whose inputs do not depend on the frequencies (layer 0; up to the first layer that
    rotates: EXAONE 4's global NoPE layer 0 and its sliding layer 1) equal a forward over the whole sequence, on
    every layout: partial rotary, interleaved pairs, MLA's latent cache (its rotated key part is the cached
    "values"), a NoPE layer whose keys carry no rotation. Before, each was re-rotated as rotate-half keys from
    dimension 0 (cohere 0.50 off, worse than stale keys; deepseek_v3 and glm worse than stale in generation)."""
    from transformers import DynamicCache

    model = tiny_model(family, pad_token_id=0, bos_token_id=1, eos_token_id=2, **LAYOUTS[family])
    hf_posenc.patch(model, "dynamic_ntk", factor=4.0, cache="consistent")
    x = ids(80) % 87 + 3
    with torch.no_grad():
        stepped = DynamicCache(config=model.config)
        model(x[:, :56], **with_cache(model, stepped), use_cache=True)
        for t in range(56, 80):
            model(x[:, t : t + 1], **with_cache(model, stepped), use_cache=True)
        whole = DynamicCache(config=model.config)
        model(x, **with_cache(model, whole), use_cache=True)
    exact = 2 if family == "exaone4" else 1
    for i in range(exact):
        for part in ("keys", "values"):
            got, want = getattr(stepped.layers[i], part), getattr(whole.layers[i], part)
            assert (got - want).abs().max().item() <= 1e-5, (i, part)


def test_consistent_cache_with_a_left_padded_batch():
    model = hf_posenc.patch(tiny_model("llama"), "dynamic_ntk", factor=2.0, cache="consistent")
    long, short = ids(58, seed=3), ids(50, seed=4)
    prompt = torch.cat([long, torch.cat([torch.zeros(1, 8, dtype=torch.long), short], -1)])
    mask = torch.ones_like(prompt)
    mask[1, :8] = 0
    seq, scores = greedy(model, prompt, 16, mask)
    ref_seq, ref_scores = recomputed_greedy(model, prompt, mask, 16)
    assert torch.equal(seq, ref_seq)
    assert (scores - ref_scores).abs().max().item() <= 1e-4


def test_consistent_cache_on_sliding_window_layers():
    model = hf_posenc.patch(tiny_model("mistral", sliding_window=24), "dynamic_ntk", factor=2.0, cache="consistent")
    model.config._attn_implementation = "sdpa"
    prompt = ids(56)
    mask = torch.ones_like(prompt)
    seq, scores = greedy(model, prompt, 16, mask)
    ref_seq, ref_scores = recomputed_greedy(model, prompt, mask, 16)
    assert torch.equal(seq, ref_seq)
    assert (scores - ref_scores).abs().max().item() <= 1e-4


@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
@pytest.mark.parametrize("flags", [[0, 0], [1, 0]], ids=["all_nope", "rope_then_nope"])
def test_consistent_cache_leaves_the_keys_of_nope_layers_as_they_are(method, flags):
    """SmolLM3's NoPE layers (no_rope_layers 0) cache unrotated keys: re-rotating them when the frequencies change
    made cached generation stray from a recomputation (1e-3 on an all-NoPE model)."""
    model = hf_posenc.patch(tiny_model("smollm3", no_rope_layers=flags, pad_token_id=0, bos_token_id=1, eos_token_id=2),
                            method, factor=4.0, cache="consistent")
    prompt = ids(56)
    mask = torch.ones_like(prompt)
    seq, scores = greedy(model, prompt, 24, mask)
    ref_seq, ref_scores = recomputed_greedy(model, prompt, mask, 24)
    assert torch.equal(seq, ref_seq)
    assert (scores - ref_scores).abs().max().item() <= (1e-4 if flags[0] else 1e-5)


def test_the_key_layout_is_checked_once_per_attention_class(monkeypatch):
    """Every layer of one attention class shares its rotary layout: the check (a rotation by the modeling file's
    own apply_rotary_pos_emb) runs once for the class, and each rotating layer still gets it (the NoPE one not)."""
    from hf_posenc.adapters import consistent_cache

    checked = []
    real = consistent_cache.key_layout
    monkeypatch.setattr(consistent_cache, "key_layout", lambda attn, *a: checked.append(attn) or real(attn, *a))
    model = tiny_model("smollm3", num_hidden_layers=4, no_rope_layers=[1, 1, 0, 1], pad_token_id=0, bos_token_id=1,
                       eos_token_id=2)
    hf_posenc.patch(model, "dynamic_ntk", factor=4.0, cache="consistent")
    assert len(checked) == 1
    slot = hf_posenc.adapters.layout.rotary_slots(model)[0]
    layers = consistent_cache.rotated_layers(model, model.config, slot, slot.get("inv_freq"))
    assert sorted(layers) == [0, 1, 3] and len({id(v) for v in layers.values()}) == 1 and len(checked) == 2


@pytest.mark.parametrize("family,over", [
    ("gemma3_text", dict(head_dim=16, sliding_window=12, layer_types=["sliding_attention", "full_attention"] * 2)),
    ("qwen3_moe", dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32))])
def test_consistent_cache_on_a_hybrid_and_an_moe_stays_far_closer_than_stale(family, over):
    """What the docs state for deeper models: consistent is not exact past layer 0 (its keys and values come from
    hidden states of shorter lengths; 1.5e-3 on this gemma3_text, 1.1e-2 on this qwen3_moe, whose expert choice
    amplifies a change), yet several times closer to recomputing than stale keys; inside L both are exact."""
    errors = {}
    for mode in ("stale", "consistent"):
        model = hf_posenc.patch(tiny_model(family, num_hidden_layers=4, pad_token_id=0, bos_token_id=1,
                                           eos_token_id=2, **over), "dynamic_ntk", factor=4.0, cache=mode)
        prompt = ids(50, seed=2) % 87 + 3
        mask = torch.ones_like(prompt)
        _, scores = greedy(model, prompt, 40, mask)
        _, ref_scores = recomputed_greedy(model, prompt, mask, 40)
        assert (scores[:, : ORIGINAL - 50] - ref_scores[:, : ORIGINAL - 50]).abs().max().item() <= 1e-5
        errors[mode] = (scores - ref_scores).abs().max().item()
    assert errors["consistent"] * 3 < errors["stale"], errors


def test_consistent_cache_re_rotates_the_keys_of_hybrid_layers():
    """Falcon-H1's 'hybrid' layers keep a Mamba-2 state and keys in one cache layer (a linear-attention layer that
    holds keys too): their keys are re-rotated like a full-attention layer's. One layer, so consistent is exact."""
    model = hf_posenc.patch(tiny_model("falcon_h1", num_hidden_layers=1, head_dim=16, mamba_d_ssm=32,
                                       mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, mamba_chunk_size=16,
                                       eos_token_id=None),  # (no token min_new_tokens would hold back)
                            "dynamic_ntk", factor=2.0, cache="consistent")
    assert_decodes_as_recomputed(model)


def test_consistent_cache_survives_save_load_copy_and_unpatch(tmp_path):
    import copy

    model = hf_posenc.patch(tiny_model("llama"), "dynamic_yarn", factor=2.0, cache="consistent")
    prompt, n = ids(56), 16
    mask = torch.ones_like(prompt)
    want = greedy(model, prompt, n, mask)[1]
    model.save_pretrained(tmp_path / "ckpt")
    loaded = hf_posenc.from_pretrained(str(tmp_path / "ckpt"))
    assert hf_posenc.get_config(loaded).params["cache"] == "consistent"
    for other in (loaded, copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert torch.allclose(greedy(other, prompt, n, mask)[1], want, atol=1e-5)
    hf_posenc.unpatch(model)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


def test_a_quantized_cache_is_refused_by_name():
    """Quantized keys cannot be re-rotated in place (static caches can: tests/test_dynamic_matrix.py)."""
    from transformers import QuantizedCache

    model = hf_posenc.patch(tiny_model("llama"), "dynamic_ntk", factor=2.0, cache="consistent")
    cache = QuantizedCache(backend="fp8", config=model.config)
    with pytest.raises(ValueError, match="QuantizedCache has a Fp8QuantizedLayer layer.*cache='stale'"):
        with torch.no_grad():
            model.generate(ids(60), max_new_tokens=8, do_sample=False, **with_cache(model, cache), pad_token_id=0)


def test_a_bad_cache_mode_names_the_allowed_values():
    with pytest.raises(ValueError, match=r"cache must be one of \['stale', 'consistent', 'exact'\].*'fresh'"):
        hf_posenc.patch(tiny_model("llama"), "dynamic_ntk", factor=2.0, cache="fresh")
    with pytest.raises(ValueError, match="cache"):  # a static scaling has no such knob
        hf_posenc.patch(tiny_model("llama"), "yarn", factor=2.0, cache="consistent")


def test_rerotating_keys_equals_rotating_them_afresh():
    """rerotate_keys(R_old k) == R_new k, scaling included, on a partial rotary head (16 of 24 dims rotated)."""
    torch.manual_seed(0)
    k = torch.randn(2, 3, 40, 24)
    positions = torch.arange(100, 140).expand(2, 40)
    old, new = R.default_inv_freq(THETA, 16), R.default_inv_freq(THETA * 3.7, 16)

    def stored(inv, scale):
        rot = R.apply_rotary(k[..., :16], positions[0], inv) * scale
        return torch.cat([rot, k[..., 16:]], -1)

    keys = stored(old, 1.1)
    got = R.rerotate_keys(keys, *R.rerotation(positions, (old, 1.1), (new, 1.3)))
    assert got is keys and torch.allclose(got, stored(new, 1.3), atol=1e-5)  # in place
    half = stored(old, 1.1).bfloat16()
    R.rerotate_keys(half, *R.rerotation(positions, (old, 1.1), (new, 1.3)))
    assert half.dtype == torch.bfloat16 and torch.allclose(half.float(), stored(new, 1.3), atol=5e-2)


def test_llama4s_complex_rotary_takes_dynamic_ntk_and_refuses_what_it_cannot_re_rotate():
    """Llama 4's rotary module returns one complex tensor (cos + i sin), its causal LM names its body
    ``language_model`` while holding it as ``model``, and its layers are chunked: dynamic NTK with stale keys equals
    transformers' own past L (it crashed: "not enough values to unpack"); re-rotating keys needs a rotate-half or
    interleaved apply_rotary_pos_emb it does not have, so consistent/exact are refused naming cache='stale'; an
    attention-level method is refused naming its NoPE global layers and its chunks, not by a missing layer list."""
    from transformers import AutoConfig, AutoModelForCausalLM

    def build(rope_parameters):
        cfg = AutoConfig.for_model(
            "llama4_text", vocab_size=96, hidden_size=64, intermediate_size=96, intermediate_size_mlp=96,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
            num_local_experts=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, attention_chunk_size=32,
            rope_parameters=rope_parameters)
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg).eval()

    plain = {"rope_type": "default", "rope_theta": 10000.0}
    x = ids(150) % 87 + 3
    model = hf_posenc.patch(build(plain), "dynamic_ntk", factor=2.0, cache="stale")
    native = build({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    with torch.no_grad():
        assert (model(x).logits - native(x).logits).abs().max().item() <= 1e-5
    for mode in ("consistent", "exact"):
        with pytest.raises(ValueError, match=f"cache='{mode}' .*Llama4TextAttention has no apply_rotary_pos_emb.* "
                                             "Patch with cache='stale'"):
            hf_posenc.patch(build(plain), "dynamic_ntk", factor=2.0, cache=mode)
    with pytest.raises(ValueError, match="rotates nothing .*; its chunked_attention layers never see a distance "
                                         "past their window \\(attention_chunk_size=32\\)"):
        hf_posenc.patch(build(plain), "self_extend", group_size=4, window=16)


def test_longrope_rows_past_the_original_context_share_one_set_of_frequencies_and_dynamic_ntk_rows_do_not():
    """LongRoPE switches once (every length past L has its long factors: one key), dynamic NTK grows with each
    length (a key per length): what decides which cached keys are re-rotated and when generate re-encodes."""
    from hf_posenc.adapters.rope_scaling import LengthAwareRope

    def hook(method):
        model = hf_posenc.patch(tiny_model("llama"), method, factor=2.0)
        return next(h for m in model.modules() for h in m._forward_hooks.values() if isinstance(h, LengthAwareRope))

    longrope, ntk = hook("longrope"), hook("dynamic_ntk")
    assert longrope.key(60) is None and longrope.key(100) == longrope.key(120) == 65
    assert ntk.key(100) == 100 and ntk.key(120) == 120
