"""The family census, static RoPE scalings (``tests/census.py``): every causal-LM family's narrow twin given each
static scaling the record names at x2 (the length-dependent ones: ``test_family_census_dynamic.py``). Applied
means: the patched forward runs, the folder it saves reads back with the same logits -- by plain transformers where
the block is native (its own computation of the scaling), else by ``hf_posenc.from_pretrained`` -- and unpatch gives
the model back bit for bit. Found by the census and mended: Ministral 3's query temperature key dropped, LFM3's
proportional RoPE failing inside torch, PhiMoE's rotary module ignoring the frequencies written to it."""

from __future__ import annotations

import functools

import pytest
import torch
from census import EXACT, FAMILIES, census
from helpers import logits

import hf_posenc
from hf_posenc.adapters.family_census import census_methods, takes
from hf_posenc.adapters.rope_decoder import GENERIC_FAMILIES
from hf_posenc.methods.rope import SCALINGS

# every registered RoPE scaling; those whose frequencies grow with the length (dynamic NTK, dynamic YaRN) in a file
# of their own (LongRoPE switches between two fixed sets: checked as the static ones)
GROWS = {name for name in census_methods("rope") if SCALINGS[name].dynamic == "grow"}
STATIC = {name: {"factor": 2.0} for name in census_methods("rope") if name not in GROWS}
LENGTH_DEPENDENT = {name: {"factor": 2.0} for name in GROWS}


def saved_and_read_back(folder, model, x, before, got, method):
    """The kind's check: the folder the patch saves reads back with the same logits (by plain transformers where
    the block is native); a length-dependent scaling equals the unpatched model on 24 tokens, inside the original
    context."""
    if method in GROWS:
        assert (got - before).abs().max().item() <= EXACT, method
    model.save_pretrained(folder / method)
    load = type(model).from_pretrained if model.config.hf_posenc["native"] else \
        hf_posenc.from_pretrained  # (the class: Mllama's text model saves a config Auto* does not map)
    again = load(str(folder / method), dtype=torch.float32, attn_implementation="eager").eval()
    assert (logits(again, x) - got).abs().max().item() <= EXACT, method


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_family_takes_each_static_rope_scaling_or_refuses_it_by_name(model_type, tmp_path, caplog):
    census(model_type, STATIC, functools.partial(saved_and_read_back, tmp_path), caplog)
    if model_type in GENERIC_FAMILIES:
        assert model_type in takes("yarn"), f"{model_type} is listed for the RoPE scalings but refused yarn"
