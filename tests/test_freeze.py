"""``--freeze-at N``: a length-dependent scaling (dynamic NTK, dynamic YaRN, LongRoPE's switch) as the static one
that equals it at N tokens. Equal logits at exactly N; other lengths differ as stated (a shorter input gets N's
frequencies instead of its own, a longer one keeps N's); saved natively, so plain transformers (and vLLM, llama.cpp,
which read the same fields) computes it; bad input refused before the model loads."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import ORIGINAL, THETA, ids, logits, refused, tiny_model
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.config import PosEncConfig
from hf_posenc.encodings import rope as R
from hf_posenc.serving.freezing import check_freeze, freeze, freeze_config

L = ORIGINAL
SHORT = [1.0 + 0.05 * i for i in range(8)]
LONG = [2.0 + 0.25 * i for i in range(8)]
CASES = [
    ("dynamic_ntk", dict(factor=2.0), 3 * L),
    ("dynamic_yarn", dict(factor=2.0), 3 * L),
    ("dynamic_yarn", dict(factor=4.0, attn_factor=1.2, beta_fast=16.0, beta_slow=2.0), 2 * L + 10),
    ("dynamic_yarn", dict(factor=4.0, finetuned=True), L // 2),  # finetuned: never below its factor
    ("longrope", dict(factor=4.0, short_factor=SHORT, long_factor=LONG), 2 * L),
    ("longrope", dict(factor=4.0, short_factor=SHORT, long_factor=LONG), L // 2),
]
IDS = [f"{m}-{n}" + ("-knobs" if len(k) > 1 and m == "dynamic_yarn" else "") for m, k, n in CASES]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("method,knobs,at", CASES, ids=IDS)
def test_the_frozen_model_equals_the_dynamic_one_at_exactly_n(family, method, knobs, at):
    model = tiny_model(family)
    hf_posenc.patch(model, method, **knobs)
    x = ids(at)
    dynamic = logits(model, x)
    freeze(model, method, at, **knobs)
    assert hf_posenc.get_config(model).method == {"dynamic_ntk": "ntk", "dynamic_yarn": "yarn"}.get(method, method)
    assert (logits(model, x) - dynamic).abs().max() <= 1e-5


def _pair(method, knobs, at):
    dynamic, frozen = tiny_model("llama"), tiny_model("llama")
    hf_posenc.patch(dynamic, method, **knobs)
    freeze(frozen, method, at, **knobs)
    return dynamic, frozen


def _diff(a, b, n):
    x = ids(n, seed=3)
    return (logits(a, x) - logits(b, x)).abs().max().item()


def test_other_lengths_get_the_frequencies_of_n_not_their_own():
    N = 3 * L
    dynamic, frozen = _pair("dynamic_ntk", dict(factor=2.0), N)
    plain = tiny_model("llama")
    assert _diff(dynamic, frozen, N) <= 1e-5
    assert _diff(dynamic, frozen, 2 * L) > 1e-4  # between L and N: the dynamic base of 2L, not N's
    assert _diff(dynamic, frozen, 4 * L) > 1e-4  # past N: dynamic scales further, frozen keeps N's
    assert _diff(dynamic, plain, L // 2) <= 1e-6  # within L dynamic NTK is the unpatched model ...
    assert _diff(frozen, plain, L // 2) > 1e-4  # ... the frozen one is not
    dynamic, frozen = _pair("dynamic_yarn", dict(factor=2.0), N)
    assert _diff(dynamic, frozen, 2 * L) > 1e-4 and _diff(dynamic, frozen, 4 * L) > 1e-4
    # longrope: equal on N's side of L, N's list on the other side
    knobs = dict(factor=4.0, short_factor=SHORT, long_factor=LONG)
    dynamic, frozen = _pair("longrope", knobs, 2 * L)
    assert _diff(dynamic, frozen, 3 * L) <= 1e-5 and _diff(dynamic, frozen, L // 2) > 1e-4


def test_the_static_forms_and_their_numbers():
    ntk = freeze_config(PosEncConfig("dynamic_ntk", 2.0), 3 * L, original=L)
    assert (ntk.method, ntk.factor, ntk.original_max_position_embeddings) == ("ntk", 2.0 * 3 - 1, L)
    yarn = freeze_config(PosEncConfig("dynamic_yarn", 2.0, params={"attn_factor": 1.5}), 5 * L // 2, original=L)
    assert (yarn.method, yarn.factor, yarn.params["truncate"]) == ("yarn", 2.5, True)
    assert yarn.params["attention_factor"] == pytest.approx(R.yarn_mscale(2.5) * 1.5)
    floor = freeze_config(PosEncConfig("dynamic_yarn", 4.0, params={"finetuned": True}), 2 * L, original=L)
    assert floor.factor == 4.0
    with pytest.raises(ValueError, match="needs its short_factor and long_factor"):
        freeze_config(PosEncConfig("longrope", 2.0), 2 * L, original=L)
    # longrope frozen within L keeps its short list and its attention factor, and advertises L (not factor x L)
    short = freeze_config(PosEncConfig("longrope", 4.0, params={"short_factor": SHORT, "long_factor": LONG}), L // 2,
                          original=L)
    assert (short.factor, short.params["long_factor"]) == (1.0, SHORT)
    assert short.params["attention_factor"] == pytest.approx(R.longrope_attention_factor(4.0, L))
    model = hf_posenc.patch(tiny_model("llama"), short)
    assert model.config.max_position_embeddings == L
    with pytest.raises(ValueError, match="needs the context the model was trained for"):
        freeze_config(PosEncConfig("dynamic_ntk", 2.0), 3 * L)


@pytest.mark.parametrize("method,knobs,expected", [
    ("dynamic_ntk", dict(factor=2.0), {"rope_type": "default", "rope_theta": R.ntk_base(THETA, 16, 5.0)}),
    ("dynamic_yarn", dict(factor=2.0), {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": L}),
    ("longrope", dict(factor=4.0, short_factor=SHORT, long_factor=LONG),
     {"rope_type": "longrope", "short_factor": LONG, "long_factor": LONG}),
])
def test_the_saved_frozen_checkpoint_is_native_and_plain_transformers_computes_it(tmp_path, method, knobs, expected):
    N = 3 * L
    model = tiny_model("llama")
    hf_posenc.patch(model, method, **knobs)
    x = ids(N)
    dynamic = logits(model, x)
    freeze(model, method, N, **knobs)
    hf_posenc.save_pretrained(model, str(tmp_path))
    with open(tmp_path / "config.json") as f:
        saved = json.load(f)
    assert saved["hf_posenc"]["native"] is True
    rp = saved["rope_parameters"]
    for key, value in expected.items():
        assert rp[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()  # no hf_posenc
    plain.config._attn_implementation = "eager"
    assert (logits(plain, x) - dynamic).abs().max() <= 1e-4


def test_bad_freeze_inputs_are_refused_before_the_model_loads(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import hf_posenc.checkpoints.runtime as runtime

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before --freeze-at was checked")

    monkeypatch.setattr(runtime, "load_model_and_tokenizer", no_load)
    out = str(tmp_path / "out")
    base = ["patch", "--model", tiny_checkpoint, "--output", out, "--freeze-at"]
    assert "'yarn' is static already" in refused(base + ["256", "--method", "yarn", "--factor", "2"], capsys)
    assert "whole number of tokens > 0" in refused(base + ["0", "--method", "dynamic_ntk", "--factor", "2"], capsys)
    assert "whole number of tokens > 0" in refused(base + ["-5", "--method", "dynamic_ntk", "--factor", "2"], capsys)
    err = refused(base + ["32", "--method", "dynamic_ntk", "--factor", "2"], capsys)  # the tiny model's L is 64
    assert "changes nothing up to the original context (64 tokens)" in err
    assert "give a length past 64" in refused(base + ["64", "--method", "dynamic_yarn", "--factor", "2"], capsys)
    assert not os.path.exists(out)
    with pytest.raises(ValueError, match="whole number"):
        check_freeze(PosEncConfig("dynamic_ntk", 2.0), 1.5)


def test_the_cli_saves_the_frozen_checkpoint(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "frozen"
    assert main(["patch", "--model", tiny_checkpoint, "--method", "dynamic_ntk", "--factor", "2", "--freeze-at",
                 str(3 * L), "--output", str(out)]) == 0
    with open(out / "config.json") as f:
        saved = json.load(f)
    assert saved["hf_posenc"]["method"] == "ntk" and saved["hf_posenc"]["factor"] == 5.0
    assert saved["rope_parameters"]["rope_theta"] == pytest.approx(R.ntk_base(THETA, 16, 5.0))
    assert "--freeze-at 192" in (out / "README.md").read_text()  # the card's command says how it was made
