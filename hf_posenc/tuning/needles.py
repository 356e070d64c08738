"""Needle-driven perplexity (LongRoPE2, Shang et al. 2025, arXiv:2502.20082, sec. 3.2): the loss of the answer
tokens of needles hidden in prose, rather than of every token, most of which a model predicts from nearby text
whatever its positions.

One cell is one window of the target length T from a document: the prose of the window with one needle per depth
(RULER's wording, as ``eval passkey --haystack text``: "One of the special magic numbers for {word} is: {key}.")
and, at its end, each needle's question followed by its answer. Its result is the summed NLL of the answer tokens
and their count; ``needle_ppl`` is exp(sum / count) over the cells of a sample.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from ..eval.haystack import TEXT_NEEDLE, TEXT_PREFIX, TEXT_QUESTION, WORDS
from ..eval.passkey import random_key
from ..eval.scoring import token_nll

DIGITS = 7


def needle_prompt(tokenizer, prose: torch.Tensor, length: int, depths: tuple[float, ...],
                  seed: int) -> tuple[list[int], list[int]]:
    """The token ids of a ``length``-token prompt built on ``prose`` (its first tokens, as many as fit), and the
    positions of its answer tokens. Words and keys come from ``seed``."""
    def enc(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    rng = random.Random(seed)
    words = rng.sample(WORDS, len(depths))
    keys = [random_key(rng, DIGITS) for _ in depths]
    needles = [enc(TEXT_NEEDLE.format(word=w, key=k)) for w, k in zip(words, keys)]
    asks = [(enc(TEXT_QUESTION.format(word=w)), enc(" " + k), enc(".")) for w, k in zip(words, keys)]
    prefix = enc(TEXT_PREFIX)
    room = length - len(prefix) - sum(map(len, needles)) - sum(len(q) + len(a) + len(e) for q, a, e in asks)
    if room < len(depths):
        raise ValueError(f"a needle prompt of {length} tokens has no room for the prose around {len(depths)} needles")
    body = prose[:room].tolist()
    for at, needle in sorted(zip((round(d * room) for d in depths), needles), key=lambda p: p[0], reverse=True):
        body[at:at] = needle
    ids, answers = prefix + body, []
    for question, answer, end in asks:
        ids += question
        answers += range(len(ids), len(ids) + len(answer))
        ids += answer + end
    return ids, answers


def check_needles(tokenizer, length: int, depths: tuple[float, ...]) -> None:
    """An error, before any compute, when a prompt of ``length`` tokens cannot hold a needle per depth."""
    try:
        needle_prompt(tokenizer, torch.zeros(length, dtype=torch.long), length, depths, 0)
    except ValueError as err:
        raise ValueError(f"--rank-by needle_ppl: {err}; give fewer --depths or a longer --target-length") from None


def needle_cell(model, tokenizer, prose: torch.Tensor, length: int, depths: tuple[float, ...], seed: int,
                chunk_size: int) -> dict[str, Any]:
    """The summed NLL of a needle prompt's answer tokens (see :func:`needle_prompt`) and their count."""
    ids, answers = needle_prompt(tokenizer, prose, length, depths, seed)
    device = next(model.parameters()).device
    nll = token_nll(model, torch.tensor(ids)[None].to(device), chunk_size=chunk_size)[0].double()
    picked = nll[torch.tensor(answers) - 1]  # nll[p - 1] is the loss of the token at position p
    return {"answer_sum": picked.sum().item(), "answer_cnt": picked.numel()}
