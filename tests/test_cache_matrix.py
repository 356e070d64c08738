"""Every method that hooks attention or positions, through every KV cache implementation transformers ships and
every attention implementation that runs on CPU: greedy ``generate`` with the cache equals recomputing each row's
whole sequence without a cache (one row left-padded, one not), or the combination is refused by name.

Offloaded caches need CUDA in transformers itself: they run where a GPU is present. The quantized cache (fp8, the
backend that runs on CPU) is lossy by design: it must equal a dynamic cache that holds the same rounded keys and
values. ``flex_attention`` compiles for ~40 s per shape on CPU: it is checked by refusal (methods that replace the
attention function) and left to transformers where the method leaves attention alone."""

import pytest
import torch
from helpers import SMALL_WINDOW_KNOBS, ids, logits, tiny_model
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

import hf_posenc
from hf_posenc.adapters.cache_argument import with_cache

KNOBS = {m: SMALL_WINDOW_KNOBS[m] for m in ("self_extend", "dca", "string", "rerope", "leaky_rerope", "alibi", "nope",
                                        "learned", "longrope", "llama3")}  # 90 tokens cross every boundary
ATTENTION = ("self_extend", "dca", "string", "rerope", "leaky_rerope", "alibi")  # bring their own attention
CACHES = ("dynamic", "static", "offloaded", "offloaded_static", "sliding_window", "quantized")
PROMPT, NEW = 90, 5
PAD = 13  # row 1 is left-padded by this many tokens


def patched(method, impl):
    model = tiny_model("llama")
    model.config._attn_implementation = impl
    return hf_posenc.patch(model, method, **KNOBS[method])


def batch(device="cpu"):
    x = ids(PROMPT, seed=5, batch=2)
    mask = torch.ones_like(x)
    mask[1, :PAD] = 0
    x[1, :PAD] = 0
    return x.to(device), mask.to(device)


@torch.no_grad()
def generated(model, cache=None, **kw):
    x, mask = batch(model.device)
    if cache is not None:
        kw.update(with_cache(model, cache))
    out = model.generate(x, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0, **kw)
    return out.sequences, torch.stack(out.logits, 1).float()


def recomputed_gap(model, seqs, steps) -> float:
    """Max |logit| difference between the cached steps and each row's whole sequence run alone without a cache."""
    worst, seqs, steps = 0.0, seqs.cpu(), steps.cpu()
    for r, pad in enumerate((0, PAD)):
        full = logits(model, seqs[r : r + 1, pad:].to(model.device)).cpu()[0, PROMPT - pad - 1 : -1]
        worst = max(worst, (full - steps[r]).abs().max().item())
    return worst


def runs_here(cache: str) -> bool:
    return not cache.startswith("offloaded") or torch.cuda.is_available()


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("cache", [c for c in CACHES if c != "quantized"])
@pytest.mark.parametrize("method", list(KNOBS))
def test_cached_generate_equals_recomputation(method, cache, impl):
    if not runs_here(cache):
        pytest.skip("transformers' offloaded caches need CUDA")
    model = patched(method, impl).to("cuda" if cache.startswith("offloaded") else "cpu")
    seqs, steps = generated(model, cache_implementation=cache)
    assert recomputed_gap(model, seqs, steps) <= 1e-5


@pytest.mark.parametrize("method", list(KNOBS))
@pytest.mark.parametrize("before,after", [("eager", "sdpa"), ("sdpa", "eager")])
def test_a_switch_of_attention_implementation_keeps_the_method(method, before, after):
    """``set_attn_implementation`` after patching: the method is still computed (cached and recomputed), and what
    hf_posenc reports is what runs."""
    model = patched(method, before)
    x, _ = batch()
    ref = logits(model, x[:1])
    model.set_attn_implementation(after)
    assert hf_posenc.get_config(model).method == method
    assert (logits(model, x[:1]) - ref).abs().max().item() <= 1e-5
    assert (logits(tiny_model("llama"), x[:1]) - ref).abs().max().item() > 1e-3  # the method changes the logits
    seqs, steps = generated(model, cache_implementation="static")
    assert recomputed_gap(model, seqs, steps) <= 1e-5


@pytest.mark.parametrize("method", ATTENTION)
def test_a_switch_to_an_implementation_the_method_cannot_serve_is_refused(method):
    model = patched(method, "sdpa")
    x, _ = batch()
    ref = logits(model, x[:1])
    with pytest.raises(ValueError, match=f"{method}.*'flex_attention'.*'eager' or 'sdpa'"):
        model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match="'flash_attention_2'"):
        model.model.set_attn_implementation("flash_attention_2")  # the body shares the config: refused there too
    assert torch.equal(logits(model, x[:1]), ref)  # nothing changed


@pytest.mark.parametrize("method", ATTENTION)
def test_an_implementation_changed_behind_the_patch_is_refused_before_compute(method):
    """The config's implementation assigned directly (not through ``set_attn_implementation``): the next forward
    call is refused, naming the implementation, instead of computing the unpatched attention."""
    model = patched(method, "sdpa")
    model.config._attn_implementation = "eager" if method != "alibi" else "flex_attention"
    with pytest.raises(RuntimeError, match=f"{method}.*attention implementation.*'(eager|flex_attention)'"):
        logits(model, ids(20))


@pytest.mark.parametrize("method,before", [("dca", "sdpa"), ("alibi", "sdpa"), ("alibi", "eager")])
def test_unpatch_after_a_switch_gives_back_the_model_as_before_the_patch(method, before):
    model = patched(method, before)
    model.set_attn_implementation("sdpa" if before == "eager" else "eager")
    hf_posenc.unpatch(model)
    assert model.config._attn_implementation == before and "set_attn_implementation" not in vars(model)
    x = ids(80)
    assert (logits(model, x) - logits(tiny_model("llama"), x)).abs().max().item() <= 1e-5


# -- the quantized cache: equal to a dynamic cache holding the same rounded keys and values ----------------------
class Fp8RoundTrip(DynamicLayer):
    """A dynamic layer that keeps what transformers' fp8 quantized layer keeps (each state rounded through fp8 with
    the per-tensor scale of the first update) and returns what it returns (the first update as given)."""

    def update(self, key_states, value_states, *args, **kwargs):
        first = not self.is_initialized
        if first:
            self.lazy_initialization(key_states, value_states)
            self.scales = [(s.abs().amax().float() / torch.finfo(torch.float8_e4m3fn).max).clamp(
                min=torch.finfo(torch.float32).tiny) for s in (key_states, value_states)]
        k, v = ((s.float() / c).to(torch.float8_e4m3fn).float() * c
                for s, c in zip((key_states, value_states), self.scales))
        self.keys = torch.cat([self.keys, k.to(key_states.dtype)], dim=-2)
        self.values = torch.cat([self.values, v.to(value_states.dtype)], dim=-2)
        return (key_states, value_states) if first else (self.keys, self.values)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("method", list(KNOBS))
def test_the_fp8_quantized_cache_equals_a_dynamic_cache_of_the_same_values(method, impl):
    model = patched(method, impl)
    seqs, steps = generated(model, cache_implementation="quantized", cache_config={"backend": "fp8"})
    layers = model.config.num_hidden_layers
    ref_seqs, ref_steps = generated(model, cache=Cache(layers=[Fp8RoundTrip() for _ in range(layers)]))
    assert (steps - ref_steps).abs().max().item() <= 1e-5 and torch.equal(seqs, ref_seqs)
    plain_seqs, plain_steps = generated(model)  # and the rounding is really there: the check is not vacuous
    assert (plain_steps - steps).abs().max().item() > 1e-5


@pytest.mark.parametrize("method", ["self_extend", "dca", "rerope"])
def test_a_quantized_cache_gives_one_row_what_it_gives_a_batch(method):
    """One row decodes with rotated keys kept between steps (a batch keeps none): a quantized cache hands the
    prefill's keys back rounded from the second step on, so kept keys would be the unrounded ones. Two copies of
    the row share the fp8 scale of the row alone."""
    model = patched(method, "sdpa")
    x = ids(PROMPT, seed=5)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, output_logits=True, return_dict_in_generate=True,
              pad_token_id=0, cache_implementation="quantized", cache_config={"backend": "fp8"})
    with torch.no_grad():
        one = torch.stack(model.generate(x, **kw).logits, 1)
        two = torch.stack(model.generate(torch.cat([x, x]), **kw).logits, 1)
    assert (one[0] - two[0]).abs().max().item() <= 1e-5


# -- caches the attention-level methods cannot read positions from: refused by name ------------------------------
@pytest.mark.parametrize("method", ATTENTION)
def test_a_sliding_window_cache_is_refused_by_name(method):
    model = patched(method, "sdpa")
    cache = Cache(layers=[DynamicSlidingWindowLayer(sliding_window=32) for _ in range(model.config.num_hidden_layers)])
    x = ids(40)
    with pytest.raises(ValueError, match=f"{method}.*DynamicSlidingWindowLayer.*Supported"):
        with torch.no_grad():
            model(x, **with_cache(model, cache), use_cache=True)


def test_every_cache_implementation_of_this_transformers_is_in_the_matrix():
    from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS

    # the deprecated hybrid names go to the same static cache as "sliding_window" (generate's _prepare_static_cache)
    assert set(ALL_CACHE_IMPLEMENTATIONS) - {"hybrid", "hybrid_chunked", "offloaded_hybrid",
                                             "offloaded_hybrid_chunked"} <= set(CACHES)
