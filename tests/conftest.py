"""Shared fixtures: tiny random decoders of each tested family, built with ``from_config`` (the helpers they use, and
that tests import, are in helpers.py)."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import FAMILIES, tiny_config, tiny_model
from transformers import AutoModelForCausalLM

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n 2: one thread per worker, the cores shared between them
    torch.set_num_threads(1)


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="session")
def bert_tokenizer():
    """A real local tokenizer (all-MiniLM-L6-v2's WordPiece), to pair with tiny random decoders."""
    from transformers import AutoTokenizer

    from hf_posenc.checkpoints.models import resolve_source

    return AutoTokenizer.from_pretrained(resolve_source("all-minilm-l6-v2").path)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, bert_tokenizer):
    """A saved tiny random LLaMA with a real tokenizer: a local model folder for the CLI."""
    out = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=bert_tokenizer.vocab_size)).save_pretrained(out)
    bert_tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture
def own_checkpoint(tmp_path, bert_tokenizer, monkeypatch):
    """A tiny random LLaMA saved in this test's own folder (free to change), with its own digest cache."""
    monkeypatch.setenv("HF_POSENC_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    tiny_model("llama", vocab_size=bert_tokenizer.vocab_size).save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    return folder
