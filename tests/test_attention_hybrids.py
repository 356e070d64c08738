"""The attention-level methods (Self-Extend, DCA, ReRoPE, leaky ReRoPE, STRING) beyond one plain RoPE on
full-attention layers: a checkpoint whose RoPE is already scaled
(llama3, YaRN, LongRoPE: its own frequencies and attention factor), sliding/full hybrids (Gemma 3 with a RoPE per
layer type, gpt-oss with attention sinks, Gemma 2 with soft-capping: full-attention layers replaced, sliding ones
left as they are), partial rotary (Phi), MLA (DeepSeek-V3: the decoupled RoPE part, the model's softmax scale) and
NoPE layers (SmolLM3's no_rope_layers: left as they are).

Each against an eager reference written out here (float64: the remapped relative position r(i, j) of each
paper's formula applied to every query-key pair of a full-attention layer on the rotated dimensions, each layer
type's frequencies computed from its own rope_parameters), the unpatched model inside the method's window,
cached generation against recomputation, a save/load round trip and unpatch. fp32: "equal" is within 1e-5."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import ids, logits
from test_cache_matrix import generated, recomputed_gap
from test_remapped import relative
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM, DynamicCache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posenc

EXACT = 1e-5
THETA = 50_000.0
WINDOW = 12  # the sliding window of the hybrids: every input here crosses it
SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
HYBRID = dict(head_dim=16, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])
FAMILIES = {
    "llama3": ("llama", dict(max_position_embeddings=256, rope_parameters={
        "rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 64, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "rope_theta": THETA})),
    "longrope": ("llama", dict(max_position_embeddings=256, rope_parameters={
        "rope_type": "longrope", "original_max_position_embeddings": 64, "rope_theta": THETA,
        "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5], "long_factor": [1.0, 1.5, 2, 3, 4, 5, 6, 8]})),
    "gemma3_text": ("gemma3_text", dict(HYBRID, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": THETA},
        "sliding_attention": {"rope_type": "default", "rope_theta": 7_000.0}})),
    "gpt_oss": ("gpt_oss", dict(HYBRID, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
                                rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 64, "rope_theta": THETA})),
    "gemma2": ("gemma2", dict(HYBRID, attn_logit_softcapping=0.05, query_pre_attn_scalar=1,
                              rope_parameters={"rope_type": "default", "rope_theta": THETA})),
    "phi": ("phi", dict(rope_parameters={"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": 0.5})),
    "gemma4_text": ("gemma4_text", dict(HYBRID, global_head_dim=32, vocab_size_per_layer_input=96,
                                        hidden_size_per_layer_input=16, rope_parameters={
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": THETA},
        "sliding_attention": {"rope_type": "default", "rope_theta": 7_000.0}})),
    "gemma4_kv_shared": ("gemma4_text", dict(  # its last two layers read the keys and values of the two before;
        # its full layers' values are their keys before RoPE (Gemma 4 26B/31B's attention_k_eq_v)
        HYBRID, global_head_dim=32, vocab_size_per_layer_input=96, hidden_size_per_layer_input=16,
        attention_k_eq_v=True, num_global_key_value_heads=1,
        num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2,
        rope_parameters={
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": THETA},
            "sliding_attention": {"rope_type": "default", "rope_theta": 7_000.0}})),
    "qwen3_next": ("qwen3_next", dict(  # gated DeltaNet layers (no positions) beside partial-rotary full attention
        head_dim=16, layer_types=["linear_attention", "full_attention"], linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        rope_parameters={"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": 0.5})),
    "falcon_h1": ("falcon_h1", dict(  # each layer a Mamba-2 mixer beside full attention ('hybrid' layers)
        head_dim=16, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, mamba_chunk_size=16,
        key_multiplier=0.7, rope_parameters={"rope_type": "default", "rope_theta": THETA})),
    "smollm3": ("smollm3", dict(no_rope_layers=[1, 0], rope_parameters={"rope_type": "default", "rope_theta": THETA})),
    "deepseek_v3": ("deepseek_v3", dict(
        num_key_value_heads=4, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, kv_lora_rank=16, q_lora_rank=None,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1,
        topk_group=1, rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                       "mscale": 1.0, "mscale_all_dim": 0.7, "rope_theta": THETA})),
}
KNOBS = {"self_extend": {"group_size": 4, "window": 16}, "dca": {"chunk_size": 48, "local_window": 4},
         "rerope": {"window": 16}, "leaky_rerope": {"window": 16, "leak": 4.0},
         "string": {"shifted_offset": 20, "local_window": 4}}
# the longest input the method leaves as it is: the window, the chunk, the offset (STRING scales every score by
# attention_factor^2, inside its offset too: 1.0 there)
INSIDE = {"self_extend": 16, "dca": 44, "rerope": 16, "leaky_rerope": 16, "string": 20}
INSIDE_KNOBS = {"string": {"attention_factor": 1.0}}
CASES = [(f, m) for f in FAMILIES for m in KNOBS]


def build(family, seed=0, **over):
    model_type, extra = FAMILIES[family]
    cfg = AutoConfig.for_model(model_type, **{**SMALL, **extra, **over})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def patched(family, method, **over):
    return hf_posenc.patch(build(family, **over), method, **KNOBS[method])


def text(n, seed=1, batch=1):
    return ids(n, seed=seed, batch=batch) % 90 + 3  # no special tokens


# -- the written-out reference -------------------------------------------------------------------------------------
def layer_type(cfg, index):
    return (getattr(cfg, "layer_types", None) or ["full_attention"] * (index + 1))[index]


def full_frequencies(cfg):
    """The frequencies of the full-attention layers, from their own rope_parameters (longrope: its short factors,
    those of inputs up to its original context)."""
    rp = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    if rp.get("rope_type") == "proportional":  # Gemma 4: its full layers' own head width, their still pairs at 0
        full = cfg.per_layer_config["full_attention"]
        return ROPE_INIT_FUNCTIONS["proportional"](full, None, layer_type="full_attention")[0].double()
    if rp.get("rope_type", "default") != "default":
        return ROPE_INIT_FUNCTIONS[rp["rope_type"]](cfg, None)[0].double()
    head = (getattr(cfg, "qk_rope_head_dim", None) or getattr(cfg, "head_dim", None)
            or cfg.hidden_size // cfg.num_attention_heads)
    dim = int(head * rp.get("partial_rotary_factor", 1.0))
    return 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def query_scale(module, method, t):
    """ReRoPE's log-n scaling of the query at each position, max(1, ln(i + 1) / ln L), L the context the patch
    extends (the context the checkpoint serves: a YaRN's factor x its original where that is more than
    max_position_embeddings, as DeepSeek's here); STRING's attention_factor^2 on every score; else 1."""
    pos = torch.arange(t, dtype=torch.float64)
    if method in ("rerope", "leaky_rerope"):
        rp = module.config.rope_parameters.get("full_attention", module.config.rope_parameters)
        length_dependent = rp.get("rope_type") in ("longrope", "dynamic")  # then L is its original context
        L = rp["original_max_position_embeddings"] if length_dependent else module.config.max_position_embeddings
        if rp.get("rope_type") == "yarn":
            L = max(L, int(rp["factor"] * rp["original_max_position_embeddings"]))
        return (torch.log(pos + 1) / math.log(L)).clamp(min=1)[:, None]
    if method == "string":
        return torch.full((t, 1), (0.1 * math.log(2) + 1) ** 2, dtype=torch.float64)
    return torch.ones(t, 1, dtype=torch.float64)


def full_scores(module, q, k, method):
    """Scores of a full-attention layer: each query turned by r(i, j) - (i - j) against key j on the rotated
    dimensions (given rotated at i and j, so the score sees r(i, j)), the other dimensions as they are, and the
    whole score scaled per query as the method scales it (:func:`query_scale`)."""
    q = q * query_scale(module, method, q.shape[2])
    inv = full_frequencies(module.config)
    first = getattr(module, "qk_nope_head_dim", 0) if hasattr(module, "qk_rope_head_dim") else 0
    rot, half = 2 * inv.numel(), inv.numel()
    pos = torch.arange(q.shape[2])
    delta = relative(method, KNOBS[method], pos[:, None], pos[None, :]) - (pos[:, None] - pos[None, :])
    ang = delta[..., None] * inv
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    qr = q[..., first : first + rot][:, :, :, None, :]
    turned = qr * cos + torch.cat((-qr[..., half:], qr[..., :half]), -1) * sin
    rotated = (turned * k[..., first : first + rot][:, :, None]).sum(-1)
    keep = torch.ones(q.shape[-1], dtype=torch.bool)
    keep[first : first + rot] = False
    return rotated + q[..., keep] @ k[..., keep].transpose(-1, -2)


def reference_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None,
                        s_aux=None, sliding_window=None, **kwargs):
    """Eager attention of one whole sequence (no cache, no padding), float64."""
    method = module.config.hf_posenc_test_method
    groups = query.shape[1] // key.shape[1]
    q, k, v = query.double(), key.double().repeat_interleave(groups, 1), value.double().repeat_interleave(groups, 1)
    full = layer_type(module.config, module.layer_idx) in ("full_attention", "hybrid") and getattr(module, "use_rope",
                                                                                                  True)
    s = (full_scores(module, q, k, method) if full else q @ k.transpose(-1, -2)) * scaling
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    pos = torch.arange(q.shape[2])
    d = pos[:, None] - pos[None, :]
    keep = (d >= 0) & ((d < sliding_window) if sliding_window is not None else True)
    s = s.masked_fill(~keep, float("-inf"))
    if s_aux is not None:
        s = torch.cat([s, s_aux.double().reshape(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    p = torch.softmax(s, -1)[..., : q.shape[2]]
    return (p @ v).transpose(1, 2).to(query.dtype).contiguous(), None


AttentionInterface.register("hf_posenc_test_reference", reference_attention)
AttentionMaskInterface.register("hf_posenc_test_reference", sdpa_mask)


@torch.no_grad()
def reference_logits(family, method, x):
    model = build(family)
    if family == "longrope":  # its short factors at every length: the method keeps relative positions below 64
        model.model.rotary_emb.rope_type = "default"
    model.config.hf_posenc_test_method = method
    model.config._attn_implementation = "hf_posenc_test_reference"
    return model(x).logits.float()


@pytest.mark.parametrize("family,method", CASES)
def test_matches_the_written_out_reference(family, method):
    x = text(100)
    got = logits(patched(family, method), x)
    assert (got - reference_logits(family, method, x)).abs().max().item() <= EXACT
    assert (got - logits(build(family), x)).abs().max().item() > 1e-4  # past the window the method changes them


@pytest.mark.parametrize("family,method", CASES)
def test_inside_the_window_unchanged_and_unpatch_bit_for_bit(family, method):
    model = build(family)
    short, long = text(INSIDE[method]), text(120)
    before_short, before_long = logits(model, short), logits(model, long)
    hf_posenc.patch(model, method, **{**KNOBS[method], **INSIDE_KNOBS.get(method, {})})
    assert (logits(model, short) - before_short).abs().max().item() <= EXACT
    assert (logits(model, long) - before_long).abs().max().item() > 1e-4
    hf_posenc.unpatch(model)
    assert torch.equal(logits(model, short), before_short) and torch.equal(logits(model, long), before_long)


def test_the_sinks_and_the_soft_capping_the_references_keep_matter():
    """What makes the gpt-oss and Gemma 2 checks above able to fail: their sinks and soft-capping change the logits."""
    x = text(60)
    for family, over in (("gemma2", {"attn_logit_softcapping": None}), ("gemma3_text", {"rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 7_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 7_000.0}}})):
        assert (logits(build(family), x) - logits(build(family, **over), x)).abs().max().item() > 1e-3
    model = build("gpt_oss")
    before = logits(model, x)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.zero_()
    assert (logits(model, x) - before).abs().max().item() > 1e-3


# -- caches, saving, listing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cache", ["dynamic", "static", "sliding_window"])
@pytest.mark.parametrize("family,method", CASES)
def test_cached_generate_equals_recomputation(family, method, cache):
    """Greedy generate with the cache (one row left-padded, one not; the hybrids' sliding layers in their own
    sliding cache layers) equals each row's whole sequence recomputed without a cache."""
    model = patched(family, method)
    seqs, steps = generated(model, cache_implementation=cache)
    assert recomputed_gap(model, seqs, steps) <= EXACT


@pytest.mark.parametrize("family,method", CASES)
def test_saved_and_loaded_back_gives_the_same_logits(family, method, tmp_path):
    model = patched(family, method)
    x = text(100)
    want = logits(model, x)
    model.save_pretrained(tmp_path)
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert hf_posenc.get_config(again) == hf_posenc.get_config(model)
    assert (logits(again, x) - want).abs().max().item() <= EXACT


def test_list_methods_names_the_families():
    listed = hf_posenc.list_methods()
    for method in KNOBS:
        assert {"gemma3_text", "gemma2", "gpt_oss", "phi", "deepseek_v3", "smollm3"} <= set(listed[method]["families"])


# -- what stays refused ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", list(KNOBS))
def test_a_model_whose_every_layer_slides_is_refused_by_name(method):
    cfg = AutoConfig.for_model("mistral", **{**SMALL, "sliding_window": 24})
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(ValueError, match=f"{method} replaces full attention; model_type='mistral' has none \\(its "
                                         "layers: \\['sliding_attention'\\]; sliding_window=24\\), so it has "
                                         "nothing to extend"):
        hf_posenc.patch(model, method, **KNOBS[method])
    assert not hf_posenc.is_patched(model)


@pytest.mark.parametrize("method", list(KNOBS))
def test_a_model_whose_every_full_layer_is_nope_is_refused_by_name(method):
    """SmolLM3 with no_rope_layers all 0: no layer rotates, so there is no position to remap (the method was a
    silent change of the NoPE layers before: its queries and keys got turned past the window)."""
    model = build("smollm3", no_rope_layers=[0, 0])
    with pytest.raises(ValueError, match=f"{method} remaps the RoPE positions of full-attention layers; every "
                                         "full-attention layer of model_type='smollm3' \\(layers \\[0, 1\\]\\) "
                                         "rotates nothing \\(NoPE: no_rope_layers is 0 there\\), so it has "
                                         "nothing to extend"):
        hf_posenc.patch(model, method, **KNOBS[method])
    assert not hf_posenc.is_patched(model)


@pytest.mark.parametrize("method", list(KNOBS))
def test_global_nope_beside_sliding_layers_is_found_by_running_the_layers_and_refused(method):
    """EXAONE 4 with a sliding window rotates its sliding layers only: its full-attention layers are NoPE with no
    config key saying so (the method computed them before: logits 0.2 off). Found by running each attention
    module at two sets of positions."""
    cfg = AutoConfig.for_model("exaone4", **{**SMALL, **HYBRID, "rope_parameters": {"rope_type": "default",
                                                                                     "rope_theta": THETA}})
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(ValueError, match=f"{method} remaps the RoPE positions of full-attention layers; every "
                                         "full-attention layer of model_type='exaone4' \\(layers \\[1\\]\\) "
                                         "rotates nothing \\(NoPE: a probe of each one found its queries "
                                         "and keys turned by no position\\)"):
        hf_posenc.patch(model, method, **KNOBS[method])
    assert not hf_posenc.is_patched(model)


@pytest.mark.parametrize("method", [*KNOBS, "alibi"])
def test_linear_attention_layers_are_left_to_the_model_and_an_unknown_layer_type_is_refused(method):
    """OLMo Hybrid's gated-DeltaNet layers have no self_attn and read no RoPE position: an attention-level method
    computes its full-attention layer only (equal inside its window, the DeltaNet layer's weights untouched). A layer
    type the methods do not know (DeepSeek-V3.2's indexed attention) is refused by its name before any layer is
    touched, as is the ALiBi swap, which needs a self-attention in every layer."""
    cfg = AutoConfig.for_model("olmo_hybrid", **{**SMALL, "layer_types": ["linear_attention", "full_attention"],
                                                 "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                                                 "linear_num_key_heads": 2, "linear_num_value_heads": 2})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if method != "alibi":
        short = text(INSIDE[method])
        before = logits(model, short)
        hf_posenc.patch(model, method, **{**KNOBS[method], **INSIDE_KNOBS.get(method, {})})
        assert (logits(model, short) - before).abs().max().item() <= EXACT
        hf_posenc.unpatch(model)
        model.config.layer_types = ["indexed_attention", "full_attention"]
        said = (rf"{method} computes full-attention layers \(full_attention, hybrid\) and leaves windowed "
                r"\(sliding_attention, chunked_attention, hybrid_sliding\) and position-free \(linear_attention, "
                r"conv\) ones alone; model_type='olmo_hybrid' has layers of type \['indexed_attention'\], which it "
                "does not serve")
    else:  # the swap to ALiBi, on the same model
        said = (r"'alibi' swaps RoPE for ALiBi in each layer's self-attention; layers \[0\] of "
                r"model_type='olmo_hybrid' have none \(layer types \['linear_attention'\]")
    with pytest.raises(ValueError, match=said):
        hf_posenc.patch(model, method, **KNOBS.get(method, {}))
    assert not hf_posenc.is_patched(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


@pytest.mark.parametrize("apply, refused", [
    (lambda q, k, cos, sin, scale, shift: (q, k),
     "self_extend: the apply_rotary_pos_emb of LlamaAttention's modeling file takes neither \\(queries, keys, cos, "
     "sin\\) nor \\(x, cos, sin\\) \\(TypeError"),
    (lambda x, cos, sin, unsqueeze_dim=1: x * cos.unsqueeze(unsqueeze_dim),  # one tensor at a time, as Gemma 4's
     "LlamaAttention's RoPE \\(apply_rotary_pos_emb\\) composes that way in neither the rotate-half nor the "
     "interleaved layout"),
])
def test_an_apply_rotary_of_another_signature_is_refused_by_name(monkeypatch, apply, refused):
    """The rotary layout is checked by calling the modeling file's apply_rotary_pos_emb as (q, k, cos, sin), else
    one tensor at a time as (x, cos, sin) (Gemma 4's); one that takes neither used to fail inside torch, and one that
    is no rotation is refused by the layout check."""
    import transformers.models.llama.modeling_llama as modeling

    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", apply)
    cfg = AutoConfig.for_model("llama", **SMALL)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(ValueError, match=refused):
        hf_posenc.patch(model, "self_extend", **KNOBS["self_extend"])
    assert not hf_posenc.is_patched(model)


def test_the_nope_layer_the_reference_keeps_matters():
    """What makes the SmolLM3 check above able to fail: rotating its NoPE layer changes the logits."""
    x = text(60)
    assert (logits(build("smollm3"), x) - logits(build("smollm3", no_rope_layers=[1, 1]), x)).abs().max() > 1e-3


def test_a_rotary_layout_of_interleaved_pairs_is_refused_by_name():
    """Cohere rotates interleaved pairs: turning its queries further in the rotate-half layout would be wrong."""
    cfg = AutoConfig.for_model("cohere", **SMALL)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(ValueError, match="self_extend turns queries and keys further in the rotate-half layout.*"
                                         "CohereAttention's RoPE \\(apply_rotary_pos_emb\\) does not compose"):
        hf_posenc.patch(model, "self_extend", **KNOBS["self_extend"])
    assert not hf_posenc.is_patched(model)


@pytest.mark.parametrize("method", list(KNOBS))
def test_a_statically_scaled_checkpoint_takes_l_up_to_its_current_context(method, tmp_path):
    """llama3 x4 from 64 to 256: L defaults to the 256 its scaled RoPE advertises (the method extends from there,
    never advertising less); 64 to 256 may be given, past it is refused by name, and so is any other L on a
    length-dependent scaling."""
    model = build("llama3")
    default = hf_posenc.patch(build("llama3"), method, **KNOBS[method])
    assert hf_posenc.get_config(default).original_max_position_embeddings == 256
    assert default.config.max_position_embeddings > 256
    recorded = hf_posenc.patch(build("llama3"), method, original_max_position_embeddings=64, **KNOBS[method])
    assert hf_posenc.get_config(recorded).original_max_position_embeddings == 64
    x = text(100)
    before = logits(model, x)
    hf_posenc.patch(model, method, original_max_position_embeddings=256,
                    **{**KNOBS[method], **INSIDE_KNOBS.get(method, {})})
    assert hf_posenc.get_config(model).original_max_position_embeddings == 256
    assert model.config.max_position_embeddings == {  # the longest input whose positions stay below L, else 4 L
        "self_extend": (256 - 16) * 4 + 16, "dca": 4 * 256, "rerope": 4 * 256,
        "leaky_rerope": 16 + (256 - 1 - 16) * 4 + 1, "string": 256 + 20 - 4}[method]
    assert (logits(model, text(INSIDE[method])) - before[:, : INSIDE[method]]).abs().max().item() <= EXACT
    model.save_pretrained(tmp_path)
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert (logits(again, x) - logits(model, x)).abs().max().item() <= EXACT
    with pytest.raises(ValueError, match="original_max_position_embeddings=300 conflicts with the checkpoint, which "
                                         "records 64 .* or up to 256, the context its scaled RoPE is trained for"):
        hf_posenc.patch(build("llama3"), method, original_max_position_embeddings=300, **KNOBS[method])
    with pytest.raises(ValueError, match="original_max_position_embeddings=128 conflicts .* omit it or pass 64\\.$"):
        hf_posenc.patch(build("longrope"), method, original_max_position_embeddings=128, **KNOBS[method])


def test_nope_is_found_in_a_model_patched_while_training_with_dropout_and_its_random_state_is_kept():
    """Attention dropout made the two probing outputs differ on a NoPE layer (EXAONE 4's global NoPE was computed
    again) and drew random numbers: the probe runs the module in eval mode, and the model stays in training."""
    cfg = AutoConfig.for_model("exaone4", **{**SMALL, **HYBRID, "attention_dropout": 0.1, "rope_parameters": {
        "rope_type": "default", "rope_theta": THETA}})
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).train()
    with pytest.raises(ValueError, match="every full-attention layer of model_type='exaone4' \\(layers \\[1\\]\\) "
                                         "rotates nothing"):
        hf_posenc.patch(model, "self_extend", **KNOBS["self_extend"])
    state = torch.get_rng_state()
    hf_posenc.patch(model, "dynamic_ntk", factor=4.0)
    assert torch.equal(torch.get_rng_state(), state) and model.training
    assert all(layer.self_attn.training for layer in model.model.layers)


def test_each_layer_is_probed_for_nope_once_per_patch(monkeypatch):
    """The plan checked before anything changes is the one applied: each full-attention layer's NoPE probe (two
    attention forwards) runs once per patch, and patching again, after unpatch, plans again."""
    from hf_posenc.adapters import remapped_layers

    probed = []
    real = remapped_layers.rotates
    monkeypatch.setattr(remapped_layers, "rotates", lambda attn, *a: probed.append(attn) or real(attn, *a))
    model = build("smollm3", num_hidden_layers=3, no_rope_layers=[1, 0, 1])
    hf_posenc.patch(model, "self_extend", **KNOBS["self_extend"])
    layers = [layer.self_attn for layer in model.model.layers]
    assert len(probed) == 3 and all(a is b for a, b in zip(probed, layers))
    hf_posenc.unpatch(model)
    hf_posenc.patch(model, "dca", **KNOBS["dca"])
    assert len(probed) == 6
    x = text(60)
    extended = logits(model, x)
    hf_posenc.unpatch(model)
    assert (extended - logits(model, x)).abs().max() > 1e-3  # the plan applied computes the full layers


def test_nope_is_found_on_weights_not_loaded_yet_and_behind_a_zero_output_projection():
    """Layer weights on the meta device (accelerate's disk offload keeps them there until a forward) cannot be run:
    a narrow twin built from the config answers for each layer, so EXAONE 4's global NoPE layers are refused as in
    memory, and ALiBi leaves them to the model's own attention. A model whose rotary frequencies are on meta too
    (built under torch.device("meta")) is refused by name. A rotating layer whose output projection is zero
    (zero-initialised, pruned) still rotates: the probe compares the attention weights too."""
    from hf_posenc.adapters.layout import attention_modules

    cfg = AutoConfig.for_model("exaone4", **{**SMALL, **HYBRID, "num_hidden_layers": 4, "layer_types": [
        "sliding_attention", "full_attention"] * 2, "rope_parameters": {"rope_type": "default", "rope_theta": THETA}})
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        bare = AutoModelForCausalLM.from_config(cfg)
    for method, knobs in (("self_extend", KNOBS["self_extend"]), ("yarn", {"factor": 2.0}), ("alibi", {})):
        with pytest.raises(ValueError, match=f"^{method}: the model's rotary frequencies \\(inv_freq\\) are on the "
                                             "meta device"):
            hf_posenc.patch(bare, method, **knobs)
    meta = AutoModelForCausalLM.from_config(cfg)
    meta.model.layers.to("meta")  # as offloaded
    with pytest.raises(ValueError, match="every full-attention layer of model_type='exaone4' \\(layers \\[1, 3\\]\\) "
                                         "rotates nothing"):
        hf_posenc.patch(meta, "self_extend", **KNOBS["self_extend"])
    hf_posenc.patch(meta, "alibi")
    assert [a.__dict__["_hf_posenc_alibi"].flat for a in attention_modules(meta)] == [False, True, False, True]
    model = build("gemma3_text")
    torch.nn.init.zeros_(model.model.layers[1].self_attn.o_proj.weight)
    hf_posenc.patch(model, "self_extend", **KNOBS["self_extend"])
    assert hf_posenc.adapters.remapped_layers.computed_layers(model)[1] == [False, True]


def _post_rope_weighted(family: str, spread: bool):
    """A tiny ``family`` (HunYuan: query and key RMSNorm after RoPE; Dory: a query scale ``sqk`` after it), its
    weights after RoPE given a spread per channel (as training leaves them) or left constant (as initialised)."""
    torch.manual_seed(0)
    extra = {} if family.startswith("hunyuan") else {"sliding_window": WINDOW, "layer_types": HYBRID["layer_types"]}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **SMALL, head_dim=16, **extra)).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            for w in ([attn.query_layernorm.weight, attn.key_layernorm.weight] if family.startswith("hunyuan")
                      else [attn.sqk]):
                w.mul_(1 + 0.25 * torch.randn(w.shape) if spread else 1.0)
    return model


@pytest.mark.parametrize("method", list(KNOBS))
def test_a_per_channel_weight_after_rope_is_found_by_running_the_module_and_refused(method):
    """HunYuan normalises its queries and keys after RoPE with a weight per channel, Dory scales its queries per
    channel after it: turning them further where the attention function receives them is not RoPE at the remapped
    position, and every attention-level method used to do it silently (a constant weight, as initialised, commutes
    with the turn and is taken). Weights not loaded yet (meta) are answered by a narrow twin whose weights after
    RoPE are spread, as trained ones are."""
    for family, part in (("hunyuan_v1_dense", "queries"), ("dory", "queries")):
        model = _post_rope_weighted(family, spread=True)
        with pytest.raises(ValueError, match=f"{method} turns the {part} of .*Attention further, where its attention "
                                             f"function receives them; model_type='{family}' changes its {part} after "
                                             "RoPE per channel"):
            hf_posenc.patch(model, method, **KNOBS[method])
        assert not hf_posenc.is_patched(model)
        hf_posenc.patch(_post_rope_weighted(family, spread=False), method, **KNOBS[method])
        offloaded = _post_rope_weighted(family, spread=False)
        offloaded.model.layers.to("meta")  # not loaded yet: a narrow twin's layer, its weights spread, answers
        with pytest.raises(ValueError, match=f"{method} turns the {part} of .*Attention further"):
            hf_posenc.patch(offloaded, method, **KNOBS[method])


def test_re_rotating_cached_keys_is_refused_where_the_keys_change_after_rope_and_taken_where_only_queries_do():
    """The re-rotated cache turns cached keys: refused on HunYuan (its key norm after RoPE), by name with the
    cache='stale' alternative; Dory's per-channel scale is on queries only, so its cached keys re-rotate right."""
    with pytest.raises(ValueError, match="cache='consistent' \\(cached keys re-rotated\\) turns the keys of "
                                         "HunYuanDenseV1Attention further.*Patch with cache='stale'"):
        hf_posenc.patch(_post_rope_weighted("hunyuan_v1_dense", spread=True), "dynamic_ntk", factor=2.0)
    hf_posenc.patch(_post_rope_weighted("hunyuan_v1_dense", spread=True), "dynamic_ntk", factor=2.0, cache="stale")
    hf_posenc.patch(_post_rope_weighted("dory", spread=True), "dynamic_ntk", factor=2.0)


def test_the_probe_runs_attention_that_needs_position_ids_and_a_mask(monkeypatch):
    """Ministral 3's attention takes ``position_ids`` (its query temperature), DeepSeek-V3.2's indexer reads the mask:
    called without them the probe had no answer and the method was applied unchecked. Given a per-channel query
    temperature (a weight after RoPE), Ministral 3 is now refused by name; its own per-position one is taken."""
    import transformers.models.ministral3.modeling_ministral3 as ministral3

    own = ministral3.get_llama_4_attn_scale
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("ministral3", **SMALL, head_dim=16)).eval()
    hf_posenc.patch(model, "self_extend", **KNOBS["self_extend"])  # (its scale per position commutes with a turn)
    channels = 1 + 0.25 * torch.randn(16, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(ministral3, "get_llama_4_attn_scale", lambda *a: own(*a) * channels)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("ministral3", **SMALL, head_dim=16)).eval()
    with pytest.raises(ValueError, match="self_extend turns the queries of Ministral3Attention further"):
        hf_posenc.patch(model, "self_extend", **KNOBS["self_extend"])


def test_a_composite_model_selects_the_method_for_its_language_model_alone():
    """Phi-4-multimodal's config holds its vision and audio configs: transformers' setter of the attention
    implementation sets every sub-config too, so the vision and audio towers ran the method's attention function
    (which fails on a module it did not patch). Only the configs the patched attention modules read select it; unpatch
    gives each config its own implementation back."""
    from hf_posenc.adapters.narrow_twin import narrow_twin

    model = narrow_twin(AutoConfig.for_model("phi4_multimodal"))
    model.config._attn_implementation = "sdpa"
    model.config.vision_config._attn_implementation_internal = "eager"
    hf_posenc.patch(model, "self_extend", **KNOBS["self_extend"])
    patched = model.config
    assert patched._attn_implementation != "sdpa"  # the language model runs the method
    assert [patched.vision_config._attn_implementation, patched.audio_config._attn_implementation] == ["eager", "sdpa"]
    hf_posenc.unpatch(model)
    assert [model.config._attn_implementation, model.config.vision_config._attn_implementation,
            model.config.audio_config._attn_implementation] == ["sdpa", "eager", "sdpa"]


def test_an_attention_whose_indexer_reads_the_mask_is_run_with_one():
    """DeepSeek-V3.2's sparse-attention indexer reads the mask its attention gets: called with none, the forward
    raised and every check that runs the module (NoPE, the probe) had no answer. It is called again with a causal
    mask, and gives its output."""
    from hf_posenc.adapters.layout import attention_modules, rotary_slots
    from hf_posenc.adapters.narrow_twin import narrow_twin
    from hf_posenc.adapters.rotary_layout import call_attention

    twin = narrow_twin(AutoConfig.for_model("deepseek_v32"))
    attn, slot = attention_modules(twin)[0], rotary_slots(twin)[0]
    out = call_attention(attn, slot, twin.config, torch.arange(4)[None], "eager")
    assert out[0].shape[:2] == (1, 4) and torch.isfinite(out[0]).all()


@pytest.mark.parametrize("reuse", ["crop", "reset"])
def test_kv_shared_layers_under_logits_to_keep_read_this_calls_keys_after_a_cache_is_cut_back(reuse):
    """Gemma 4's KV-shared layers compute the call's last queries only under logits_to_keep; the keys new in the call
    come before them. The rotated keys kept from earlier steps were taken as valid up to those queries, so a cache cut
    back (crop: multi-turn chat, assisted decoding; reset: a reused cache) handed the layer keys of the text it no
    longer holds."""
    model = hf_posenc.patch(build("gemma4_kv_shared"), "self_extend", group_size=4, window=8)  # remaps past 8
    x, y = text(30), text(12, seed=2)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        if reuse == "crop":
            model(x[:, :10], past_key_values=cache, use_cache=True)
        want = model(y, past_key_values=cache, use_cache=True).logits[:, -1]
        cache = DynamicCache(config=model.config)
        if reuse == "crop":
            cache.activate_past_recording()  # (its sliding layers can then roll back)
        model(x, past_key_values=cache, use_cache=True)
        cache.crop(-20) if reuse == "crop" else cache.reset()  # (back to x[:, :10])
        got = model(y, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    assert (got - want).abs().max().item() <= EXACT


@pytest.mark.parametrize("method", ["self_extend", "dca"])
def test_llama4s_chunked_rope_layers_and_nope_global_layers_are_refused_saying_why(method):
    """Llama 4: its RoPE layers attend within chunks (never a distance past attention_chunk_size), its global layers
    are NoPE: nothing to remap, said with both reasons, nothing changed."""
    cfg = AutoConfig.for_model("llama4_text", **{**SMALL, "num_hidden_layers": 4, "head_dim": 16,
                                                 "intermediate_size_mlp": 96, "num_local_experts": 2,
                                                 "attention_chunk_size": 16, "no_rope_layers": [1, 1, 1, 0],
                                                 "layer_types": ["chunked_attention"] * 3 + ["full_attention"]})
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(ValueError, match=r"every full-attention layer of model_type='llama4_text' \(layers \[3\]\) "
                                         r"rotates nothing \(NoPE: no_rope_layers is 0 there\), so it has nothing to "
                                         r"extend; its chunked_attention layers never see a distance past their "
                                         r"window \(attention_chunk_size=16\)"):
        hf_posenc.patch(model, method, **KNOBS[method])
    assert not hf_posenc.is_patched(model)
