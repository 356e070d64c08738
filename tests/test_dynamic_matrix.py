"""The length-dependent RoPE scalings (dynamic NTK, dynamic YaRN, LongRoPE; llama3 has no dynamic side) per row and
without history, through every KV cache transformers ships that runs on CPU.

Each row's frequencies follow that row's own length (``max(position_ids[row]) + 1``), never the padded length of
the batch nor an earlier call. The matrix drives ``cache="consistent"`` and ``cache="exact"`` through transformers'
dynamic, static, sliding-window (dynamic and static), fp8-quantized and (with CUDA) offloaded caches, eager and SDPA
attention, with and without left padding: greedy ``generate`` and a hand-written cached loop against recomputing the
whole sequence at every step, or a refusal naming the cache layer's class."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import ORIGINAL, ids, tiny_model

import hf_posenc
from hf_posenc.adapters.cache_argument import with_cache

METHODS = {"dynamic_ntk": {"factor": 2.0}, "dynamic_yarn": {"factor": 2.0}, "longrope": {"factor": 2.0}}
PROMPT, NEW, PAD = 52, 20, 9  # 52 + 20 crosses the original context of 64
EXACT = 1e-5  # fp32 noise: equal to recomputing
CONSISTENT = 2e-4  # re-rotated keys: deeper layers' cached states were computed at shorter lengths (measured 1e-4)
SWITCH = 1e-3  # LongRoPE's switch re-rotated in a hand loop (measured 5.3e-4): warned, not exact


def patched(method, cache="consistent", attn="eager", family="llama", **overrides):
    model = tiny_model(family, **overrides)
    model.config._attn_implementation = attn
    return hf_posenc.patch(model, method, cache=cache, **METHODS[method])


@torch.no_grad()
def forward(model, x, mask=None):
    mask = torch.ones_like(x) if mask is None else mask
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(x, attention_mask=mask, position_ids=position_ids, use_cache=False).logits.float()


def left_padded(lengths, total, seed=3):
    """A batch of rows of ``lengths`` real tokens, left-padded to ``total``; (ids, mask)."""
    rows, masks = [], []
    for i, n in enumerate(lengths):
        rows.append(torch.cat([torch.zeros(1, total - n, dtype=torch.long), ids(n, seed=seed + i)], -1))
        masks.append(torch.cat([torch.zeros(1, total - n, dtype=torch.long), torch.ones(1, n, dtype=torch.long)], -1))
    return torch.cat(rows), torch.cat(masks)


# -- per row, history-free ------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_left_padded_row_equals_the_row_alone(method):
    """Rows of 150, 100 and 40 tokens (past L, past L but shorter, within L) in one left-padded batch."""
    model = patched(method)
    x, mask = left_padded([150, 100, 40], 150)
    out = forward(model, x, mask)
    for r, n in enumerate([150, 100, 40]):
        alone = forward(model, x[r : r + 1, 150 - n :])[0]
        assert (out[r, 150 - n :] - alone).abs().max().item() <= EXACT, (method, n)
    unpatched = forward(tiny_model("llama"), x[1:2, 50:])[0]
    assert (out[1, 50:] - unpatched).abs().max().item() > 1e-3  # the method really acts on the 100-token row


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_same_input_gives_the_same_logits_after_a_longer_one(method):
    model = patched(method)
    x = ids(150)
    fresh = forward(model, x)
    forward(model, ids(250, seed=5))
    assert torch.equal(forward(model, x), fresh)
    rotary = model.model.rotary_emb
    assert torch.equal(rotary.inv_freq, patched(method).model.rotary_emb.inv_freq)  # nothing left behind


# -- cache="exact" (and LongRoPE's switch) in a hand-written cached loop -------------------------------------------
@torch.no_grad()
def hand_loop(model, x, mask, cache, keyword=None):
    """Logits of a prefill of ``PROMPT`` tokens, then one token at a time with ``cache``: ``[b, steps, vocab]``."""
    kw = with_cache(model, cache) if keyword is None else {keyword: cache}
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(x[:, :PROMPT], attention_mask=mask[:, :PROMPT], position_ids=position_ids[:, :PROMPT], use_cache=True,
                **kw)
    steps = [out.logits[:, -1]]
    for t in range(PROMPT, x.shape[1] - 1):
        out = model(x[:, t : t + 1], attention_mask=mask[:, : t + 1], position_ids=position_ids[:, t : t + 1],
                    use_cache=True, **kw)
        steps.append(out.logits[:, -1])
    return torch.stack(steps, 1).float()


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_an_exact_cache_in_a_hand_written_loop_warns_once_naming_what_to_do(keyword):
    from transformers import DynamicCache

    model = patched("dynamic_ntk", cache="exact")
    x = ids(PROMPT + NEW)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hand_loop(model, x, torch.ones_like(x), DynamicCache(config=model.config), keyword)
        hand_loop(model, x, torch.ones_like(x), DynamicCache(config=model.config), keyword)
    mine = [str(w.message) for w in caught if "cache='exact'" in str(w.message)]
    assert len(mine) == 1, mine
    assert "generate" in mine[0] and "without the cache" in mine[0]
    quiet = patched("dynamic_ntk", cache="consistent")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="hf_posenc")
        hand_loop(quiet, x, torch.ones_like(x), DynamicCache(config=quiet.config), keyword)


# -- the matrix --------------------------------------------------------------------------------------------------
def _dynamic(model, batch, total):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _offloaded(model, batch, total):
    from transformers import DynamicCache

    return DynamicCache(config=model.config, offloading=True)


def _static(model, batch, total):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=total)


def _quantized(model, batch, total):
    from transformers import QuantizedCache

    return QuantizedCache(backend="fp8", config=model.config)


SLIDING = {"sliding_window": 24}
CACHES = {  # name -> (family, model overrides, cache factory, the layer class a re-rotation refuses, or None)
    "dynamic": ("llama", {}, _dynamic, None),
    "offloaded": ("llama", {}, _offloaded, None),
    "static": ("llama", {}, _static, None),
    "sliding_dynamic": ("mistral", SLIDING, _dynamic, None),
    "sliding_static": ("mistral", SLIDING, _static, None),
    "fp8_quantized": ("llama", {}, _quantized, "Fp8QuantizedLayer"),
}
_REFERENCES: dict = {}


def inputs(padded: bool):
    if not padded:
        return ids(PROMPT), torch.ones(1, PROMPT, dtype=torch.long)
    return left_padded([PROMPT, PROMPT - PAD], PROMPT, seed=11)


@torch.no_grad()
def recomputed(model, x, mask, key):
    """Greedy decoding by a forward over the whole sequence at every step (no cache), computed once per ``key``:
    (sequences, logits ``[b, NEW, vocab]``)."""
    if key not in _REFERENCES:
        seq, scores = x, []
        for _ in range(NEW):
            logits = forward(model, seq, mask)[:, -1]
            scores.append(logits)
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], -1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
        _REFERENCES[key] = seq, torch.stack(scores, 1)
    return _REFERENCES[key]


@torch.no_grad()
def generated(model, x, mask, cache):
    out = model.generate(x, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0, **with_cache(model, cache))
    return out.sequences, torch.stack(out.logits, 1).float()


def bound(method, mode, how):
    """What each combination guarantees against recomputing: generate is exact where it re-encodes at each change
    (``exact``; LongRoPE's single switch either way); a hand loop re-rotates the cached keys."""
    if how == "generate" and (mode == "exact" or method == "longrope"):
        return EXACT
    return CONSISTENT if method != "longrope" else SWITCH


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left_padded"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("cache_kind", list(CACHES))
@pytest.mark.parametrize("mode", ["consistent", "exact"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_generate_and_a_hand_loop_against_recomputing(method, mode, cache_kind, attn, padded):
    family, overrides, make, refused = CACHES[cache_kind]
    if cache_kind == "offloaded" and not torch.cuda.is_available():
        pytest.skip("transformers' offloaded DynamicCache moves layers with CUDA streams: it does not run on CPU")
    model = patched(method, mode, attn, family, **overrides)
    x, mask = inputs(padded)
    ref_seq, ref_scores = recomputed(model, x, mask, (method, family, attn, padded))
    assert ref_seq.shape[1] > ORIGINAL  # the sequence crosses the original context
    full_mask = torch.cat([mask, torch.ones(mask.shape[0], NEW, dtype=torch.long)], -1)
    total = ref_seq.shape[1]
    for how in ("generate", "hand loop"):
        cache = make(model, x.shape[0], total)
        limit = bound(method, mode, how)
        if refused:  # re-rotation refused by name; generate re-encoding at each change needs none
            if how == "generate" and limit == EXACT:
                assert run(model, how, x, mask, ref_seq, full_mask, cache)[0].shape == ref_seq.shape
                continue  # (its logits carry the fp8 keys' own error: 3.5e-3 here before any change)
            with pytest.raises(ValueError, match=f"{refused} layer.*cache='stale'"):
                run(model, how, x, mask, ref_seq, full_mask, cache)
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            seq, scores = run(model, how, x, mask, ref_seq, full_mask, cache)
        warned = any("hf_posenc" in str(w.message) for w in caught)
        assert warned == (how == "hand loop" and (mode == "exact" or method == "longrope")), how
        if how == "generate":
            assert torch.equal(seq, ref_seq), (how, limit)
        err = (scores - ref_scores).abs().max().item()
        assert err <= limit, (how, err)


def run(model, how, x, mask, ref_seq, full_mask, cache):
    if how == "generate":
        return generated(model, x, mask, cache)
    return None, hand_loop(model, ref_seq, full_mask, cache)
