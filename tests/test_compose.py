"""A RoPE scaling on a checkpoint already scaled (a tiny Llama 3.1: llama3 x8 over 64, advertising 512) extends
from its current context and frequencies, never from its pretraining length: checked against the rules written
out here, against plain transformers (the saved longrope), for cached decoding, and for what is refused."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import hf_posenc
from hf_posenc.encodings import rope as R

PRETRAINED, FACTOR, THETA, DIM = 64, 8.0, 10000.0, 16
CONTEXT = int(PRETRAINED * FACTOR)  # 512: what the checkpoint advertises
LLAMA3 = {"rope_type": "llama3", "rope_theta": THETA, "factor": FACTOR, "original_max_position_embeddings": PRETRAINED,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def scaled_llama(rope: dict, context: int) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                               rope_parameters=rope)
    return AutoModelForCausalLM.from_config(cfg).eval()


def llama31(**rope) -> torch.nn.Module:
    return scaled_llama({**LLAMA3, **rope}, CONTEXT)


def logits(model, n: int, seed: int = 1) -> torch.Tensor:
    x = torch.randint(3, 90, (1, n), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x).logits


def long_frequencies(cfg) -> torch.Tensor:
    """The frequencies a composed (longrope) configuration gives past its switch length."""
    geom = R.RopeGeometry(THETA, DIM, cfg.original_max_position_embeddings)
    return R.rope_longrope(geom, cfg.factor, cfg.params, seq_len=cfg.original_max_position_embeddings + 1)[0]


# -- the rules, written out --------------------------------------------------------------------------------------


def reference_yarn(own: torch.Tensor, context: int, s: float, beta_fast=32.0, beta_slow=1.0) -> torch.Tensor:
    """YaRN's NTK-by-parts (Peng et al. 2023, sec. 3.2) on the checkpoint's own frequencies: the index where the
    turns within L cross beta (log-linear between neighbours; past the ends, along the end pair, as YaRN's closed form
    does on geometric frequencies), floored / ceiled and clamped to the head's dimensions, a linear ramp over it."""
    logs = [math.log(context * t / (2 * math.pi)) for t in own.double().tolist()]

    def index(beta):
        for i in range(len(logs) - 1):
            if logs[i] >= math.log(beta) >= logs[i + 1]:
                return i + (logs[i] - math.log(beta)) / (logs[i] - logs[i + 1])
        i = 0 if math.log(beta) > logs[0] else len(logs) - 2
        return i + (logs[i] - math.log(beta)) / (logs[i] - logs[i + 1])

    low, high = max(math.floor(index(beta_fast)), 0), min(math.ceil(index(beta_slow)), 2 * len(logs) - 1)
    out = []
    for i, theta in enumerate(own.double().tolist()):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: kept, 1: interpolated
        out.append((1 - ramp) * theta + ramp * theta / s)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("method", ["pi", "yarn"])
def test_x2_on_llama31_advertises_twice_its_context_and_halves_its_slowest_dimension(method):
    model = llama31()
    own = model.model.rotary_emb.inv_freq.clone()
    hf_posenc.patch(model, method, factor=2.0)
    cfg = hf_posenc.get_config(model)
    assert model.config.max_position_embeddings == 2 * CONTEXT  # 1024, not 2 x 64
    assert cfg.method == "longrope" and cfg.original_max_position_embeddings == CONTEXT
    new = long_frequencies(cfg)
    assert new[-1].item() == pytest.approx(own[-1].item() / 2, rel=1e-6)  # the slowest, halved again
    if method == "pi":
        assert torch.allclose(new, own / 2, rtol=1e-6, atol=0)  # every one halved
    else:
        assert new[0].item() == pytest.approx(own[0].item(), rel=1e-6)  # the fastest kept
        assert torch.allclose(new.double(), reference_yarn(own, CONTEXT, 2.0), rtol=1e-6, atol=0)
        assert cfg.params["attention_factor"] == pytest.approx(0.1 * math.log(2.0) + 1.0)
    short = R.rope_longrope(R.RopeGeometry(THETA, DIM, CONTEXT), cfg.factor, cfg.params, seq_len=CONTEXT)[0]
    assert torch.allclose(short, own, rtol=1e-6, atol=0)  # up to 512: the checkpoint's own frequencies


def test_each_rule_on_plain_frequencies_is_the_method_itself():
    """On an unscaled RoPE (context = its training length), composing is the plain method: the same rule."""
    geom = R.RopeGeometry(THETA, DIM, PRETRAINED)
    plain = R.default_inv_freq(THETA, DIM)
    knobs = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
    yarn = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
    for compose, method, params in ((R.compose_linear, R.rope_linear, {}), (R.compose_ntk, R.rope_ntk, {}),
                                    (R.compose_llama3, R.rope_llama3, knobs), (R.compose_yarn, R.rope_yarn, yarn),
                                    (R.compose_yarn, R.rope_yarn, {**yarn, "truncate": False})):
        got, attention = compose(plain, PRETRAINED, 4.0, params)
        want, want_attention = method(geom, 4.0, params)
        assert torch.allclose(got, want, rtol=1e-6, atol=0), compose.__name__
        assert attention == pytest.approx(want_attention)


@pytest.mark.parametrize("method, knobs", [("pi", {}), ("ntk", {}), ("llama3", {}), ("yarn", {"attention_factor": 1.0}),
                                           ("longrope", {"attention_factor": 1.0})])
def test_inputs_up_to_the_current_context_are_the_checkpoints_and_past_it_transformers_computes_the_same(
        method, knobs, tmp_path):
    model = llama31()
    own = model.model.rotary_emb.inv_freq.clone()
    rope = dict(model.config.rope_parameters)
    short, long = logits(model, CONTEXT), logits(model, CONTEXT + 200)
    hf_posenc.patch(model, method, factor=2.0, **knobs)
    assert (logits(model, CONTEXT) - short).abs().max().item() <= 1e-5  # the checkpoint, up to its context
    patched_long = logits(model, CONTEXT + 200)
    assert (patched_long - long).abs().max().item() > 1e-4  # past it, extended
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert plain.config.rope_parameters["rope_type"] == "longrope" and plain.config.max_position_embeddings == 1024
    assert (logits(plain, CONTEXT + 200) - patched_long).abs().max().item() <= 1e-5
    assert (logits(plain, 100) - logits(model, 100)).abs().max().item() <= 1e-5
    hf_posenc.save_pretrained(model, tmp_path / "published")  # with transformers 4's keys beside rope_parameters
    reloaded = [hf_posenc.from_pretrained(str(path), dtype=torch.float32).eval()
                for path in (tmp_path, tmp_path / "published")]
    for again in reloaded:
        assert (logits(again, CONTEXT + 200) - patched_long).abs().max().item() <= 1e-5
    for unpatched in (model, *reloaded):  # reloaded ones too: the original is the checkpoint's, not the saved longrope
        hf_posenc.unpatch(unpatched)
        assert torch.equal(unpatched.model.rotary_emb.inv_freq, own) and dict(unpatched.config.rope_parameters) == rope
        assert unpatched.config.max_position_embeddings == CONTEXT
        assert torch.equal(logits(unpatched, CONTEXT + 200), long)  # the checkpoint again, bit for bit


@pytest.mark.parametrize("build", ["llama31", "gemma3", "deepseek_v3"])  # (below): sliding layers' cache, MLA's
def test_cached_decoding_across_the_current_context_equals_recomputing(build):
    model = globals()[build]()
    context = model.config.max_position_embeddings
    hf_posenc.patch(model, "yarn", factor=2.0)
    prompt = torch.randint(3, 90, (1, context - 4), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=10, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
        for step, got in enumerate(out.logits):  # step k: the next token after context - 4 + k tokens, recomputed
            want = model(out.sequences[:, : context - 4 + step]).logits[:, -1]  # (past it: every position's long)
            assert (got - want).abs().max().item() <= 1e-5, step


def test_what_cannot_be_composed_or_would_shrink_is_refused_before_anything_changes():
    model = llama31()
    own, rope = model.model.rotary_emb.inv_freq.clone(), dict(model.config.rope_parameters)
    with pytest.raises(ValueError, match=r"already scaled \(rope_type='llama3'\), and 'dynamic_ntk' follows the "
                                         r"sequence length.*give original_max_position_embeddings"):
        hf_posenc.patch(model, "dynamic_ntk", factor=2.0)
    with pytest.raises(ValueError, match=r"yarn x2 from the original context 64 replaces the checkpoint's own scaling "
                                         r"\(rope_type='llama3'\) and would advertise 128 tokens, fewer than the 512 "
                                         r"it advertises now: give a factor of at least 8"):
        hf_posenc.patch(model, "yarn", factor=2.0, original_max_position_embeddings=PRETRAINED)
    with pytest.raises(ValueError, match="yarn's mscale / mscale_all_dim are not used on top of another scaling"):
        hf_posenc.patch(model, "yarn", factor=2.0, mscale=1.0)
    assert not hf_posenc.is_patched(model) and torch.equal(model.model.rotary_emb.inv_freq, own)
    assert dict(model.config.rope_parameters) == rope and model.config.max_position_embeddings == CONTEXT
    hf_posenc.patch(model, "yarn", factor=16.0, original_max_position_embeddings=PRETRAINED)  # replaced, as asked
    assert hf_posenc.get_config(model).method == "yarn" and model.config.max_position_embeddings == 1024


def test_a_replacement_is_announced_only_once_it_is_not_refused_and_says_what_it_advertises(caplog):
    model = llama31()
    with caplog.at_level("WARNING", logger="hf_posenc"), pytest.raises(ValueError, match="fewer than the 512"):
        hf_posenc.patch(model, "pi", factor=2.0, original_max_position_embeddings=PRETRAINED)
    assert "replaces it" not in caplog.text  # refused: nothing is replaced
    hf_posenc.patch(model, "dynamic_ntk", factor=2.0, original_max_position_embeddings=PRETRAINED)
    assert "hf_posenc replaces it with 'dynamic_ntk'" in caplog.text
    assert "it advertises 64 tokens where the checkpoint advertises 512" in caplog.text
    assert model.config.max_position_embeddings == PRETRAINED
    caplog.clear()
    hf_posenc.patch(model, "pi", factor=16.0, original_max_position_embeddings=PRETRAINED)
    assert "hf_posenc replaces it with 'pi'" in caplog.text and "advertises" not in caplog.text  # 1,024 > 512


def test_a_longrope_over_the_current_context_that_does_not_restate_the_checkpoint_is_not_taken_as_one():
    """Only the composed configuration itself (short factors = the checkpoint's own) is taken over the current
    context; other lists there would silently drop the checkpoint's scaling."""
    model = llama31()
    with pytest.raises(ValueError, match="original_max_position_embeddings=512 conflicts with the checkpoint, which "
                                         "records 64"):
        hf_posenc.patch(model, "longrope", factor=2.0, original_max_position_embeddings=CONTEXT)
    hf_posenc.patch(model, "yarn", factor=2.0)
    composed = hf_posenc.get_config(model)
    hf_posenc.unpatch(model)
    hf_posenc.patch(model, composed)  # restated, as from_pretrained re-applies it
    assert hf_posenc.get_config(model) == composed and model.config.max_position_embeddings == 2 * CONTEXT


def test_a_saved_composition_is_replaced_from_the_context_its_own_scaling_is_computed_from(tmp_path, caplog):
    """A folder saved after yarn x2 on llama3 x8 holds a longrope over 512 (the context it extended); plain RoPE
    never served 512, so a replacement starts from the 64 the llama3 under it is computed from: the same model as
    that replacement on the checkpoint before the composition, loaded by transformers or by hf_posenc."""
    base = llama31()
    hf_posenc.patch(base, "yarn", factor=2.0)
    base.save_pretrained(tmp_path / "composed")
    hf_posenc.unpatch(base)
    hf_posenc.patch(base, "yarn", factor=16.0, original_max_position_embeddings=PRETRAINED)
    expected = logits(base, 96)
    lists = {"short_factor": [1.0] * (DIM // 2), "long_factor": [float(2 * i + 1) for i in range(DIM // 2)]}
    hf_posenc.patch(base, "longrope", factor=16.0, original_max_position_embeddings=PRETRAINED, **lists)
    stated = logits(base, 96)
    for load in (AutoModelForCausalLM.from_pretrained, hf_posenc.from_pretrained):
        model = load(str(tmp_path / "composed")).eval()
        with caplog.at_level("WARNING", logger="hf_posenc"):
            hf_posenc.patch(model, "yarn", factor=2.0)  # on top: the hint names the context to replace from
        assert "To replace its scaling instead, give original_max_position_embeddings=64." in caplog.text
        caplog.clear()
        with pytest.raises(ValueError, match=r"original_max_position_embeddings=512 does not fit this checkpoint: its "
                                             r"longrope is hf_posenc's composition of yarn:factor=2 on its own "
                                             r"'llama3' scaling, computed from 64 tokens; pass "
                                             r"original_max_position_embeddings=64"):
            hf_posenc.patch(model, "yarn", factor=16.0, original_max_position_embeddings=CONTEXT)
        hf_posenc.patch(model, "yarn", factor=16.0, original_max_position_embeddings=PRETRAINED)
        assert model.config.max_position_embeddings == 1024
        assert (logits(model, 96) - expected).abs().max() <= 1e-5
        hf_posenc.patch(model, "longrope", factor=16.0, original_max_position_embeddings=PRETRAINED, **lists)
        assert (logits(model, 96) - stated).abs().max() <= 1e-5  # factors stated over the pretraining context too
    with pytest.raises(ValueError, match="fewer than the 1,024 it advertises now: give a factor of at least 16"):
        hf_posenc.patch(AutoModelForCausalLM.from_pretrained(str(tmp_path / "composed")), "yarn", factor=2.0,
                        original_max_position_embeddings=PRETRAINED)


@pytest.mark.parametrize("on_top", ["yarn", "self_extend", "replacing"])
def test_a_patch_saved_over_a_saved_composition_keeps_the_context_a_replacement_starts_from(on_top, tmp_path,
                                                                                               caplog):
    """yarn x2 saved, loaded, then yarn x2 again (a composition on the composition) or Self-Extend (which keeps it)
    and saved: the block's original is the first composition, so the block records the 64 under it (schema 4); a
    replacement still starts from 64, equal to that replacement on the checkpoint itself, and the card says so."""
    base = llama31()
    hf_posenc.patch(base, "yarn", factor=2.0)
    base.save_pretrained(tmp_path / "c1")
    hf_posenc.unpatch(base)
    method, knobs = {"yarn": ("yarn", {"factor": 2.0}), "self_extend": ("self_extend", {"group_size": 4, "window": 32}),
                     "replacing": ("yarn", {"factor": 16.0, "original_max_position_embeddings": PRETRAINED})}[on_top]
    model = hf_posenc.from_pretrained(str(tmp_path / "c1"))
    hf_posenc.patch(model, method, **knobs)
    hf_posenc.save_pretrained(model, tmp_path / "c2")
    block = json.loads((tmp_path / "c2" / "config.json").read_text())["hf_posenc"]
    assert block["pretrained_context"] == PRETRAINED and block["schema"] == 4
    if on_top != "self_extend":
        assert re.search("pretrained for 64 tokens|pretraining context of 64 tokens",
                         (tmp_path / "c2" / "README.md").read_text())
    hf_posenc.patch(base, "yarn", factor=32.0, original_max_position_embeddings=PRETRAINED)
    expected = logits(base, 96)
    for load in (AutoModelForCausalLM.from_pretrained, hf_posenc.from_pretrained):
        caplog.clear()
        with caplog.at_level("WARNING", logger="hf_posenc"):
            again = load(str(tmp_path / "c2")).eval()
        if on_top == "yarn":  # the composition re-applied is not announced as a replacement
            assert "replaces it" not in caplog.text
        with pytest.raises(ValueError, match="(computed from|records) 64 "):
            hf_posenc.patch(again, "yarn", factor=32.0, original_max_position_embeddings=CONTEXT)
        hf_posenc.patch(again, "yarn", factor=32.0, original_max_position_embeddings=PRETRAINED)
        assert (logits(again, 96) - expected).abs().max() <= 1e-5
        # a patch replacing that one starts from the same model, loaded either way: still 64, never 512
        with pytest.raises(ValueError, match="(computed from|records) 64 "):
            hf_posenc.patch(again, "yarn", factor=4.0, original_max_position_embeddings=CONTEXT)
        hf_posenc.unpatch(again)
        hf_posenc.patch(again, "yarn", factor=32.0, original_max_position_embeddings=PRETRAINED)
        assert (logits(again, 96) - expected).abs().max() <= 1e-5


def deepseek_v3() -> torch.nn.Module:
    """A tiny DeepSeek-V3 (MLA) as it ships: YaRN x40 over 16, advertising 640, its softmax scale (0.1 ln 40 + 1)^2
    times qk_head_dim^-0.5 (mscale_all_dim 1)."""
    torch.manual_seed(0)
    rope = {"rope_type": "yarn", "rope_theta": THETA, "factor": 40.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    cfg = AutoConfig.for_model("deepseek_v3", vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4, qk_rope_head_dim=8, qk_nope_head_dim=8,
                               v_head_dim=8, kv_lora_rank=16, q_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2,
                               first_k_dense_replace=1, n_group=1, topk_group=1, moe_intermediate_size=32,
                               max_position_embeddings=640, rope_parameters=rope)
    return AutoModelForCausalLM.from_config(cfg).eval()


def test_on_mla_the_method_extends_the_yarn_and_keeps_the_checkpoints_softmax_scale(tmp_path):
    model = deepseek_v3()
    attn = model.model.layers[0].self_attn
    scale, own = attn.scaling, model.model.rotary_emb.inv_freq.clone()
    assert scale == pytest.approx(16 ** -0.5 * (0.1 * math.log(40) + 1) ** 2)  # the checkpoint's, as shipped
    short, long = logits(model, 640), logits(model, 700)
    hf_posenc.patch(model, "yarn", factor=2.0, attention_factor=1.0)
    cfg = hf_posenc.get_config(model)
    assert cfg.method == "longrope" and model.config.max_position_embeddings == 1280
    assert attn.scaling == pytest.approx(scale, rel=1e-12)  # kept: not the plain qk_head_dim^-0.5
    base = 1.0 / (THETA ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    want = reference_yarn(own.double(), 640, 2.0)  # YaRN on its x40 frequencies over the 640 it advertises
    assert torch.allclose(base / torch.tensor(cfg.params["long_factor"], dtype=torch.float64), want, rtol=1e-6)
    assert (logits(model, 640) - short).abs().max().item() <= 1e-5  # up to its context: the checkpoint
    patched_long = logits(model, 700)
    assert (patched_long - long).abs().max().item() > 1e-4
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert plain.config.rope_parameters["rope_type"] == "longrope"
    assert plain.model.layers[0].self_attn.scaling == pytest.approx(scale, rel=1e-12)
    assert (logits(plain, 700) - patched_long).abs().max().item() <= 1e-5
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert (logits(again, 700) - patched_long).abs().max().item() <= 1e-5
    for unpatched in (model, again):
        hf_posenc.unpatch(unpatched)
        assert unpatched.model.layers[0].self_attn.scaling == scale
        assert torch.equal(logits(unpatched, 700), long)


def test_the_model_card_says_the_checkpoint_was_scaled_and_whether_it_was_extended_or_replaced():
    from hf_posenc.publishing.card import build_model_card

    model = llama31()
    hf_posenc.patch(model, "yarn", factor=2.0)
    assert ("Its RoPE was already scaled (llama3, pretrained for 64 tokens) to a context of 512 tokens; the patch "
            "(yarn:factor=2) extends it from there, and its configuration now allows 1024.") \
        in str(build_model_card(model))
    hf_posenc.unpatch(model)
    hf_posenc.patch(model, "yarn", factor=16.0, original_max_position_embeddings=PRETRAINED)
    assert ("Its RoPE was already scaled (llama3); the patch replaced that scaling, scaling from its pretraining "
            "context of 64 tokens, and its configuration now allows 1024.") in str(build_model_card(model))


def test_the_cards_serving_table_says_cannot_where_its_launch_settings_do():
    """A composition is a longrope of two lists, which a GGUF cannot hold: the table of what engines compute (from
    the method's record) says so for llama.cpp and Ollama, as the launch settings of the same card do."""
    from hf_posenc.publishing.card import build_model_card

    card = str(build_model_card(hf_posenc.patch(llama31(), "yarn", factor=2.0)))
    for engine in ("llama.cpp", "Ollama"):
        assert f"**{engine}: cannot.**" in card
        row = next(line for line in card.splitlines() if line.startswith(f"| {engine} |"))
        assert row.startswith(f"| {engine} | cannot compute it |") and "a GGUF holds one set" in row
    vllm = next(line for line in card.splitlines() if line.startswith("| vLLM |"))
    assert "cannot" not in vllm.split("|")[2]  # an engine whose launch computes it keeps its record's row


def test_a_composition_on_a_longrope_checkpoint_is_carded_as_extending_it_from_the_context_it_served():
    from hf_posenc.publishing.card import build_model_card

    model = hf_posenc.patch(phi3(), "yarn", factor=2.0)
    assert ("Its RoPE was already scaled (longrope, pretrained for 64 tokens) to a context of 256 tokens; the patch "
            "(yarn:factor=2) extends it from there, and its configuration now allows 512.") \
        in str(build_model_card(model))


# -- on a LongRoPE checkpoint (Phi-3's 128k: short factors up to its original context, long ones past it) ------------
LONGROPE = {"rope_type": "longrope", "rope_theta": THETA, "original_max_position_embeddings": PRETRAINED,
            "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5], "long_factor": [1.0, 1.5, 2, 3, 4, 5, 6, 8]}
PHI3_CONTEXT = 4 * PRETRAINED  # 256: what its long factors are trained for


def phi3(**over) -> torch.nn.Module:
    return scaled_llama({**LONGROPE, **over}, PHI3_CONTEXT)


def test_on_a_longrope_checkpoint_the_method_extends_its_long_factors_and_keeps_its_short_ones(tmp_path):
    model = phi3()
    base = 1.0 / (THETA ** (torch.arange(0, DIM, 2, dtype=torch.float64) / DIM))
    own_long = base / torch.tensor(LONGROPE["long_factor"], dtype=torch.float64)
    own_attention = math.sqrt(1 + math.log(PHI3_CONTEXT / PRETRAINED) / math.log(PRETRAINED))
    short, between = logits(model, PRETRAINED), logits(model, PRETRAINED + 100)
    hf_posenc.patch(model, "yarn", factor=2.0, attention_factor=1.0)
    cfg = hf_posenc.get_config(model)
    assert cfg.method == "longrope" and cfg.original_max_position_embeddings == PRETRAINED
    assert model.config.max_position_embeddings == 2 * PHI3_CONTEXT
    assert cfg.params["short_factor"] == LONGROPE["short_factor"]  # its own, up to its original context
    want = reference_yarn(own_long, PHI3_CONTEXT, 2.0)  # YaRN on its long frequencies over the context it advertises
    assert torch.allclose(base / torch.tensor(cfg.params["long_factor"], dtype=torch.float64), want, rtol=1e-6)
    assert cfg.params["attention_factor"] == pytest.approx(own_attention)
    assert (logits(model, PRETRAINED) - short).abs().max().item() <= 1e-5  # up to its switch: the checkpoint
    assert (logits(model, PRETRAINED + 100) - between).abs().max().item() > 1e-4  # its long side: extended
    # plain transformers computes the saved checkpoint the same; hf_posenc reloads it; unpatch gives it back
    patched_long = logits(model, 2 * PHI3_CONTEXT - 10)
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert plain.config.rope_parameters["rope_type"] == "longrope"
    assert (logits(plain, 2 * PHI3_CONTEXT - 10) - patched_long).abs().max().item() <= 1e-5
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert (logits(again, 2 * PHI3_CONTEXT - 10) - patched_long).abs().max().item() <= 1e-5
    hf_posenc.unpatch(model)
    assert torch.equal(logits(model, PRETRAINED + 100), between)
    assert model.config.max_position_embeddings == PHI3_CONTEXT


def test_on_a_longrope_checkpoint_yarns_attention_factor_multiplies_its_own():
    model = phi3()
    hf_posenc.patch(model, "yarn", factor=2.0)
    own_attention = math.sqrt(1 + math.log(PHI3_CONTEXT / PRETRAINED) / math.log(PRETRAINED))
    assert hf_posenc.get_config(model).params["attention_factor"] == pytest.approx(
        own_attention * (0.1 * math.log(2.0) + 1))


# -- on per-layer-type RoPE (Gemma 3: linear x8 on the global layers, plain RoPE on the sliding ones) ----------------
GLOBAL_THETA, LOCAL_THETA, GEMMA_DIM = 1_000_000.0, 10_000.0, 32


def gemma3() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "gemma3_text", vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, head_dim=GEMMA_DIM, sliding_window=32, sliding_window_pattern=3,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"], max_position_embeddings=CONTEXT,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": FACTOR, "rope_theta": GLOBAL_THETA},
                         "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_THETA}})
    return AutoModelForCausalLM.from_config(cfg).eval()


def test_on_gemma3_the_method_extends_the_scaled_global_layers_and_leaves_the_sliding_ones(tmp_path):
    model = gemma3()
    rotary = model.model.rotary_emb
    own_global, own_local = rotary.full_attention_inv_freq.clone(), rotary.sliding_attention_inv_freq.clone()
    rope = {k: dict(v) for k, v in model.config.rope_parameters.items()}
    short, long = logits(model, CONTEXT), logits(model, CONTEXT + 150)
    hf_posenc.patch(model, "yarn", factor=2.0, attention_factor=1.0)
    cfg = hf_posenc.get_config(model)
    assert cfg.method == "longrope" and cfg.params["layer_types"] == ["full_attention"]
    assert model.config.max_position_embeddings == 2 * CONTEXT
    base = 1.0 / (GLOBAL_THETA ** (torch.arange(0, GEMMA_DIM, 2, dtype=torch.float64) / GEMMA_DIM))
    assert torch.allclose(base / torch.tensor(cfg.params["short_factor"], dtype=torch.float64), base / FACTOR)
    want = reference_yarn(base / FACTOR, CONTEXT, 2.0)  # YaRN on the global layers' x8 frequencies over 512
    assert torch.allclose(base / torch.tensor(cfg.params["long_factor"], dtype=torch.float64), want, rtol=1e-6)
    assert model.config.rope_parameters["sliding_attention"] == rope["sliding_attention"]
    assert torch.equal(rotary.sliding_attention_inv_freq, own_local)
    assert (logits(model, CONTEXT) - short).abs().max().item() <= 1e-5  # up to its context: the checkpoint
    patched_long = logits(model, CONTEXT + 150)
    assert (patched_long - long).abs().max().item() > 1e-4  # past it, the global layers extended
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert plain.config.rope_parameters["full_attention"]["rope_type"] == "longrope"
    assert (logits(plain, CONTEXT + 150) - patched_long).abs().max().item() <= 1e-5
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert (logits(again, CONTEXT + 150) - patched_long).abs().max().item() <= 1e-5
    for unpatched in (model, again):
        hf_posenc.unpatch(unpatched)
        assert torch.equal(unpatched.model.rotary_emb.full_attention_inv_freq, own_global)
        assert {k: dict(v) for k, v in unpatched.config.rope_parameters.items()} == rope
        assert torch.equal(logits(unpatched, CONTEXT + 150), long)


def test_on_gemma3_a_composition_over_differing_layer_types_is_refused_naming_what_the_patch_takes():
    model = gemma3()
    own = model.model.rotary_emb.full_attention_inv_freq.clone()
    with pytest.raises(ValueError, match=r"the layer types 'yarn' would change \(full_attention: rope_type='linear', "
                                         r"sliding_attention: rope_type='default'\) differ.*layer_types="
                                         r"\['full_attention'\].*original_max_position_embeddings=512"):
        hf_posenc.patch(model, "yarn", factor=2.0, layer_types=["full_attention", "sliding_attention"])
    assert not hf_posenc.is_patched(model) and torch.equal(model.model.rotary_emb.full_attention_inv_freq, own)


def test_on_gemma3_the_card_and_eval_say_the_global_layers_were_scaled_and_extended():
    from hf_posenc.eval.variants import applied_now
    from hf_posenc.publishing.card import build_model_card

    model = gemma3()
    hf_posenc.patch(model, "yarn", factor=2.0)
    assert ("Its RoPE was already scaled (linear) to a context of 512 tokens; the patch (yarn:factor=2) extends it "
            "from there, and its configuration now allows 1024.") in str(build_model_card(model))
    own = applied_now(model)["own_scaling"]
    assert own["rope_type"] == "linear" and own["context"] == CONTEXT and not own["replaced"]


def test_on_gemma3_serve_config_reads_the_changed_layer_types_rope(tmp_path):
    from hf_posenc.serving.launch_settings import serve_config

    model = gemma3()
    hf_posenc.patch(model, "yarn", factor=2.0)
    hf_posenc.save_pretrained(model, tmp_path)
    launches = {launch.engine: launch for launch in serve_config(str(tmp_path), ["sglang", "tgi", "llama.cpp"])}
    assert "rope_type 'longrope'" in launches["SGLang"].reason  # the global layers', not the flat lookup's 'default'
    assert any("one RoPE per layer type (full_attention, sliding_attention" in n for n in launches["SGLang"].notes)
    assert launches["TGI"].computes == "cannot" and "rope_type 'longrope'), but its longrope" in launches["TGI"].reason
    # llama.cpp: a composition's two factor lists, switched by the length of each input, fit no GGUF of any
    # architecture (one set of rope_freqs; Phi-3's two tensors are picked once, by the context size): refused, not
    # left "not measured" for want of knowing how llama.cpp's converter writes a Gemma 3
    assert launches["llama.cpp"].computes == "cannot", launches["llama.cpp"].reason
    assert "longrope switches from its short to its long factors" in launches["llama.cpp"].reason
    hf_posenc.patch(model, "yarn", factor=2.0, layer_types=["sliding_attention"], original_max_position_embeddings=64)
    hf_posenc.save_pretrained(model, tmp_path / "plain_layers")  # one list (a yarn): only the architecture is unknown
    launch = serve_config(str(tmp_path / "plain_layers"), ["llama.cpp"])[0]
    assert launch.computes == "not measured" and "gemma3_text" in launch.reason, launch.reason


def test_on_mla_extended_twice_the_softmax_scale_stays_the_checkpoints(tmp_path):
    """A composed DeepSeek saved natively is a longrope checkpoint: extending it again (over its switch) keeps the
    softmax scale it shipped with, as the first extension did."""
    model = deepseek_v3()
    scale = model.model.layers[0].self_attn.scaling
    hf_posenc.patch(model, "yarn", factor=2.0)
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert again.model.layers[0].self_attn.scaling == pytest.approx(scale, rel=1e-12)
    hf_posenc.patch(again, "yarn", factor=2.0)
    assert again.config.max_position_embeddings == 4 * 640
    assert again.model.layers[0].self_attn.scaling == pytest.approx(scale, rel=1e-12)


def test_on_mla_serve_config_says_what_the_engines_do_with_the_kept_softmax_scale(tmp_path):
    from hf_posenc.serving.launch_settings import serve_config

    model = deepseek_v3()
    hf_posenc.patch(model, "yarn", factor=2.0)
    hf_posenc.save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["rope_parameters"]["mscale_all_dim"] == pytest.approx(
        math.log(40) / math.log(2))
    launches = {launch.engine: launch for launch in serve_config(str(tmp_path), ["vllm", "sglang"])}
    assert launches["vLLM"].computes == "cannot"
    assert any("carries mscale_all_dim" in n for n in launches["SGLang"].notes)


@pytest.mark.parametrize("max_position", [PRETRAINED, PRETRAINED + 16])  # Qwen2.5's 32,768; Qwen3's 40,960
def test_a_qwen_style_yarn_left_at_the_pretraining_max_position_extends_from_what_its_yarn_serves(max_position):
    """Qwen's recipe adds YaRN x4 over the pretraining context and leaves max_position_embeddings there: the
    checkpoint serves 4 x 64 = 256 tokens (transformers computes those frequencies at every length), so x2 on top
    gives 512, a replacement from 64 must reach 256, and an attention-level method extends from 256."""
    yarn4 = {"rope_type": "yarn", "rope_theta": THETA, "factor": 4.0, "original_max_position_embeddings": PRETRAINED}
    served = 4 * PRETRAINED
    model = scaled_llama(yarn4, max_position)
    own, inside = model.model.rotary_emb.inv_freq.clone(), logits(model, served)
    hf_posenc.patch(model, "yarn", factor=2.0, attention_factor=1.0)
    cfg = hf_posenc.get_config(model)
    assert cfg.original_max_position_embeddings == served and model.config.max_position_embeddings == 2 * served
    assert long_frequencies(cfg)[-1].item() == pytest.approx(own[-1].item() / 2, rel=1e-6)
    assert (logits(model, served) - inside).abs().max().item() <= 1e-5  # up to 256: the checkpoint's
    hf_posenc.unpatch(model)
    with pytest.raises(ValueError, match=rf"would advertise 128 tokens, fewer than the {served} it advertises now"):
        hf_posenc.patch(model, "yarn", factor=2.0, original_max_position_embeddings=PRETRAINED)
    hf_posenc.patch(model, "dca", chunk_size=96, local_window=32)
    assert hf_posenc.get_config(model).original_max_position_embeddings == served


def test_a_longrope_on_top_keeps_the_cache_asked_and_refuses_short_factors_it_would_not_use():
    model = llama31()
    with pytest.raises(ValueError, match=r"already scaled \(rope_type='llama3'\): 'longrope' on top of it keeps the "
                                         r"checkpoint's own frequencies for inputs up to its context of 512, so its "
                                         r"short factors are the checkpoint's and short_factor cannot be given"):
        hf_posenc.patch(model, "longrope", factor=2.0, short_factor=[3.0] * 8, long_factor=[2.0] * 8)
    assert not hf_posenc.is_patched(model)
    hf_posenc.patch(model, "longrope", factor=2.0, long_factor=[2.0] * 8, cache="stale")
    assert hf_posenc.get_config(model).params["cache"] == "stale"
    hf_posenc.unpatch(model)
    hf_posenc.patch(model, "yarn", factor=2.0)  # (yarn takes no cache: the length-dependent scalings' default)
    assert hf_posenc.get_config(model).params["cache"] == "consistent"


def test_a_model_cast_to_bfloat16_composes_from_its_fp32_frequencies():
    """``model.to(torch.bfloat16)`` casts the rotary buffer; the composition's saved factors stay those of the fp32
    frequencies its config gives (not 4e-3 off, as factors read from the cast buffer were)."""
    want = hf_posenc.get_config(hf_posenc.patch(llama31(), "yarn", factor=2.0))
    cast = llama31().to(torch.bfloat16)
    assert cast.model.rotary_emb.inv_freq.dtype == torch.bfloat16
    got = hf_posenc.get_config(hf_posenc.patch(cast, "yarn", factor=2.0))
    assert got.params["short_factor"] == want.params["short_factor"]
    assert got.params["long_factor"] == want.params["long_factor"]


@pytest.mark.parametrize("method, knobs", [("none", {}), ("self_extend", {"group_size": 4, "window": 32})])
def test_a_patch_that_keeps_the_checkpoints_scaling_is_not_carded_as_replacing_it(method, knobs):
    from hf_posenc.eval.variants import applied_now
    from hf_posenc.publishing.card import build_model_card

    model = hf_posenc.patch(llama31(), method, **knobs)
    assert "replaced that scaling" not in str(build_model_card(model))
    assert applied_now(model)["own_scaling"] is None


def test_a_longrope_checkpoint_cast_to_bfloat16_still_composes():
    want = hf_posenc.get_config(hf_posenc.patch(phi3(), "pi", factor=2.0))
    got = hf_posenc.get_config(hf_posenc.patch(phi3().to(torch.bfloat16), "pi", factor=2.0))
    assert got.params["long_factor"] == want.params["long_factor"]
