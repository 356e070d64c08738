"""The remapped-position methods (self_extend, rerope, leaky_rerope, string, dca) against a decoder written out
here: the full [query x key] matrix of remapped relative positions r(i, j) is built from each paper's formula,
every raw query is rotated by r(i, j) against its raw key (RoPE's score depends on i - j only), one softmax."""

import math

import pytest
import torch
from helpers import ORIGINAL, THETA, cached_last_logits, ids, logits, tiny_config, tiny_model, written_out_decoder

import hf_posenc
from hf_posenc.adapters.cache_argument import with_cache

L = ORIGINAL
KNOBS = {  # small windows, so that 200 tokens cross every boundary of every method
    "self_extend": {"group_size": 4, "window": 16},
    "rerope": {"window": 24},
    "leaky_rerope": {"window": 16, "leak": 3.0},
    "string": {"shifted_offset": 21, "local_window": 5},
    "dca": {"chunk_size": 48, "local_window": 4},
}


def relative(method, p, i, j):
    """r(i, j) as each paper writes it (i, j: [t, 1] and [1, t] position grids)."""
    d = i - j
    if method == "self_extend":
        g, w = p["group_size"], p["window"]
        return torch.where(d < w, d, (i // g + w - w // g) - j // g).double()
    if method == "rerope":
        return d.clamp(max=p["window"]).double()
    if method == "leaky_rerope":
        w, k = p["window"], p["leak"]
        return torch.where(d < w, d.double(), w + (d - w) / k)
    if method == "string":
        s, w = p["shifted_offset"], p["local_window"]
        return torch.where(d < s, d, d - s + w).double()
    if method == "dca":
        s, w = p["chunk_size"], p["local_window"]
        c = s - w
        same, previous = i // c == j // c, j // c == i // c - 1
        succ = c + (i % c).clamp(max=w) - j % c
        return torch.where(same, d, torch.where(previous, succ, s - j % c)).double()
    raise AssertionError(method)


def reference(model, input_ids, method, p, allowed=None, start=0, decoder=written_out_decoder):
    """The written-out decoder; ``start``: the position of the first token (a left-padded row's pads count -start)."""
    t = input_ids.shape[1]
    pos = torch.arange(t) - start
    rel = relative(method, p, pos[:, None], pos[None, :])  # [t, t]
    query_scale = torch.ones(t, dtype=torch.float64)
    if method in ("rerope", "leaky_rerope") and p.get("logn_scaling", True):
        query_scale = (torch.log(pos.clamp(min=0).double() + 1) / math.log(L)).clamp(min=1)
    factor = p.get("attention_factor", 0.1 * math.log(2) + 1) ** 2 if method == "string" else 1.0

    def scores(q, k, d):
        inv = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        ang = rel[..., None] * inv  # [t, t, d/2]
        cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
        qd = q.double()[:, :, :, None, :] * query_scale[:, None, None]  # [b, h, t, 1, d]
        half = d // 2
        rot = qd * cos + torch.cat((-qd[..., half:], qd[..., :half]), -1) * sin  # q_i rotated by r(i, j)
        return ((rot * k.double()[:, :, None, :, :]).sum(-1) * factor / math.sqrt(d)).float()

    return decoder(model, input_ids, scores, allowed=allowed)


def patched(family, method, block=None, **over):
    model = tiny_model(family)
    model.config._attn_implementation = "sdpa"
    hf_posenc.patch(model, method, **{**KNOBS[method], **over})
    if block is not None:
        model.model.layers[0].self_attn._hf_posenc_remapped.block = block
    return model


@pytest.mark.parametrize("method", list(KNOBS))
@pytest.mark.parametrize("family,block", [("llama", None), ("qwen2", 7), ("qwen3", 32)])
def test_full_forward_matches_the_written_out_decoder(method, family, block):
    model = patched(family, method, block)
    x = ids(200, batch=2)
    assert (logits(model, x) - reference(model, x, method, KNOBS[method])).abs().max().item() <= 1e-5


@pytest.mark.parametrize("method", list(KNOBS))
def test_cached_decode_equals_full_forward(method):
    model = patched("llama", method, block=16)
    x = ids(150)
    full = logits(model, x)
    assert (cached_last_logits(model, x, 97) - full[:, 96:149]).abs().max().item() <= 1e-5
    gen = model.generate(x[:, :120], attention_mask=torch.ones(1, 120, dtype=torch.long), max_new_tokens=12,
                         do_sample=False)
    assert torch.equal(logits(model, gen)[:, 119:-1].argmax(-1), gen[:, 120:])


def test_the_cache_is_found_under_either_name_and_one_not_found_is_refused_not_ignored():
    """Transformers 5.24 renamed the forward's ``past_key_values`` to ``cache``: the body hook finds it under both
    names and by position; a call whose cache it does not find, yet whose attention gets more keys than queries,
    is refused (its positions would otherwise silently start at 0)."""
    from torch import nn

    from hf_posenc.adapters.attention import CacheOffset

    class Cached:
        def get_seq_length(self):
            return 96

    class Body(nn.Module):
        def forward(self, input_ids, attention_mask=None, cache=None, **kwargs):
            return input_ids

    state = CacheOffset()
    for args, kwargs in [((), {"cache": Cached()}), ((), {"past_key_values": Cached()}), ((0, None, Cached()), {})]:
        state.body_hook(Body(), args, kwargs)
        assert state.query_start(1, 97) == 96
    state.body_hook(Body(), (), {"kv": Cached()})
    assert state.query_start(5, 5) == 0  # a prefill without a cache
    with pytest.raises(RuntimeError, match="97 keys for 1 queries.*cache or past_key_values"):
        state.query_start(1, 97)


@pytest.mark.parametrize("method", list(KNOBS))
def test_left_padded_batch_equals_each_row_alone(method):
    model = patched("qwen2", method, block=16)
    a, b = ids(170, seed=3), ids(151, seed=4)
    pad = 170 - 151
    batch = torch.cat([a, torch.cat([torch.zeros(1, pad, dtype=torch.long), b], 1)])
    mask = torch.ones(2, 170, dtype=torch.long)
    mask[1, :pad] = 0
    with torch.no_grad():
        out = model(batch, attention_mask=mask).logits.float()
    assert (out[0] - logits(model, a)[0]).abs().max().item() <= 1e-5
    assert (out[1, pad:] - logits(model, b)[0]).abs().max().item() <= 1e-5
    allowed = mask.bool()[:, None, None, :]  # the written-out decoder, padded as the batch is
    ref = reference(model, batch[1:], method, KNOBS[method], allowed=allowed[1:], start=pad)
    assert (out[1, pad:] - ref[0, pad:]).abs().max().item() <= 1e-5
    gen = model.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False)
    alone = model.generate(b, attention_mask=torch.ones_like(b), max_new_tokens=6, do_sample=False)
    assert torch.equal(gen[1, 170:], alone[0, 151:])


@pytest.mark.parametrize("method", list(KNOBS))
def test_bf16_and_training_gradients(method):
    model = patched("llama", method, block=16)
    x = ids(120)
    ref = logits(model, x)
    half = patched("llama", method, block=16).to(torch.bfloat16)
    out = logits(half, x)
    assert torch.isfinite(out).all() and (out - ref).abs().max().item() <= 0.05 * ref.abs().max().item()
    model.train()
    model(x, labels=x).loss.backward()  # autograd takes the eager kernel
    plain = tiny_model("llama")  # the same weights, through the written-out decoder with autograd on
    with torch.enable_grad():
        ref_logits = reference(plain, x, method, KNOBS[method], decoder=written_out_decoder.__wrapped__)
        torch.nn.functional.cross_entropy(ref_logits[0, :-1], x[0, 1:]).backward()
    for name in ("q_proj", "k_proj", "v_proj"):
        ours = getattr(model.model.layers[0].self_attn, name).weight.grad
        theirs = getattr(plain.model.layers[0].self_attn, name).weight.grad
        assert (ours - theirs).abs().max().item() <= 1e-5 * max(1.0, theirs.abs().max().item()), name


def test_save_reload_defaults_and_unpatch(tmp_path):
    for method in KNOBS:
        model = tiny_model("llama")
        x = ids(90)
        before = logits(model, x)
        hf_posenc.patch(model, method)  # the defaults, from the original context
        cfg = hf_posenc.get_config(model)
        if method == "string":  # its local window below L / 16 and the offset: 4 here (128 from L = 2,048 on)
            assert (cfg.params["shifted_offset"], cfg.params["local_window"]) == (ORIGINAL // 3, ORIGINAL // 16)
        full = logits(model, x)
        assert (full - before).abs().max().item() > 1e-3  # 90 tokens reach past every default window
        out = tmp_path / method
        model.save_pretrained(out)
        again = hf_posenc.from_pretrained(str(out), dtype=torch.float32).eval()
        assert hf_posenc.get_config(again) == cfg
        assert (logits(again, x) - full).abs().max().item() <= 1e-6
        hf_posenc.unpatch(model)
        assert torch.equal(logits(model, x), before) and model.config._attn_implementation == "eager"


def test_defaults_and_context():
    expected = {
        "self_extend": ({}, {"group_size": 8, "window": 16}, (L - 16) * 8 + 16),
        "rerope": ({}, {"window": L // 2, "logn_scaling": True, "max_position_embeddings": None}, 4 * L),
        "leaky_rerope": ({}, {"window": L // 2, "leak": 4.0, "logn_scaling": True}, L // 2 + (L - 1 - L // 2) * 4 + 1),
        "string": ({"local_window": 4}, {"shifted_offset": L // 3, "local_window": 4,
                                         "attention_factor": 0.1 * math.log(2) + 1}, L + L // 3 - 4),
        "dca": ({}, {"chunk_size": 3 * L // 4, "local_window": L // 16, "max_position_embeddings": None}, 4 * L),
    }
    for method, (knobs, params, context) in expected.items():
        model = tiny_model("llama")
        hf_posenc.patch(model, method, **knobs)
        assert hf_posenc.get_config(model).params == params, method
        assert model.config.max_position_embeddings == context, method
    model = tiny_model("llama")
    hf_posenc.patch(model, "dca", max_position_embeddings=1000)
    assert model.config.max_position_embeddings == 1000
    listed = hf_posenc.list_methods()
    for method in KNOBS:
        assert listed[method]["kind"] == "attention" and not listed[method]["takes_factor"]
        # per-layer-type RoPE and hybrids too: tests/test_attention_hybrids.py
        assert "llama" in listed[method]["families"] and "gemma3_text" in listed[method]["families"]


@pytest.mark.parametrize("method,knobs,message", [
    ("rerope", {"window": 0}, "window must be an integer >= 1 or None \\(the default\\), got 0"),
    ("rerope", {"window": 64}, "window=64 must be shorter than the original context \\(64\\)"),
    ("rerope", {"logn_scaling": "yes"}, "logn_scaling must be True or False, got 'yes'"),
    ("leaky_rerope", {"leak": 1.0}, "leak must be a number > 1 and <= 1e\\+06"),
    ("string", {"shifted_offset": 10, "local_window": 10},
     "local_window \\(10\\) must be smaller than shifted_offset \\(10\\)"),
    ("string", {"attention_factor": 0},
     "attention_factor must be a finite number > 0 \\(every attention score is scaled by its square\\), got 0"),
    ("dca", {"chunk_size": 40, "local_window": 20},
     "chunk_size \\(40\\) must be more than twice local_window \\(20\\)"),
    ("dca", {"chunk_size": 80}, "chunk_size=80 must not exceed the original context \\(64\\)"),
    ("dca", {"factor": 2.0}, "method 'dca' takes no factor"),
    ("string", {"shifted_ofset": 3}, "does not take parameter\\(s\\) \\['shifted_ofset'\\]"),
])
def test_bad_knobs_are_refused_by_name(method, knobs, message):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match=message):
        hf_posenc.patch(model, method, **knobs)
    assert not hf_posenc.is_patched(model)


def test_models_it_cannot_serve_are_refused():
    mistral = tiny_model("mistral", sliding_window=32)
    with pytest.raises(ValueError, match="dca replaces full attention; model_type='mistral' has none \\(its layers: "
                                         "\\['sliding_attention'\\]; sliding_window=32\\)"):
        hf_posenc.patch(mistral, "dca")
    model = tiny_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="string needs an attention implementation it can replace"):
        hf_posenc.patch(model, "string")
    model = patched("llama", "dca")
    x = ids(40, batch=2)
    holes = torch.ones(2, 40, dtype=torch.long)
    holes[0, 10:12] = 0
    with pytest.raises(ValueError, match="not masks with holes inside a row"):
        model(x, attention_mask=holes)


def test_tiny_config_is_plain():  # the fixtures above rely on it
    assert tiny_config("llama").rope_parameters["rope_type"] == "default"


def test_a_shipped_dual_chunk_attention_config_loads_as_dca(tmp_path, caplog):
    import json

    model = tiny_model("llama")
    model.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    data["dual_chunk_attention_config"] = {"chunk_size": 48, "local_size": 4, "original_max_position_embeddings": 64}
    path.write_text(json.dumps(data))
    with caplog.at_level("WARNING"):
        loaded = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert "ships dual_chunk_attention_config (chunk_size=48, local_size=4): applying hf_posenc's dca" in caplog.text
    cfg = hf_posenc.get_config(loaded)
    assert cfg.method == "dca" and cfg.params["chunk_size"] == 48 and cfg.params["local_window"] == 4
    x = ids(150)
    expected = hf_posenc.patch(tiny_model("llama"), "dca", chunk_size=48, local_window=4)
    assert (logits(loaded, x) - logits(expected, x)).abs().max().item() <= 1e-6
    plain = hf_posenc.from_pretrained(str(tmp_path), posenc="none", dtype=torch.float32).eval()
    assert hf_posenc.get_config(plain).method == "none"
    assert (logits(plain, x) - logits(tiny_model("llama"), x)).abs().max().item() <= 1e-5  # (sdpa vs eager)
    data["dual_chunk_attention_config"] = {"chunk_size": 48}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="dual_chunk_attention_config must hold chunk_size and local_size, got "
                                         "\\{'chunk_size': 48\\}"):
        hf_posenc.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("start,n", [(0, 10), (5, 40), (1000, 300), (60, 1)])
def test_rotation_tables_rotate_as_apply_rotary_does(start, n):
    """The cached cos/sin tables (shared by layers and calls, grown by doubling, skipped where the map leaves keys in
    place) give the keys apply_rotary gives, with and without autograd; a pickled state rebuilds them."""
    import pickle

    from hf_posenc.adapters.remapped_attention import RotationTables
    from hf_posenc.encodings import remap
    from hf_posenc.encodings.rope import apply_rotary

    inv_freq = 1.0 / (THETA ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    tables = RotationTables(remap.DualChunk(48, 8), inv_freq)  # in_chunk: j mod 40, in place for j < 40
    keys = torch.randn(2, 3, n, 16, generator=torch.Generator().manual_seed(start))
    pos = torch.arange(start, start + n)
    want = apply_rotary(keys, torch.remainder(pos, 40) - pos, inv_freq)
    got = tables.rotate(keys, "in_chunk", start)
    assert (got - want).abs().max().item() <= 1e-6
    if start + n <= 40:
        assert got is keys  # nothing to turn
    grad = keys.clone().requires_grad_()
    assert (tables.rotate(grad, "in_chunk", start) - want).abs().max().item() <= 1e-6
    assert tables.held and not pickle.loads(pickle.dumps(tables)).held


@torch.no_grad()
def _decode(model, x, prompt, cache=None):
    """Last logits of a prefill of ``prompt`` tokens then one token at a time, from ``cache`` when given."""
    from transformers import DynamicCache

    cache = cache if cache is not None else DynamicCache(config=model.config)
    out = [model(x[:, :prompt], **with_cache(model, cache), use_cache=True).logits[:, -1]]
    for i in range(prompt, x.shape[1] - 1):
        out.append(model(x[:, i : i + 1], **with_cache(model, cache), use_cache=True).logits[:, -1])
    return torch.stack(out, 1).float(), cache


@pytest.mark.parametrize("method", list(KNOBS))
def test_keys_kept_between_decoding_steps_follow_a_cut_cache_and_stay_with_it(method):
    """Rotated keys kept on the cache object: decoding equals the full forward, also after the cache is cut back and
    decoding goes on with other tokens; a cache of several rows keeps none (beam search reorders rows in place)."""
    from hf_posenc.adapters.remapped_attention import KEPT_ATTR

    model = patched("llama", method)
    x = ids(150)
    got, cache = _decode(model, x, 97)
    assert (got - logits(model, x)[:, 96:149]).abs().max().item() <= 1e-5
    assert cache.__dict__[KEPT_ATTR] or method == "string"  # STRING moves queries only
    cache.crop(110 - cache.get_seq_length())  # cut back to 110 tokens (as assisted decoding does), then other tokens
    y = torch.cat([x[:, :110], ids(40, seed=7)], 1)
    with torch.no_grad():
        steps = [model(y[:, i : i + 1], **with_cache(model, cache), use_cache=True).logits[:, -1]
                 for i in range(110, 149)]
    assert (torch.stack(steps, 1).float() - logits(model, y)[:, 110:149]).abs().max().item() <= 1e-5
    if method in ("rerope", "leaky_rerope"):  # another scheme decoding on the same cache keeps keys of its own
        import copy

        other = patched("llama", method, window=12)
        bare = copy.deepcopy(cache)
        del bare.__dict__[KEPT_ATTR]
        with torch.no_grad():
            shared = [other(y[:, i : i + 1], **with_cache(other, c), use_cache=True).logits for c in (cache, bare)
                      for i in [149]]
        assert torch.equal(shared[0], shared[1]) and len(cache.__dict__[KEPT_ATTR]) == 2 * len(bare.__dict__[KEPT_ATTR])
    _, two = _decode(model, ids(150, batch=2), 97)
    assert not two.__dict__.get(KEPT_ATTR)
