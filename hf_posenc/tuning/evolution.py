"""``hf-posenc tune --search evolution``: LongRoPE's evolutionary search of per-dimension RoPE factors (Ding et al.
2024, arXiv:2402.13753, Algorithm 1), scored as LongRoPE2 scores it when ranking by ``needle_ppl``.

The population starts from the factors the static scalings imply at the target (:data:`factors.SEED_METHODS` at the
grid's factors; on an already-scaled checkpoint also its own, all ones), filled up with their mutations. Each
generation measures every new candidate on the calibration sample (``windows`` windows of the target length, and
of the original length for the short-input cost), ranks them as the grid search does (a candidate costing inputs
of the original length more than ``max_short_cost`` is disqualified), keeps the best half as parents and makes the
rest of the next generation from them by mutation and crossover (:mod:`.factors`), never a candidate measured
before. The ``finalists`` best of all generations are then measured on twice the windows: the ranking on that larger
sample picks the winner, and its agreement with the generations' ranking (Kendall's tau) says how far the cheaper
sample can be trusted. The winner and the runner-up are confirmed on data never used for ranking, beside the
unpatched model and YaRN with its default knobs (the reference), as the grid search confirms.

Every random draw comes from one generator seeded by ``--seed``, and a candidate's label is a digest of its
factors, so the same command draws the same candidates and finds every cell already computed. The short-input cost
of a candidate depends only on its attention factor (inputs up to the original context take the short factors,
the checkpoint's own): candidates sharing one share those cells. The budget counts recorded compute seconds, as the
grid search's does.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Any

import torch

from ..adapters import rope_compose
from ..adapters.layout import rope_geometry, rotary_slots
from ..adapters.remapped_layers import own_frequencies
from ..adapters.rope_compose import LENGTH_DEPENDENT_TYPES
from ..config import PosEncConfig
from ..encodings import rope as R
from ..eval.variants import Variant
from ..io.logs import errors_only
from .factors import HOLDS, SEED_METHODS, Candidate, constrained, crossover, held_pairs, mutate, seed_factors
from .objective import CellComputer, TuneData, kind_of, measure, rank, result_fields, sample_keys
from .space import BASELINE, yarn_reference
from .space import factors as grid_factors


@dataclass(frozen=True)
class EvolutionSettings:
    """The evolutionary search's knobs: ``population`` candidates per generation, ``generations``, the per-pair
    ``mutation_rate`` and ``mutation_step`` (in ln lambda), the ``finalists`` measured on the larger sample,
    whether the attention factor is searched too (``search_attention_factor``; else LongRoPE's default), and which
    leading pairs keep factor 1 (``hold``: "critical", "yarn" or "none", :func:`factors.held_pairs`)."""

    population: int = 8
    generations: int = 4
    mutation_rate: float = 0.3
    mutation_step: float = 0.1
    finalists: int = 4
    search_attention_factor: bool = False
    hold: str = "critical"

    def __post_init__(self):
        for name, least in (("population", 2), ("generations", 1), ("finalists", 2)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"--{name} is a whole number >= {least}, got {value!r}")
        if not 0 < self.mutation_rate <= 1:
            raise ValueError(f"--mutation-rate is a probability in (0, 1], got {self.mutation_rate!r}")
        if not 0 < self.mutation_step < 5:
            raise ValueError(f"--mutation-step is a step in ln(factor), in (0, 5), got {self.mutation_step!r}")
        if self.hold not in HOLDS:
            raise ValueError(f"--hold must be one of {', '.join(HOLDS)}, got {self.hold!r}")


@dataclass(frozen=True)
class Frequencies:
    """What the search extends: the checkpoint's own frequencies (plain RoPE's, or its scaled ones), over its
    ``context``; ``pinned``: the original context every candidate is given (then the plain frequencies);
    ``checkpoint``: an already-scaled checkpoint's RoPE, which the candidates compose on (None: plain RoPE)."""

    own: torch.Tensor
    context: int
    pinned: int | None
    checkpoint: rope_compose.OwnRope | None = None

    @property
    def scaled(self) -> bool:
        return self.checkpoint is not None


def frequencies_of(model, context: int, pinned: int | None) -> Frequencies:
    """The frequencies the factors divide, refused by name where a per-dimension search does not apply."""
    slots = rotary_slots(model)
    name = type(model).__name__
    if not slots:
        raise ValueError(f"--search evolution searches RoPE factors, and {name} has no rotary embedding")
    if slots[0].layer_type is not None:
        types = ", ".join(s.layer_type for s in slots)
        raise ValueError(f"--search evolution: {name} has one RoPE per layer type ({types}), "
                         "and one longrope configuration cannot hold their different factors; it is not supported yet")
    lm = model.config.get_text_config()
    rp = slots[0].rope_parameters(lm)
    if pinned is not None:
        geom = rope_geometry(lm, pinned, rp)
        return Frequencies(R.default_inv_freq(geom.base, geom.dim).double(), pinned, pinned)
    if rp.get("rope_type", "default") in LENGTH_DEPENDENT_TYPES:
        raise ValueError(f"--search evolution: the checkpoint's RoPE is {rp['rope_type']!r}, whose frequencies change "
                         "with the input's length; give --method-param original_max_position_embeddings=N to search "
                         "factors that replace its scaling instead")
    own = own_frequencies(slots[0], lm).detach().double().cpu()
    scaled = rp.get("rope_type", "default") != "default"
    checkpoint = rope_compose.OwnRope(lm, rp, own, float(slots[0].get("attention_scaling"))) if scaled else None
    return Frequencies(own, context, None, checkpoint)


def quiet_composition():
    """The warning that a scaled checkpoint is extended from its own scaling, silenced for the block."""
    return errors_only(rope_compose.__name__)


def _kendall(a: list[str], b: list[str]) -> float | None:
    """Kendall's tau between two rankings of the same labels (None for fewer than 2)."""
    pos = {label: i for i, label in enumerate(b)}
    n, score = len(a), 0
    if n < 2:
        return None
    for i in range(n):
        for j in range(i + 1, n):
            score += 1 if pos[a[i]] < pos[a[j]] else -1
    return score / (n * (n - 1) / 2)


class Evolution:
    """One evolutionary search (see the module docstring); :meth:`run` returns the results of the report."""

    def __init__(self, job, plan, evo: EvolutionSettings, data: TuneData, settings: dict[str, Any], original: int,
                 freqs: Frequencies):
        self.job, self.plan, self.evo, self.data, self.settings = job, plan, evo, data, settings
        self.original, self.freqs = original, freqs
        self.factor = plan.target_length / original
        self.cap = 2 * self.factor
        self.free_from = held_pairs(freqs.own, freqs.context, evo.hold)
        if self.free_from >= freqs.own.shape[-1]:
            raise ValueError(f"--hold {evo.hold}: every rotary pair of the model turns within its context of "
                             f"{freqs.context} tokens, so every factor stays 1 and nothing is searched; give --hold "
                             "yarn or none")
        self.compute = CellComputer(job.loaded[0], job.loaded[1], data, original, plan.chunk_size)
        self.rng = random.Random(job.seed)
        self.seen: dict[str, Candidate] = {}
        self.metrics: dict[str, dict[str, Any]] = {}  # label -> numbers on the generations' sample
        self.seconds: dict[str, float] = {}

    # -- candidates as configurations -------------------------------------------------------------------------
    def config(self, c: Candidate) -> PosEncConfig:
        """``c`` as a longrope; on top of a scaled checkpoint its short factors are the checkpoint's own."""
        short = None if self.freqs.scaled else [1.0] * len(c.factors)
        params: dict[str, Any] = {"short_factor": short, "long_factor": list(c.factors)}
        if c.attention is not None:
            params["attention_factor"] = c.attention
        return PosEncConfig("longrope", self.factor, self.freqs.pinned, params)

    def short_variant(self, c: Candidate) -> Variant:
        """What inputs of the original length compute for ``c``: its short factors (all ones) and attention."""
        ones = tuple(1.0 for _ in c.factors)
        same = Candidate(ones, c.attention, "short")
        return Variant(same.label.replace("longrope-", "longrope-short-"), self.config(same))

    def long_everywhere(self, c: Candidate) -> Variant:
        """``c`` with its long factors for every length: what vLLM (with --max-model-len past L) and a GGUF compute.
        On an already-scaled checkpoint ``c`` is a composition whose short factors are the checkpoint's own, so the
        variant is its composed long factors (relative to the base frequencies) in both lists, replacing the
        checkpoint's scaling from the original context it records, with the composed attention factor."""
        cfg = self.config(c)
        label = f"{c.label}-long-factors-everywhere"
        own = self.freqs.checkpoint
        if own is None:
            return Variant(label, cfg.replace(params={**cfg.params, "short_factor": list(c.factors)}))
        with quiet_composition():  # what patching computes for c, from the checkpoint's RoPE
            composed = rope_compose.compose(cfg, own, self.freqs.context)
        long, start = composed.params["long_factor"], rope_compose.replacing_original(own)
        return Variant(label, PosEncConfig("longrope", self.plan.target_length / start, start, {
            "short_factor": list(long), "long_factor": list(long),
            "attention_factor": composed.params["attention_factor"]}))

    # -- measuring ---------------------------------------------------------------------------------------------
    def keys(self, part: str, windows: int, passkeys: int = 0) -> list[list]:
        p = self.plan
        windows = min(windows, len(self.data.long[part]))
        keys = sample_keys(self.data, part, windows, max(passkeys, 1), p.depths, self.job.seed, p.target_length,
                           self.original, needles=p.rank_by == "needle_ppl")
        return [k for k in keys if passkeys or kind_of(k) != "passkey"]

    def evaluate(self, cands: list[Candidate], keys: list[list], desc: str,
                 extra: list[Variant] = ()) -> dict[str, dict[str, Any]]:
        """The numbers of ``cands`` (and of the unpatched model and ``extra`` variants, on every key) on ``keys``;
        a candidate's short windows are computed once per attention factor."""
        shorts = [k for k in keys if kind_of(k) == "short"]
        rest = [k for k in keys if kind_of(k) != "short"]
        variants = {BASELINE.label: (BASELINE, keys), **{v.label: (v, keys) for v in extra}}
        for c in cands:
            variants[c.label] = (Variant(c.label, self.config(c)), rest)
            s = self.short_variant(c)
            variants.setdefault(s.label, (s, shorts))
        done = self.job.cells("tune", self.settings, {label: k for label, (_, k) in variants.items()}, self.compute,
                              variants=[v for v, _ in variants.values()], desc=desc, fields=result_fields)
        out = {}
        for label, (v, k) in variants.items():
            if v.label.startswith("longrope-short-"):  # counted in the budget, shown with its candidates
                self.seconds[label] = self.job.cell_seconds("tune", label, k)
                continue
            cells, used = list(done[label]), list(k)
            if label not in (BASELINE.label, *(e.label for e in extra)):
                s = self.short_variant(self.seen[label]).label
                cells, used = cells + done[s], used + shorts
            m = measure(used, cells)
            m["seconds"] = self.job.cell_seconds("tune", label, k)
            self.seconds[label] = m["seconds"]
            out[label] = m
        return out

    @property
    def spent(self) -> float:
        return sum(self.seconds.values())

    # -- the search --------------------------------------------------------------------------------------------
    def seeds(self) -> list[Candidate]:
        """The first generation's seeds: on a scaled checkpoint its own factors (all ones), then each static
        scaling's factors at the extension ratio, then at the grid's other factors (nearest first)."""
        out: dict[str, Candidate] = {}
        if self.freqs.scaled:  # its frequencies and its attention, unchanged
            own = Candidate(tuple(1.0 for _ in range(self.freqs.own.shape[-1])), 1.0, "the checkpoint's own")
            out[own.label] = own
        ratios = sorted({self.factor, *grid_factors(self.original, self.plan.target_length)},
                        key=lambda f: (abs(f - self.factor), f))
        for f in ratios:
            for method in SEED_METHODS:
                lam, added = seed_factors(method, self.freqs.own, self.freqs.context, f)
                c = Candidate(constrained(lam, self.free_from, self.cap),
                              round(added, 4) if self.evo.search_attention_factor else None, f"{method} x{f:g}")
                if c.label in out:  # the constraints made two methods one candidate: it is named for both
                    c = Candidate(c.factors, c.attention, f"{out[c.label].origin}, {method} x{f:g}")
                out[c.label] = c
        return list(out.values())[: self.evo.population]

    def children(self, parents: list[Candidate], count: int) -> list[Candidate]:
        out: list[Candidate] = []
        tries = 0
        while len(out) < count and tries < 50 * count:
            tries += 1
            if len(parents) >= 2 and self.rng.random() < 0.5:
                a, b = self.rng.sample(parents, 2)
                child = crossover(self.rng, a, b, self.free_from, self.cap)
            else:
                child = mutate(self.rng, self.rng.choice(parents), self.free_from, self.cap, self.evo.mutation_rate,
                               self.evo.mutation_step, self.evo.search_attention_factor)
            if child.label not in self.seen and all(child.label != o.label for o in out):
                out.append(child)
        return out

    def generation(self, number: int, cands: list[Candidate], baseline_keys: list[list]) -> dict[str, Any]:
        for c in cands:
            self.seen.setdefault(c.label, c)
        new = [c for c in cands if c.label not in self.metrics]
        print(f"tune generation {number}: {len(new)} new candidate(s) of {len(cands)} x {len(baseline_keys)} cells",
              file=sys.stderr)
        got = self.evaluate(new or cands[:1], baseline_keys, f"tune generation {number}")
        self.baseline = got.pop(BASELINE.label)
        self.metrics.update(got)
        pool = {c.label: self.metrics[c.label] for c in cands}
        order = rank(pool, self.baseline, self.plan.max_short_cost, self.plan.rank_by)
        return {"generation": number, "candidates": [c.label for c in cands], "new": [c.label for c in new],
                "ranking": order, "best": order[0]}

    def run(self) -> dict[str, Any]:
        if self.freqs.scaled:
            print(f"tune: the checkpoint's RoPE is already scaled: the factors searched divide its own frequencies "
                  f"(past its context of {self.freqs.context} tokens; inputs up to it keep them)", file=sys.stderr)
        with quiet_composition():  # said once above, not once per candidate and cell
            return self._run()

    def check_short(self, population: list[Candidate], sample: list[list]) -> None:
        """An error before any long cell when every candidate of the first generation costs inputs of the original
        length more than ``max_short_cost`` (their short cells, one set per attention factor, are cheap)."""
        shorts = [k for k in sample if kind_of(k) == "short"]
        reps = {v.label: v for v in (self.short_variant(c) for c in population)}
        done = self.job.cells("tune", self.settings, {BASELINE.label: shorts, **dict.fromkeys(reps, shorts)},
                              self.compute, variants=[BASELINE, *reps.values()], desc="tune: short inputs",
                              fields=result_fields)
        base = measure(shorts, done[BASELINE.label])["ppl_short"]
        costs = [measure(shorts, done[label])["ppl_short"] / base - 1 for label in reps]
        limit = self.plan.max_short_cost
        if min(costs) > limit:
            raise ValueError(f"--search evolution: every candidate of the first generation costs inputs of "
                             f"{self.original} tokens more than --max-short-cost {100 * limit:g}% (at least "
                             f"{100 * min(costs):+.2f}%: the attention factor scales them too); give "
                             "--search-attention-factor (searched from 1.0, which leaves them as they were) or a "
                             "larger --max-short-cost")

    def _run(self) -> dict[str, Any]:
        sample = self.keys("calibration", self.plan.windows)
        population, generations, stopped = self.seeds(), [], False
        self.check_short(population, sample)
        if len(population) < self.evo.population:
            for c in population:
                self.seen.setdefault(c.label, c)
            population += self.children(population, self.evo.population - len(population))
        for g in range(self.evo.generations):
            generations.append(self.generation(g, population, sample))
            if g + 1 == self.evo.generations:
                break
            if self.over_budget(len(sample)):
                stopped = True
                print(f"tune: the budget ({self.plan.budget_seconds / 60:g} min) stops the search after generation {g}",
                      file=sys.stderr)
                break
            keep = max(2, self.evo.population // 2)
            parents = [self.seen[label] for label in generations[-1]["ranking"][:keep]]
            population = parents + self.children(parents, self.evo.population - len(parents))
        return self.finish(generations, stopped)

    def over_budget(self, cells: int) -> bool:
        if self.plan.budget_seconds is None or not self.metrics:
            return False
        per_candidate = self.spent / max(len(self.metrics), 1)
        upcoming = self.evo.population - max(2, self.evo.population // 2) + self.evo.finalists + 4
        return self.spent + per_candidate * upcoming > self.plan.budget_seconds

    def overall(self) -> list[str]:
        """Every candidate measured, best first on the generations' sample."""
        pool = dict(self.metrics)
        return rank(pool, self.baseline, self.plan.max_short_cost, self.plan.rank_by)

    def finish(self, generations: list[dict[str, Any]], stopped: bool) -> dict[str, Any]:
        proxy = self.overall()[: self.evo.finalists]
        windows = min(2 * self.plan.windows, len(self.data.long["calibration"]))
        full_keys = self.keys("calibration", windows)
        full = self.evaluate([self.seen[label] for label in proxy], full_keys, "tune finalists")
        full_baseline = full.pop(BASELINE.label)
        full_order = rank(full, full_baseline, self.plan.max_short_cost, self.plan.rank_by)
        top = [label for label in full_order[:2] if not full[label]["disqualified"]]
        finalists = {"windows": windows, "proxy_windows": min(self.plan.windows, len(self.data.long["calibration"])),
                     "proxy_ranking": proxy, "ranking": full_order, "kendall_tau": _kendall(proxy, full_order),
                     "baseline": full_baseline, "metrics": full}
        return {"search": "evolution", "best": top[0] if top else None,
                "runner_up": top[1] if len(top) > 1 else None, "stopped_by_budget": stopped,
                "generations": generations, "metrics": self.metrics, "baseline": self.baseline,
                "finalists": finalists, "confirmation": self.confirm(top, windows),
                "reference": self._reference_entry(),
                "candidates": {label: {"origin": c.origin, "factors": list(c.factors), "attention": c.attention}
                               for label, c in self.seen.items()},
                "free_from": self.free_from, "factor": self.factor,
                "seed_factors": self.seed_table(),
                "configs": {label: self.config(c).to_dict() for label, c in self.seen.items()},
                "evaluations": len(self.metrics)}

    def reference(self) -> Variant:
        return yarn_reference(self.factor, self.freqs.pinned)

    def _reference_entry(self) -> dict[str, Any] | None:
        if not self.plan.reference:
            return None
        ref = self.reference()
        return {"label": ref.label, "config": ref.config.to_dict()}

    def confirm(self, top: list[str], windows: int) -> dict[str, Any]:
        windows = min(windows, len(self.data.long["confirmation"]))
        out: dict[str, Any] = {"windows": windows, "keys_per_depth": self.plan.keys, "baseline": None, "metrics": {}}
        if not top:
            return out
        keys = self.keys("confirmation", windows, passkeys=self.plan.keys)
        extra = [self.reference()] if self.plan.reference else []
        got = self.evaluate([self.seen[label] for label in top], keys, "tune confirmation", extra=extra)
        baseline = got.pop(BASELINE.label)
        rank(got, baseline, self.plan.max_short_cost, self.plan.rank_by)
        out.update(baseline=baseline, metrics=got)
        everywhere = self.long_everywhere(self.seen[top[0]])
        shorts = [k for k in keys if kind_of(k) == "short"]
        cells = self.job.cells("tune", self.settings, {everywhere.label: shorts}, self.compute, variants=[everywhere],
                               desc="tune: long factors at short inputs", fields=result_fields)
        short = measure(shorts, cells[everywhere.label])
        out.update(long_everywhere={
            "label": everywhere.label, "config": everywhere.config.to_dict(), "ppl_short": short["ppl_short"],
            "short_cost": short["ppl_short"] / baseline["ppl_short"] - 1})
        return out

    def seed_table(self) -> dict[str, list[float]]:
        """The factors per pair of PI, NTK and YaRN at the extension ratio (before the constraints), for the plot."""
        return {method: seed_factors(method, self.freqs.own, self.freqs.context, self.factor)[0]
                for method in ("pi", "ntk", "yarn")}
