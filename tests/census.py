"""The family census's shared part (``tests/test_family_census_*.py``): every causal-LM family the installed
transformers ships, built as the narrow twin of its default config (``adapters/narrow_twin.py``: its layer pattern,
RoPE parameters and switches, widths of 64), and each method of a kind either applied or refused by a ValueError
before anything changes. What each file checks of an applied method is its own; the outcome, family by family, must
equal the record ``hf_posenc/adapters/family_census.py`` (what ``hf-posenc methods`` lists)."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import ids, logits
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import hf_posenc
from hf_posenc.adapters.family_census import takes
from hf_posenc.adapters.narrow_twin import spread_constant_weights, twin_or_reason

FAMILIES = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
EXACT = 1e-5
STALE = "cache='stale'"  # what a refusal of the re-rotated cache proposes instead


def twin(model_type: str):
    """The family's narrow twin (its constant weights given a spread), an input, its logits and whether they ignore
    ``position_ids`` (then no check of an applied positional method could fail: ALiBi, positions counted from the
    length, ...); skipped (with the reason) where there is none."""
    try:
        config = AutoConfig.for_model(model_type)
    except Exception as err:  # noqa: BLE001 (the family's own config check)
        pytest.skip(f"{model_type}: its default config cannot be built ({type(err).__name__})")
    torch.manual_seed(0)
    model, why = twin_or_reason(config)
    if model is None:
        pytest.skip(f"{model_type}: no narrow twin: {why}")
    x = ids(24) % 90 + 3
    spread_constant_weights(model)
    try:
        before = logits(model, x)
    except Exception as err:  # noqa: BLE001 (a family that needs other inputs: images, audio, ...)
        pytest.skip(f"{model_type}: the twin's own forward on token ids fails ({type(err).__name__})")
    if not _sees_positions(model, x, before):
        _wake_zero_weights(model)  # ZAYA's key temperature starts at 0: every key 0, attention blind to positions
        spread_constant_weights(model)
        before = logits(model, x)
    return model, x, before, not _sees_positions(model, x, before)


def _sees_positions(model, x, before) -> bool:
    with torch.no_grad():
        moved = model(x, position_ids=torch.arange(x.shape[1])[None] * 3 + 5).logits.float()
    return (moved - before).abs().max().item() > 1e-6


def _wake_zero_weights(model) -> None:
    """Sets every weight (not bias) the initialisation left all zero to one."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.is_floating_point() and "bias" not in name and not p.any():
                p.fill_(1.0)


def implementation_gap(model, x, before) -> float:
    """How far the unpatched twin's logits move between transformers' own eager and sdpa attention: the rounding its
    depth amplifies (Gemma 4's twin, attention scale 1 over 30 layers: ~6e-4; most twins: < 1e-6); 0 where the
    family has one of them only."""
    impl = model.config._attn_implementation
    gaps = [0.0]
    try:
        for other in ("eager", "sdpa"):
            try:
                model.set_attn_implementation(other)
            except ValueError:  # (a family without sdpa)
                return 0.0
            gaps.append((logits(model, x) - before).abs().max().item())
    finally:
        model.set_attn_implementation(impl)
    return max(gaps)


def census(model_type: str, methods: dict, check, caplog, floor: bool = False) -> None:
    """Patches the twin of ``model_type`` with each of ``methods`` (name: knobs); a refusal leaves the model as it
    was (a refusal proposing cache='stale' is taken at its word once), an applied method passes ``check(model, x,
    before, got, method)`` (``floor``: ``check(..., gap)`` with the twin's :func:`implementation_gap`), then unpatch
    gives it back bit for bit. The outcomes must equal the record."""
    model, x, before, blind = twin(model_type)
    extra = (implementation_gap(model, x, before),) if floor else ()
    taken = {}
    with caplog.at_level(logging.ERROR):
        for method, knobs in methods.items():
            taken[method] = _patch(model, x, before, method, knobs)
            if not taken[method]:
                continue
            assert not blind, f"{model_type} takes {method}; its twin's logits ignore position_ids: nothing proves it"
            got = logits(model, x)  # the patched forward runs
            assert torch.isfinite(got).all(), method
            check(model, x, before, got, method, *extra)
            hf_posenc.unpatch(model)
            assert torch.equal(logits(model, x), before), method
    moved = [f"{model_type} {'takes' if took else 'refuses'} {method}" for method, took in taken.items()
             if took != (model_type in takes(method))]
    assert not moved, f"{'; '.join(moved)} now; hf_posenc/adapters/family_census.py records the opposite: move it"


def _patch(model, x, before, method: str, knobs: dict) -> bool:
    """True when ``method`` patched the model; False when it was refused by name and left the model as it was."""
    for attempt in (knobs, {**knobs, "cache": "stale"}):
        try:
            hf_posenc.patch(model, method, **attempt)
            return True
        except ValueError as err:
            assert not hf_posenc.is_patched(model) and torch.equal(logits(model, x), before), method
            if STALE not in str(err) or "cache" in attempt:
                return False
    return False
