"""Family swaps on RoPE decoders (alibi, nope, sinusoidal, learned), checked against a plain eager
re-implementation of the decoder written here, independently of transformers' attention code."""

import math

import pytest
import torch
from helpers import ORIGINAL, ids, logits, tiny_model, written_out_decoder

import hf_posenc
from hf_posenc.adapters.cache_argument import returned_cache, with_cache
from hf_posenc.encodings import absolute as A
from hf_posenc.encodings.alibi import alibi_slopes

SWAP_KW = {"alibi": {}, "nope": {}, "sinusoidal": {"factor": 2.0}, "learned": {"factor": 2.0}}


def reference(model, input_ids, attention_mask=None, slopes=None, add_pos=None):
    """A decoder without RoPE, with optional ALiBi slopes and absolute position vectors added to the
    embeddings: softmax(q k^T / sqrt(d) - slope * |i - j|) over allowed keys."""
    t = input_ids.shape[1]
    pos = torch.arange(t)
    bias = 0.0 if slopes is None else -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs().float()
    allowed = None if attention_mask is None else attention_mask[:, None, None, :].bool()
    return written_out_decoder(model, input_ids, lambda q, k, d: q @ k.transpose(-1, -2) / math.sqrt(d) + bias,
                               add_pos, allowed)


def sdpa_model(family="llama", **kw):
    m = tiny_model(family, **kw)
    m.config._attn_implementation = "sdpa"
    return m


def test_alibi_slopes_as_in_press_et_al():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    twelve = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
    assert torch.allclose(alibi_slopes(12), torch.tensor(twelve))
    assert alibi_slopes(1).tolist() == [2.0 ** -8]


def use_blocks(model, block: int | None) -> None:
    """Query blocks of ``block`` rows, and with a padding mask the blockwise path; None: one block
    without padding, the shared full mask with it."""
    state = model.model.layers[0].self_attn._hf_posenc_alibi  # one state, shared by all layers
    state.block, state.full_limit = (block, 0) if block else (10**6, 2**28)


@pytest.mark.parametrize("family,block", [("llama", 16), ("qwen2", None), ("qwen3", 7), ("mistral", 256)])
def test_alibi_without_padding_matches_the_reference(family, block):
    """No padding mask: the bias is a strided view over one line per head, the keys reversed, the queries
    in causal blocks (block sizes that divide the length, that do not, and one block)."""
    model = hf_posenc.patch(sdpa_model(family), "alibi")
    use_blocks(model, block)
    x = ids(90, batch=2)
    want = reference(model, x, slopes=alibi_slopes(model.config.num_attention_heads))
    assert (logits(model, x) - want).abs().max().item() <= 1e-5


class _Module:
    is_causal = True


@pytest.mark.parametrize("causal,past,block,kv_heads", [(True, 0, 5, 2), (True, 13, 4, 6), (True, 0, 64, 1),
                                                         (False, 0, 5, 3)])
def test_hankel_path_equals_the_full_mask_path_with_gradients(causal, past, block, kv_heads):
    """Outputs and gradients of the two ALiBi paths agree: no mask (strided bias, reversed keys, causal
    blocks) and an all-True padding mask (the explicit additive mask), with grouped heads and a cache."""
    from hf_posenc.adapters.alibi_attention import STATE_ATTR, AlibiState, alibi_attention

    torch.manual_seed(0)
    h, q, d = 6, 23, 8
    module = _Module()
    state = AlibiState(alibi_slopes(h), block=block, causal=causal)
    state.past = past
    module.__dict__[STATE_ATTR] = state
    inputs = [torch.randn(2, h, q, d), torch.randn(2, kv_heads, past + q, d), torch.randn(2, kv_heads, past + q, d)]
    results = []
    for mask in (None, torch.ones(2, 1, q, past + q, dtype=torch.bool)):
        qkv = [t.clone().requires_grad_() for t in inputs]
        out, _ = alibi_attention(module, *qkv, mask, scaling=d**-0.5)
        out.square().sum().backward()
        results.append([out] + [t.grad for t in qkv])
    if causal:  # and both are ALiBi: written out here
        pos_q, pos_k = torch.arange(past, past + q), torch.arange(past + q)
        rel = (pos_q[:, None] - pos_k[None, :]).float()
        k, v = (t.repeat_interleave(h // kv_heads, 1) for t in inputs[1:])
        s = inputs[0] @ k.transpose(-1, -2) * d**-0.5 - alibi_slopes(h)[:, None, None] * rel
        want = torch.softmax(s.masked_fill(rel < 0, float("-inf")), -1) @ v
        assert (results[0][0].transpose(1, 2) - want).abs().max().item() <= 1e-5
    for a, b in zip(*results):
        assert (a - b).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family,block", [("llama", 16), ("qwen2", None), ("qwen3", 7), ("mistral", None)])
def test_alibi_matches_the_reference_with_gqa_and_padding(family, block):
    model = hf_posenc.patch(sdpa_model(family), "alibi")
    assert model.config._attn_implementation == "hf_posenc_alibi"
    use_blocks(model, block)
    x = ids(90, batch=2)
    mask = torch.ones(2, 90, dtype=torch.long)
    mask[1, :25] = 0  # left padding in the second row
    slopes = alibi_slopes(model.config.num_attention_heads)
    got = model(x, attention_mask=mask).logits
    want = reference(model, x, mask, slopes)
    assert (got[0] - want[0]).abs().max().item() <= 1e-5
    assert (got[1, 25:] - want[1, 25:]).abs().max().item() <= 1e-5
    eager = tiny_model(family)  # eager attention: ALiBi as one full additive mask per call
    eager.config._attn_implementation = "eager"
    hf_posenc.patch(eager, "alibi")
    assert (eager(x, attention_mask=mask).logits[0] - got[0]).abs().max().item() <= 1e-5
    assert (eager(x, attention_mask=mask).logits[1, 25:] - got[1, 25:]).abs().max().item() <= 1e-5


def _decoded_last_logits(model, x, prompt: int) -> torch.Tensor:
    with torch.no_grad():
        out = model(x[:, :prompt], use_cache=True)
        steps = [out.logits[:, -1]]
        cache = returned_cache(out)
        for i in range(prompt, x.shape[1]):
            out = model(x[:, i : i + 1], **with_cache(model, cache), use_cache=True)
            cache = returned_cache(out)
            steps.append(out.logits[:, -1])
    return torch.stack(steps[:-1], 1)


def test_alibi_kv_cache_and_generate_agree_with_the_full_forward():
    model = hf_posenc.patch(sdpa_model("llama"), "alibi")
    use_blocks(model, 8)
    x = ids(40)
    full = logits(model, x)
    assert (_decoded_last_logits(model, x, 30) - full[:, 29:39]).abs().max().item() <= 1e-5
    eager = tiny_model("llama")  # eager attention: the layer hook builds the mask at the cached offset
    eager.config._attn_implementation = "eager"
    hf_posenc.patch(eager, "alibi")
    assert (_decoded_last_logits(eager, x, 30) - logits(eager, x)[:, 29:39]).abs().max().item() <= 1e-5
    prompt = ids(20, seed=4, batch=2)
    gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    assert torch.equal(logits(model, gen)[:, 19:-1].argmax(-1), gen[:, 20:])
    # a left-padded row generates what the same prompt generates alone
    padded, mask = prompt.clone(), torch.ones_like(prompt)
    padded[1, :6], mask[1, :6] = 0, 0
    together = model.generate(padded, attention_mask=mask, max_new_tokens=12, do_sample=False)
    alone = model.generate(prompt[1:, 6:], attention_mask=mask[1:, 6:], max_new_tokens=12, do_sample=False)
    assert torch.equal(together[1, 20:], alone[0, 14:])
    use_blocks(model, None)  # the shared full mask gives the same
    assert torch.equal(model.generate(padded, attention_mask=mask, max_new_tokens=12, do_sample=False), together)


def test_nope_and_absolute_swaps_match_the_reference():
    model = sdpa_model("qwen2")
    x = ids(100)
    hf_posenc.patch(model, "nope")
    assert (logits(model, x) - reference(model, x)).abs().max().item() <= 1e-5
    for method in ("sinusoidal", "learned"):
        hf_posenc.patch(model, method, factor=2.0)
        cfg = hf_posenc.get_config(model)
        table = A.sinusoid_table(100, model.config.hidden_size) * cfg.params["scale"]
        assert model.config.max_position_embeddings == 2 * ORIGINAL
        assert (logits(model, x) - reference(model, x, add_pos=table[None])).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="past the learned table"):
        logits(model, ids(2 * ORIGINAL + 1))


@pytest.mark.parametrize("method", list(SWAP_KW))
def test_swaps_save_load_and_unpatch(tmp_path, method):
    model = hf_posenc.patch(sdpa_model("mistral"), method, **SWAP_KW[method])
    if method == "learned":  # as if trained: the saved values, not the initial sinusoid, must come back
        with torch.no_grad():
            model.model.hf_posenc_positions.weight.add_(0.01 * torch.randn_like(model.model.hf_posenc_positions.weight))
    model.save_pretrained(tmp_path)
    again = hf_posenc.from_pretrained(str(tmp_path), attn_implementation="sdpa").eval()
    x = ids(110)
    assert (logits(again, x) - logits(model, x)).abs().max().item() <= 1e-6
    assert hf_posenc.get_config(again) == hf_posenc.get_config(model)
    hf_posenc.unpatch(model)
    assert (logits(model, x) - logits(sdpa_model("mistral"), x)).abs().max().item() == 0.0
    assert not hasattr(model.model, "hf_posenc_positions")


def test_swaps_are_trainable():
    for method in SWAP_KW:
        model = hf_posenc.patch(sdpa_model("llama"), method, **SWAP_KW[method]).train()
        x = ids(60)
        model(x, labels=x).loss.backward()
        q = model.model.layers[0].self_attn.q_proj.weight
        assert q.grad is not None and q.grad.abs().sum() > 0, method
        if method == "learned":
            table = model.model.hf_posenc_positions.weight
            assert table.requires_grad and table.grad[:60].abs().sum() > 0 and table.grad[60:].abs().sum() == 0


def test_swap_errors_and_isolation():
    model, other = sdpa_model("llama"), sdpa_model("llama")
    x = ids(50)
    before = logits(other, x)
    hf_posenc.patch(model, "alibi")
    assert torch.equal(logits(other, x), before) and other.config._attn_implementation == "sdpa"
    hf_posenc.unpatch(model)
    assert model.config._attn_implementation == "sdpa" and torch.equal(logits(model, x), before)
    hf_posenc.patch(model, "alibi")
    with pytest.raises(ValueError, match="takes no factor"):
        hf_posenc.patch(other, "alibi", factor=2.0)
    other.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="alibi needs an attention implementation it can replace \\(sdpa or eager\\); "
                                         "this model uses"):
        hf_posenc.patch(other, "alibi")
    assert not hf_posenc.is_patched(other)


def test_learned_and_sinusoidal_knobs_are_checked_alike():
    for method in ("learned", "sinusoidal"):
        with pytest.raises(ValueError, match="base must be a finite number > 0, got -1"):
            hf_posenc.PosEncConfig(method, params={"base": -1})
        with pytest.raises(ValueError, match="scale must be a finite number > 0, got 0"):
            hf_posenc.PosEncConfig(method, params={"scale": 0})


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_alibi_leaves_nope_layers_without_positions(impl):
    """SmolLM3's NoPE layer (no_rope_layers 0) had no positions before the swap and has none after it: ALiBi
    biases the layers that rotated only (the reference biases layers 0 and 2, not 1)."""
    model = tiny_model("smollm3", num_hidden_layers=3, no_rope_layers=[1, 0, 1], pad_token_id=0, bos_token_id=1,
                       eos_token_id=2)
    model.config._attn_implementation = impl
    model = hf_posenc.patch(model, "alibi")
    slopes, x = alibi_slopes(model.config.num_attention_heads), ids(40)
    pos = torch.arange(x.shape[1])
    bias = -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs().float()
    layer = iter(range(3))

    def scores(q, k, d):
        return q @ k.transpose(-1, -2) / math.sqrt(d) + (0.0 if next(layer) == 1 else bias)

    want = written_out_decoder(model, x, scores)
    assert (logits(model, x) - want).abs().max().item() <= 1e-5
    assert (want - reference(model, x, slopes=slopes)).abs().max().item() > 1e-3  # biasing layer 1 too differs


def test_alibi_probes_each_layer_for_nope_once_per_patch(monkeypatch):
    """The flags its check probed (to refuse a model with no rotating layer) are the ones installed: each layer's
    probe (two attention forwards) runs once per patch; patching again, after unpatch, probes again."""
    from hf_posenc.adapters import decoder_swaps

    probed = []
    real = decoder_swaps.rotates
    monkeypatch.setattr(decoder_swaps, "rotates", lambda attn, *a: probed.append(attn) or real(attn, *a))
    model = tiny_model("smollm3", num_hidden_layers=3, no_rope_layers=[1, 0, 1], pad_token_id=0, bos_token_id=1,
                       eos_token_id=2)
    layers = [layer.self_attn for layer in model.model.layers]
    hf_posenc.patch(model, "alibi")
    assert len(probed) == 3 and all(a is b for a, b in zip(probed, layers))
    hf_posenc.unpatch(model)
    hf_posenc.patch(model, "alibi")
    assert len(probed) == 6


def test_alibi_on_a_model_without_rope_is_refused_by_name():
    model = tiny_model("smollm3", no_rope_layers=[0, 0], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with pytest.raises(ValueError, match="no layer of model_type='smollm3' rotates \\(every one is NoPE\\)"):
        hf_posenc.patch(model, "alibi")
    assert hf_posenc.get_config(model) is None


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_alibi_nope_layers_run_the_models_own_attention_with_padding(impl):
    """With a padding mask, the NoPE layer runs the model's own attention on the model's own mask (it used to build
    a second, bias-free copy of the ALiBi mask, doubling its memory): left-padded rows equal the same rows alone."""
    from hf_posenc.adapters.alibi_attention import STATE_ATTR

    model = tiny_model("smollm3", num_hidden_layers=3, no_rope_layers=[1, 0, 1], pad_token_id=0, bos_token_id=1,
                       eos_token_id=2)
    model.config._attn_implementation = impl
    model = hf_posenc.patch(model, "alibi")
    states = [layer.self_attn.__dict__.get(STATE_ATTR) for layer in model.model.layers]
    x = ids(30, batch=2)
    mask = torch.ones_like(x)
    mask[1, :7] = 0
    with torch.no_grad():
        both = model(x, attention_mask=mask).logits
        alone = model(x[1:, 7:]).logits
    assert (both[1, 7:] - alone[0]).abs().max().item() <= 1e-5
    if impl == "sdpa":
        assert states[1].flat and states[1]._mask is None and not states[0].flat and states[0]._mask is not None
    else:
        assert len(model.model.layers[1]._forward_pre_hooks) < len(model.model.layers[0]._forward_pre_hooks)
