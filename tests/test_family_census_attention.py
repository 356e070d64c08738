"""The family census, attention-level methods (``tests/census.py``): every causal-LM family's narrow twin given each
built-in method, with knobs under which the first 8 of 24 tokens see no remapped distance. Applied means: the
patched forward equals the unpatched model on those 8 tokens, differs past them, and unpatch gives the model back
bit for bit. Found by the census and mended: Gemma 4's per-layer heads failing inside torch, OLMo Hybrid's linear
layers failing for want of a self_attn."""

from __future__ import annotations

import pytest
from census import EXACT, FAMILIES, census

from hf_posenc.adapters.family_census import census_methods

WINDOW = 8  # the first 8 tokens see no remapped distance under each method's knobs below
METHODS = {"self_extend": {"group_size": 4, "window": WINDOW}, "dca": {"chunk_size": 12, "local_window": 4},
           "string": {"shifted_offset": WINDOW, "local_window": 4, "attention_factor": 1.0},
           "rerope": {"window": WINDOW}, "leaky_rerope": {"window": WINDOW, "leak": 4.0}}


def test_the_census_runs_every_attention_level_method_the_record_names():
    assert sorted(METHODS) == sorted(census_methods("attention"))  # each registered one has its knobs here


def exact_inside_the_window(model, x, before, got, method, gap):
    """Equal inside the window and different past it, both beside ``gap``: how far transformers' own eager and sdpa
    attention move the unpatched twin's logits (the method's blockwise softmax rounds as differently as they do; a
    twin that amplifies rounding, Gemma 4's, gets twice that)."""
    assert (got[:, :WINDOW] - before[:, :WINDOW]).abs().max().item() <= max(EXACT, 2 * gap), method
    assert (got[:, WINDOW:] - before[:, WINDOW:]).abs().max().item() > max(1e-6, 2 * gap), method


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_family_takes_each_attention_level_method_or_refuses_it_by_name(model_type, caplog):
    census(model_type, METHODS, exact_inside_the_window, caplog, floor=True)
