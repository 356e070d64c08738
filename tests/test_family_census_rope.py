"""The family census, RoPE scalings (``tests/census.py``): every causal-LM family's narrow twin given each scaling
the record names at x2. Applied means: the patched forward runs (equal to the unpatched model for a
length-dependent scaling: 24 tokens are inside the original context), the folder it saves reads back with the same
logits -- by plain transformers where the block is native (its own computation of the scaling), else by
``hf_posenc.from_pretrained`` -- and unpatch gives the model back bit for bit. Found by the census and mended:
Ministral 3's query temperature key dropped, LFM3's proportional RoPE failing inside torch, PhiMoE's rotary module
ignoring the frequencies written to it."""

from __future__ import annotations

import pytest
import torch
from census import EXACT, FAMILIES, census
from helpers import logits

import hf_posenc
from hf_posenc.adapters.family_census import KIND_OF, takes
from hf_posenc.adapters.rope_decoder import GENERIC_FAMILIES

METHODS = {name: {"factor": 2.0} for name, kind in KIND_OF.items() if kind == "rope"}


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_family_takes_each_rope_scaling_or_refuses_it_by_name(model_type, tmp_path, caplog):
    def saved_and_read_back(model, x, before, got, method):
        if method.startswith("dynamic_"):  # 24 tokens, inside the original context: as the checkpoint computes them
            assert (got - before).abs().max().item() <= EXACT, method
        folder = tmp_path / method
        model.save_pretrained(folder)
        load = type(model).from_pretrained if model.config.hf_posenc["native"] else \
            hf_posenc.from_pretrained  # (the class: Mllama's text model saves a config Auto* does not map)
        again = load(str(folder), dtype=torch.float32, attn_implementation="eager").eval()
        assert (logits(again, x) - got).abs().max().item() <= EXACT, method

    census(model_type, METHODS, saved_and_read_back, caplog)
    if model_type in GENERIC_FAMILIES:
        assert model_type in takes("yarn"), f"{model_type} is listed for the RoPE scalings but refused yarn"
