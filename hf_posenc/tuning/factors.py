"""Per-dimension RoPE rescale factors as LongRoPE searches them (Ding et al. 2024, arXiv:2402.13753, sec. 3.2).

A candidate is one factor lambda_i >= 1 per rotary pair i (0 = the highest frequency), dividing the checkpoint's
own frequency theta_i, plus an attention factor. LongRoPE's search constraints hold for every candidate:

- lambda_i >= 1, and lambda_i <= lambda_{i+1} (non-decreasing from high- to low-frequency pairs);
- the pairs below the critical dimension -- those whose wavelength 2 pi / theta_i fits within the context L, so
  positions past L give angles already seen in training (LongRoPE2, Shang et al. 2025, arXiv:2502.20082, sec. 3)
  -- keep lambda_i = 1 (``free_from`` the first pair the search moves);
- lambda_i <= ``cap`` (LongRoPE searches up to 1.25 s; here twice the extension ratio s, so that the grid's 2 s seeds
  fit).

The search works on log-increments delta_i = ln lambda_i - ln lambda_{i-1} >= 0, so a mutation or a crossover keeps
the order by construction. Factors are rounded to 4 decimals (rounding keeps the order), so that a candidate is the
same after a JSON round trip and its label, a digest of its numbers, names it in every run.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass

import torch

from ..methods import resolve_method
from ..methods.rope import SCALINGS

DECIMALS = 4
SEED_METHODS = ("yarn", "ntk", "pi", "llama3")  # the static scalings whose factors seed the population
ATTENTION_RANGE = (1.0, 1.5)


@dataclass(frozen=True)
class Candidate:
    """One point of the search: ``factors`` (one per rotary pair, >= 1, non-decreasing), the ``attention`` factor
    (None: LongRoPE's default sqrt(1 + ln s / ln L)), and where it came from (``origin``: a seed's method and
    factor, "mutation" or "crossover")."""

    factors: tuple[float, ...]
    attention: float | None
    origin: str

    @property
    def label(self) -> str:
        digest = hashlib.sha256(json.dumps([self.factors, self.attention]).encode()).hexdigest()[:10]
        return f"longrope-{digest}"


HOLDS = ("critical", "yarn", "none")


def critical_pair(own: torch.Tensor, context: int) -> int:
    """The first rotary pair whose wavelength 2 pi / theta_i exceeds ``context`` (the number of pairs that turn at
    least once within it)."""
    return int((2 * math.pi / own.double() <= context).sum())


def held_pairs(own: torch.Tensor, context: int, hold: str) -> int:
    """How many leading (high-frequency) pairs keep factor 1: ``critical``, those that turn at least once within
    ``context`` (LongRoPE2's critical dimension); ``yarn``, those that turn more than YaRN's beta_fast (32) times
    within it, the band YaRN itself leaves unchanged, so YaRN's ramp stays within reach; ``none``: no pair."""
    if hold == "critical":
        return critical_pair(own, context)
    if hold == "yarn":
        return int((context * own.double() / (2 * math.pi) > 32).sum())
    if hold == "none":
        return 0
    raise ValueError(f"--hold must be one of {', '.join(HOLDS)}, got {hold!r}")


def constrained(factors: list[float], free_from: int, cap: float) -> tuple[float, ...]:
    """``factors`` held to the constraints: 1 below ``free_from``, within [1, cap], non-decreasing, rounded."""
    out, low = [], 1.0
    for i, f in enumerate(factors):
        f = 1.0 if i < free_from else min(max(float(f), low, 1.0), cap)
        low = f
        out.append(round(f, DECIMALS))
    return tuple(out)


def _increments(factors: tuple[float, ...]) -> list[float]:
    logs = [math.log(f) for f in factors]
    return [logs[0]] + [b - a for a, b in zip(logs, logs[1:])]


def _from_increments(deltas: list[float]) -> list[float]:
    out, total = [], 0.0
    for d in deltas:
        total += max(d, 0.0)
        out.append(math.exp(total))
    return out


def mutate(rng: random.Random, c: Candidate, free_from: int, cap: float, rate: float, step: float,
           attention: bool) -> Candidate:
    """Each free pair's log-increment moved with probability ``rate`` by a normal step of ``step`` (in ln lambda),
    at least one pair moved; the attention factor moved by a normal step of 0.02 when it is searched."""
    deltas = _increments(c.factors)
    free = list(range(free_from, len(deltas)))
    moved = [i for i in free if rng.random() < rate] or ([rng.choice(free)] if free else [])
    for i in moved:
        deltas[i] = max(0.0, deltas[i] + rng.gauss(0.0, step))
    new_attention = c.attention
    if attention:
        lo, hi = ATTENTION_RANGE
        new_attention = round(min(max((c.attention or 1.0) + rng.gauss(0.0, 0.02), lo), hi), DECIMALS)
    return Candidate(constrained(_from_increments(deltas), free_from, cap), new_attention, "mutation")


def crossover(rng: random.Random, a: Candidate, b: Candidate, free_from: int, cap: float) -> Candidate:
    """Each pair's log-increment taken from ``a`` or ``b`` at random (uniform crossover), and one of their
    attention factors."""
    da, db = _increments(a.factors), _increments(b.factors)
    deltas = [x if rng.random() < 0.5 else y for x, y in zip(da, db)]
    attention = a.attention if rng.random() < 0.5 else b.attention
    return Candidate(constrained(_from_increments(deltas), free_from, cap), attention, "crossover")


def seed_factors(method: str, own: torch.Tensor, context: int, factor: float) -> tuple[list[float], float]:
    """The per-pair factors own / new that ``method`` (default knobs) at ``factor`` implies on top of the frequencies
    ``own`` over ``context`` tokens, and its attention factor (each method's rule, as a composed patch applies it)."""
    scaling = SCALINGS[method]
    params = scaling.defaults({}, own.shape[-1], factor) if scaling.defaults else {}
    params = {**resolve_method(method).params, **params}
    new, attention = scaling.compose(own.float(), context, factor, params)
    return (own.double() / new.double()).tolist(), float(attention)

