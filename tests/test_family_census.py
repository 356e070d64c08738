"""The family census: every causal-LM family the installed transformers ships, built as the narrow twin of its default
config (``adapters/narrow_twin.py``: its layer pattern, RoPE parameters and switches, widths of 64), given one method
of each kind: a RoPE scaling (``yarn`` x2), an attention-level method (``self_extend``) and a swap (``nope``).

Each is either applied -- the patched forward runs, ``unpatch`` gives the model back bit for bit, and the yarn patch
saved and loaded back gives the same logits (by plain transformers where the block is native: its own computation
of it, else by ``hf_posenc.from_pretrained``), self_extend equal to the unpatched model inside its window and not
past it -- or refused by a ValueError before anything changes. Nothing else is
allowed: an error from inside torch or transformers, a patch that stays after unpatch. A family whose twin cannot be
built or run is skipped with the reason. Which families take which method is recorded in
``hf_posenc/adapters/family_census.py`` (what ``hf-posenc methods`` lists); a family whose outcome differs from the
record fails here, by name. Found by this census and mended: Ministral 3's query temperature key dropped, LFM3's
proportional RoPE and Gemma 4's per-layer heads failing inside torch, PhiMoE's rotary module ignoring the
frequencies written to it."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import ids, logits
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import hf_posenc
from hf_posenc.adapters.family_census import TAKES
from hf_posenc.adapters.narrow_twin import twin_or_reason
from hf_posenc.adapters.rope_decoder import GENERIC_FAMILIES

FAMILIES = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
WINDOW = 8  # self_extend's neighbour window here: the first 8 tokens see no remapped distance
METHODS = {"yarn": {"factor": 2.0}, "self_extend": {"group_size": 4, "window": WINDOW}, "nope": {}}
EXACT = 1e-5


def twin(model_type: str):
    """The family's narrow twin, an input and its logits; skipped (with the reason) where there is none."""
    try:
        config = AutoConfig.for_model(model_type)
    except Exception as err:  # noqa: BLE001 (the family's own config check)
        pytest.skip(f"{model_type}: its default config cannot be built ({type(err).__name__})")
    torch.manual_seed(0)
    model, why = twin_or_reason(config)
    if model is None:
        pytest.skip(f"{model_type}: no narrow twin: {why}")
    x = ids(24) % 90 + 3
    try:
        before = logits(model, x)
    except Exception as err:  # noqa: BLE001 (a family that needs other inputs: images, audio, ...)
        pytest.skip(f"{model_type}: the twin's own forward on token ids fails ({type(err).__name__})")
    return model, x, before


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_causal_lm_family_is_patched_or_refused_by_name(model_type, tmp_path, caplog):
    model, x, before = twin(model_type)
    taken = {}
    with caplog.at_level(logging.ERROR):
        for method, knobs in METHODS.items():
            try:
                hf_posenc.patch(model, method, **knobs)
            except ValueError:
                assert not hf_posenc.is_patched(model) and torch.equal(logits(model, x), before), method
                taken[method] = False
                continue
            got = logits(model, x)  # the patched forward runs
            assert torch.isfinite(got).all(), method
            if method == "self_extend":  # exact inside its window of 8 (no distance there is remapped), not past it
                assert (got[:, :WINDOW] - before[:, :WINDOW]).abs().max().item() <= EXACT
                assert (got[:, WINDOW:] - before[:, WINDOW:]).abs().max().item() > 1e-6
            if method == "yarn":  # read back by plain transformers where the block is native: its own computation
                model.save_pretrained(tmp_path)
                load = type(model).from_pretrained if model.config.hf_posenc["native"] else \
                    hf_posenc.from_pretrained  # (the class: Mllama's text model saves a config Auto* does not map)
                again = load(str(tmp_path), dtype=torch.float32, attn_implementation="eager").eval()
                assert (logits(again, x) - got).abs().max().item() <= EXACT
            hf_posenc.unpatch(model)
            assert torch.equal(logits(model, x), before), method
            taken[method] = True
    for method, took in taken.items():  # the record hf-posenc methods lists from
        recorded = model_type in TAKES[method]
        assert took == recorded, (f"{model_type} {'takes' if took else 'refuses'} {method} now; "
                                  f"hf_posenc/adapters/family_census.py records the opposite: move it")
    if model_type in GENERIC_FAMILIES:
        assert taken["yarn"], f"{model_type} is listed for the RoPE scalings but refused yarn"


def test_the_record_names_only_families_of_the_installed_transformers():
    for method, families in TAKES.items():
        assert sorted(set(families)) == list(families), method  # sorted, once each
        assert set(families) <= set(FAMILIES), method
