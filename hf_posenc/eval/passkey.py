"""Passkey retrieval, as in the landmark-attention (Mohtashami & Jaggi 2023) and YaRN papers: a key
hidden at a chosen depth in repeated filler text must be recalled at the end.

Encoder-decoders (T5) get the prompt as encoder input and answer from the decoder.

Prompts are assembled from token pieces tokenized once (prefix, filler, needle, question), so each
prompt has the asked length to within one filler sentence's tokens, and no text is re-tokenized per trial.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

from .scoring import as_scorer, input_device

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
    needle: tuple[int, int] = (0, 0)  # [start, end) of the asked needle's tokens in input_ids


def check_needle(needle: str) -> str:
    """A needle template holds ``{key}`` and no other field (literal braces doubled: ``{{``, ``}}``)."""
    try:
        filled = needle.format(key="\0")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"the needle template may hold only the field {{key}} (write literal braces as {{{{ and "
                         f"}}}}), got {needle!r} ({type(err).__name__}: {err})") from None
    if "\0" not in filled:
        raise ValueError(f"the needle template must contain '{{key}}', got {needle!r}")
    return needle


class PasskeyBuilder:
    def __init__(self, tokenizer, prefix: str = PREFIX, filler: str = FILLER, needle: str = NEEDLE,
                 question: str = QUESTION):
        check_needle(needle)
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
        start = len(self.prefix) + at * len(self.filler)
        return PasskeyPrompt(torch.tensor(ids), key, torch.tensor(answer), depth, len(ids),
                             (start, start + len(needle)))


def random_key(rng: random.Random, digits: int) -> str:
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def batch_indices(prompts: list[PasskeyPrompt], batch_size: int, with_answer: bool) -> list[list[int]]:
    """The prompts' indices grouped so that each group has one prompt length (and, ``with_answer``, one answer
    length), so batches need no padding, with at most ``batch_size`` rows each."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault((len(p.input_ids), len(p.answer_ids) if with_answer else 0), []).append(i)
    return [g[i : i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]


def batches(prompts: list[PasskeyPrompt], batch_size: int, with_answer: bool) -> list[list[PasskeyPrompt]]:
    """The prompts in the groups of :func:`batch_indices`."""
    return [[prompts[i] for i in g] for g in batch_indices(prompts, batch_size, with_answer)]


def decoder_start(model) -> int:
    """The token an encoder-decoder's decoder starts from: its config's, else its generation config's."""
    for source in (model.config, getattr(model, "generation_config", None)):
        start = getattr(source, "decoder_start_token_id", None)
        if start is not None:
            return start
    raise ValueError(f"{type(model).__name__} sets no decoder_start_token_id (config or generation config); the "
                     "teacher-forced passkey needs it (T5's is its pad token, 0): set it in config.json")


@torch.no_grad()
def score_teacher_forced(model, prompt: PasskeyPrompt | list[PasskeyPrompt]) -> bool | list[bool]:
    """Correct when every answer token is the argmax given the prompt and the answer tokens before it.
    A list of prompts of one total length runs as one batch."""
    group = prompt if isinstance(prompt, list) else [prompt]
    n = len(group[0].answer_ids)
    if any(len(p.answer_ids) != n or len(p.input_ids) != len(group[0].input_ids) for p in group):
        raise ValueError("a teacher-forced batch needs prompts and answers of one length each")
    device = input_device(model)
    if getattr(model.config, "is_encoder_decoder", False):  # T5: the prompt is the encoder input
        start = decoder_start(model)
        dec = torch.stack([torch.cat([torch.tensor([start]), p.answer_ids[:-1]]) for p in group]).to(device)
        enc = torch.stack([p.input_ids for p in group]).to(device)
        pred = model(input_ids=enc, decoder_input_ids=dec).logits.argmax(-1).cpu()
    else:
        ids = torch.stack([torch.cat([p.input_ids, p.answer_ids[:-1]]) for p in group]).to(device)
        pred = as_scorer(model).argmax_last(ids, n)
    ok = [bool((pred[i] == p.answer_ids).all()) for i, p in enumerate(group)]
    return ok if isinstance(prompt, list) else ok[0]


@torch.no_grad()
def score_greedy(model, tokenizer, prompt: PasskeyPrompt | list[PasskeyPrompt]):
    """Greedy decoding (stopping a couple of tokens after the answer's length); the first number in
    the output is compared with the key. Returns ``(correct, output)``, or a list of them for a list of
    prompts of one length (decoded as one batch)."""
    group = prompt if isinstance(prompt, list) else [prompt]
    if any(len(p.input_ids) != len(group[0].input_ids) for p in group):
        raise ValueError("a greedy batch needs prompts of one length")
    device = input_device(model)
    ids = torch.stack([p.input_ids for p in group]).to(device)
    new = max(len(p.answer_ids) for p in group) + 2
    scorer = as_scorer(model, tokenizer)
    out = scorer.greedy(ids, new, stop_tokens(scorer.generation_config, tokenizer))
    res = []
    for row, p in zip(out, group):
        text = tokenizer.decode(row, skip_special_tokens=True)
        match = re.search(r"\d+", text)
        res.append(((match is not None and match.group(0) == p.key), text))
    return res if isinstance(prompt, list) else res[0]


def stop_tokens(generation_config, tokenizer) -> list[int]:
    """The tokens greedy decoding stops at, as ``generate`` would: the generation config's EOS ids, else the
    tokenizer's."""
    eos = getattr(generation_config, "eos_token_id", None)
    eos = tokenizer.eos_token_id if eos is None else eos
    return [int(t) for t in (eos if isinstance(eos, (list, tuple)) else [eos]) if t is not None]


def check_scoring(scoring: str, trials: int, digits: int, batch_size: int) -> None:
    if scoring not in ("teacher_forced", "greedy"):
        raise ValueError(f"scoring must be 'teacher_forced' or 'greedy', got {scoring!r}")
    if trials < 1 or digits < 1 or batch_size < 1:
        raise ValueError(f"trials, digits and batch_size must be >= 1, got trials={trials}, digits={digits}, "
                         f"batch_size={batch_size}")


def grid(lengths: list[int], depths: list[float], seed: int) -> list[tuple[int, float, int]]:
    """(length, depth, key seed) per cell: the keys of a cell come from its own generator, seeded by the run's
    seed and the cell's place in the grid, so every method sees the same keys."""
    cells = [(n, d) for n in lengths for d in depths]
    return [(n, d, seed * 1_000_003 + i) for i, (n, d) in enumerate(cells)]


def passkey_cell(model, tokenizer, builder: PasskeyBuilder, length: int, depth: float, key_seed: int, trials: int,
                 digits: int = 5, scoring: str = "teacher_forced", batch_size: int = 1) -> dict:
    """``trials`` keys (from ``key_seed``) hidden at ``depth`` in prompts of ``length`` tokens: hits and samples.
    Prompts of one token length run ``batch_size`` at a time (results do not depend on it)."""
    rng = random.Random(key_seed)
    prompts = [builder.build(length, depth, random_key(rng, digits)) for _ in range(trials)]
    outcome: list[tuple[bool, str | None]] = [(False, None)] * len(prompts)
    for group in batch_indices(prompts, batch_size, with_answer=scoring == "teacher_forced"):
        rows = [prompts[i] for i in group]
        if scoring == "teacher_forced":
            got = [(ok, None) for ok in score_teacher_forced(model, rows)]
        else:
            got = score_greedy(model, tokenizer, rows)
        for i, r in zip(group, got):
            outcome[i] = r
    samples = [{"length": length, "depth": depth, "tokens": p.length, "key": p.key, "correct": ok,
                "needle": list(p.needle), **({"output": said} if said is not None else {})}
               for p, (ok, said) in zip(prompts, outcome)]
    return {"hits": sum(s["correct"] for s in samples), "trials": trials, "samples": samples}


def aggregate_passkey(lengths: list[int], cells: list[tuple[int, float, dict]], original: int | None = None) -> dict:
    """Accuracy per (length, depth) cell, per length and overall, from (length, depth, cell result); with the
    ``original`` context L, also per length the needles out of truncation's reach (:func:`beyond_reach`)."""
    table = {f"{n}@{d}": {"length": n, "depth": d, "accuracy": c["hits"] / c["trials"], "trials": c["trials"]}
             for n, d, c in cells}
    by_length = {}
    for n in lengths:
        cs = [c for c in table.values() if c["length"] == n]
        by_length[str(n)] = sum(c["accuracy"] for c in cs) / len(cs)
    overall = sum(c["accuracy"] for c in table.values()) / len(table)
    samples = [s for _, _, c in cells for s in c["samples"]]
    out = {"accuracy": overall, "by_length": by_length, "cells": table, "samples": samples}
    if original:
        out["beyond_reach"] = {str(n): beyond_reach([s for s in samples if s["length"] == n], original)
                               for n in lengths if n > original}
    return out


def beyond_reach(samples: list[dict], original: int) -> dict | None:
    """The samples whose asked needle lies wholly before the prompt's last ``original`` tokens -- where the
    unpatched model truncated to its original context L cannot see it, so a hit there is a fact retrieved from
    past L: ``{"hits", "trials", "accuracy"}`` (accuracy None when no needle lies there); None when a sample
    predates the needle's recorded position (cells of an older run)."""
    if any("needle" not in s for s in samples):
        return None
    out = [s for s in samples if s["needle"][1] <= s["tokens"] - original]
    hits = sum(s["correct"] for s in out)
    return {"hits": hits, "trials": len(out), "accuracy": hits / len(out) if out else None}
