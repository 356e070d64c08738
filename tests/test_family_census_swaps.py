"""The family census, the swap to no positions (``tests/census.py``): every causal-LM family's narrow twin given
``nope``. Applied means: the patched forward runs, unpatch gives the model back bit for bit, and nope asked for every
RoPE layer type (its default on a per-layer-type model is the global layers only) leaves logits that no longer depend
on the positions given."""

from __future__ import annotations

import pytest
import torch
from census import FAMILIES, census
from helpers import logits

import hf_posenc
from hf_posenc.adapters.family_census import RECORD, REFUSES, kind_of
from hf_posenc.adapters.layout import rotary_slots

# families whose attention reads the positions outside RoPE too (kept, as the architecture has it)
READS_POSITIONS_ELSEWHERE = {"beam": "its NoPE full-attention layers scale queries by 1 + 0.1 ln(1 + (p + 1) / 2048)"}


def _moved(model, x) -> torch.Tensor:
    with torch.no_grad():
        return model(x, position_ids=torch.arange(x.shape[1])[None] * 3 + 5).logits.float()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_family_takes_nope_or_refuses_it_by_name(model_type, caplog):
    def positions_unused(model, x, before, got, method):
        types = sorted({s.layer_type for s in rotary_slots(model)} - {None})
        if len(types) > 1:  # every RoPE layer type, not only the default's global layers
            hf_posenc.unpatch(model)
            hf_posenc.patch(model, "nope", layer_types=types)
            got = logits(model, x)
        if model_type in READS_POSITIONS_ELSEWHERE:
            assert (got - before).abs().max().item() > 1e-6, READS_POSITIONS_ELSEWHERE[model_type]
        else:
            assert (_moved(model, x) - got).abs().max().item() <= 1e-7, method  # cos 1, sin 0 wherever they are

    census(model_type, {"nope": {}}, positions_unused, caplog)


def test_the_record_names_only_families_of_the_installed_transformers():
    for kind, families in RECORD.items():
        assert sorted(set(families)) == list(families), kind  # sorted, once each
        assert set(families) <= set(FAMILIES), kind
    for method, refused in REFUSES.items():  # refusals only of families its kind's record names
        assert sorted(set(refused)) == list(refused) and set(refused) < set(RECORD[kind_of(method)]), method
