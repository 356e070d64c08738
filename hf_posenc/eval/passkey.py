"""Passkey retrieval, as in the landmark-attention (Mohtashami & Jaggi 2023) and YaRN papers: a key
hidden at a chosen depth in repeated filler text must be recalled at the end.

Prompts are assembled from token pieces tokenized once (prefix, filler, needle, question), so each
prompt has the asked length to within one filler sentence's tokens, and no text is re-tokenized per trial.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

from .scoring import last_logits

PREFIX = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
          "I will quiz you about the important information there.")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"


@dataclass
class PasskeyPrompt:
    input_ids: torch.Tensor  # [T]
    key: str
    answer_ids: torch.Tensor  # tokens of " <key>"
    depth: float
    length: int


class PasskeyBuilder:
    def __init__(self, tokenizer, prefix: str = PREFIX, filler: str = FILLER, needle: str = NEEDLE,
                 question: str = QUESTION):
        if "{key}" not in needle:
            raise ValueError(f"the needle template must contain '{{key}}', got {needle!r}")
        self.tok = tokenizer
        self.needle = needle
        enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        self.prefix, self.filler, self.question = enc(prefix), enc(filler), enc(question)
        if not self.filler:
            raise ValueError("the filler text tokenizes to nothing")
        self._enc = enc

    def build(self, length: int, depth: float, key: str) -> PasskeyPrompt:
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        needle = self._enc(self.needle.format(key=key))
        fixed = len(self.prefix) + len(needle) + len(self.question)
        room = length - fixed
        if room < 0:
            raise ValueError(f"length {length} is too short for a passkey prompt (needs at least {fixed} tokens)")
        reps = room // len(self.filler)
        at = round(depth * reps)  # needle goes after this many filler sentences
        body = self.filler * at + needle + self.filler * (reps - at)
        ids = self.prefix + body + self.question
        answer = self._enc(" " + key)
        return PasskeyPrompt(torch.tensor(ids), key, torch.tensor(answer), depth, len(ids))


def random_key(rng: random.Random, digits: int) -> str:
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


@torch.no_grad()
def score_teacher_forced(model, prompt: PasskeyPrompt) -> bool:
    """Correct when every answer token is the argmax given the prompt and the answer tokens before it."""
    device = next(model.parameters()).device
    ids = torch.cat([prompt.input_ids, prompt.answer_ids[:-1]])[None].to(device)
    logits = last_logits(model, ids, len(prompt.answer_ids))
    return bool((logits[0].argmax(-1).cpu() == prompt.answer_ids).all())


@torch.no_grad()
def score_greedy(model, tokenizer, prompt: PasskeyPrompt) -> tuple[bool, str]:
    """Greedy decoding (stopping a couple of tokens after the answer's length); the first number in
    the output is compared with the key."""
    device = next(model.parameters()).device
    ids = prompt.input_ids[None].to(device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(prompt.answer_ids) + 2,
                         do_sample=False, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    match = re.search(r"\d+", text)
    return (match is not None and match.group(0) == prompt.key), text


def evaluate_passkey(model, tokenizer, lengths: list[int], depths: list[float], trials: int, seed: int = 0,
                     digits: int = 5, scoring: str = "teacher_forced", builder: PasskeyBuilder | None = None,
                     progress: bool = True, desc: str = "") -> dict:
    """Accuracy per (length, depth) cell and overall. Keys come from ``seed``: every method sees the same keys."""
    from tqdm.auto import tqdm

    if scoring not in ("teacher_forced", "greedy"):
        raise ValueError(f"scoring must be 'teacher_forced' or 'greedy', got {scoring!r}")
    if trials < 1 or digits < 1:
        raise ValueError(f"trials and digits must be >= 1, got trials={trials}, digits={digits}")
    builder = builder or PasskeyBuilder(tokenizer)
    cells, samples = {}, []
    # one generator per cell, seeded by the cell's place in the grid: every method sees the same keys
    cells_in_order = [(n, d) for n in lengths for d in depths]
    grid = [(n, d, random.Random(seed * 1_000_003 + i)) for i, (n, d) in enumerate(cells_in_order)]
    bar = tqdm(total=len(grid) * trials, desc=f"{desc} passkey".strip(), disable=not progress, leave=False)
    for n, d, cell_rng in grid:
        hits = 0
        for _ in range(trials):
            prompt = builder.build(n, d, random_key(cell_rng, digits))
            if scoring == "teacher_forced":
                ok, said = score_teacher_forced(model, prompt), None
            else:
                ok, said = score_greedy(model, tokenizer, prompt)
            hits += ok
            samples.append({"length": n, "depth": d, "tokens": prompt.length, "key": prompt.key, "correct": ok,
                            **({"output": said} if said is not None else {})})
            bar.update(1)
        cells[f"{n}@{d}"] = {"length": n, "depth": d, "accuracy": hits / trials, "trials": trials}
    bar.close()
    by_length = {}
    for n in lengths:
        cs = [c for c in cells.values() if c["length"] == n]
        by_length[str(n)] = sum(c["accuracy"] for c in cs) / len(cs)
    overall = sum(c["accuracy"] for c in cells.values()) / len(cells)
    return {"accuracy": overall, "by_length": by_length, "cells": cells, "samples": samples}
