"""Needles in real text: passkey prompts whose haystack is prose from documents, not repeated filler.

Repeated filler is easy to skip (a model can attend to the one sentence that differs); RULER (Hsieh et al. 2024,
arXiv:2404.06654) hides its needles in essays instead, with the wording used here: "One of the special magic
numbers for {word} is: {key}." and the question "What is the special magic number for {word} mentioned in the
provided text?". With ``needles`` > 1, the other needles carry other words and keys (distractors, as RULER's
multi-key tasks); only the key of the asked word counts.

Each prompt is built from a contiguous span of the documents' tokens, starting at an offset drawn for that prompt;
the asked needle goes at ``depth`` of the span, snapped back to the nearest sentence end within 64 tokens (so it
does not split a sentence where one ends nearby), distractors at random places. Everything a prompt draws comes
from a generator seeded by its key, length and depth: a prompt is the same in every run and process.
"""

from __future__ import annotations

import random

import torch

from .passkey import PasskeyPrompt

TEXT_PREFIX = ("Some special magic numbers are hidden within the following text. Make sure to memorize them. "
               "I will quiz you about the numbers afterwards.\n")
TEXT_NEEDLE = " One of the special magic numbers for {word} is: {key}. "
TEXT_QUESTION = (" What is the special magic number for {word} mentioned in the provided text? The special magic "
                 "number for {word} mentioned in the provided text is")
WORDS = ("apple", "river", "candle", "falcon", "garden", "harbor", "island", "jacket", "kettle", "lantern", "meadow",
         "needle", "orchard", "pepper", "quartz", "ribbon", "saddle", "tunnel", "violin", "walnut", "anchor", "blossom",
         "copper", "dolphin", "ember", "feather", "glacier", "hammer", "ivory", "juniper", "kernel", "lobster")
SNAP = 64  # how far back the needle may move to stand after a sentence end


class TextHaystack:
    """Builds :class:`passkey.PasskeyPrompt` s from ``stream`` (the documents' token ids, joined)."""

    def __init__(self, tokenizer, stream: list[int], needles: int = 1):
        if not 1 <= needles <= len(WORDS):
            raise ValueError(f"--needles must be from 1 to {len(WORDS)}, got {needles}")
        self.tok, self.stream, self.needles = tokenizer, stream, needles
        self._enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        self.prefix = self._enc(TEXT_PREFIX)
        ends = {i for i in set(stream) if tokenizer.decode([i]).rstrip().endswith((".", "!", "?"))}
        self.sentence_end = [t in ends for t in stream]

    def build(self, length: int, depth: float, key: str) -> PasskeyPrompt:
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        rng = random.Random(f"{key}/{length}/{depth}")
        words = rng.sample(WORDS, self.needles)
        keys = [key] + [str(rng.randint(10 ** (len(key) - 1), 10 ** len(key) - 1)) for _ in words[1:]]
        needles = [self._enc(TEXT_NEEDLE.format(word=w, key=k)) for w, k in zip(words, keys)]
        question = self._enc(TEXT_QUESTION.format(word=words[0]))
        room = length - len(self.prefix) - sum(map(len, needles)) - len(question)
        if room < 1:
            raise ValueError(f"length {length} is too short for a text-haystack prompt with {self.needles} needle(s)")
        if room > len(self.stream):
            raise ValueError(f"the haystack text has {len(self.stream)} tokens; length {length} needs {room}: give "
                             "more or longer documents")
        start = rng.randrange(0, len(self.stream) - room + 1)
        places = [self._snap(start, round(depth * room))] + [rng.randrange(0, room + 1) for _ in needles[1:]]
        body = list(self.stream[start : start + room])
        for at, needle in sorted(zip(places, needles), key=lambda p: p[0], reverse=True):
            body[at:at] = needle
        ids = self.prefix + body + question
        # the asked needle (first inserted, so pushed right by the others inserted at or before its place)
        first = len(self.prefix) + places[0] + sum(len(n) for at, n in zip(places[1:], needles[1:]) if at <= places[0])
        return PasskeyPrompt(torch.tensor(ids), key, torch.tensor(self._enc(" " + key)), depth, len(ids),
                             (first, first + len(needles[0])))

    def _snap(self, start: int, at: int) -> int:
        """``at`` (an offset into the span from ``start``), moved back to just after a sentence end within SNAP
        tokens when there is one."""
        for back in range(min(SNAP, at) + 1):
            if at - back == 0 or self.sentence_end[start + at - back - 1]:
                return at - back
        return at
