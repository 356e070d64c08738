"""``hf-posenc tune``: successive halving over candidate configurations, then a confirmation on unseen data.

Rung 0 measures every candidate (and the unpatched model, the reference for the short-input cost) on a small
calibration sample: ``windows`` windows of each length and ``keys`` passkey keys per depth. Each next rung keeps
the best third (``reduction``; at least 2) and doubles the sample, reusing the cells already computed, until
2 candidates are left or the budget would be passed. The winner and the runner-up are then measured again, with
the unpatched model, on the confirmation part (windows and keys never used for ranking), beside the reference
(YaRN with its default knobs at the winner's factor, or at T / L rounded up to a half when the winner takes
none): what tuning gained over the usual default. The budget counts the compute time recorded in the cells, so
a resumed run takes the same decisions as the run it resumes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from ..checkpoints.context import original_context
from ..checkpoints.models import ModelSource
from ..config import PosEncConfig
from ..eval.common import Run
from ..eval.perplexity import doc_digest
from ..eval.scoring import require_causal_lm
from ..eval.settings import KEYWORDS, RunSettings
from ..eval.variants import Variant
from ..io.documents import DocumentSource, documents_of, tokenize_documents
from ..methods import resolve_method
from ..methods.rope import SCALINGS
from .evolution import Evolution, EvolutionSettings, frequencies_of, quiet_composition
from .evolution_report import evolution_plots, evolution_table
from .needles import check_needles
from .objective import DEPTHS, CellComputer, TuneData, measure, plan_data, rank, ranking, result_fields, sample_keys
from .report import tune_plots, tune_table, write_best
from .space import (
    BASELINE,
    DEFAULT_METHODS,
    check_methods,
    check_pinned,
    factors,
    grid_candidates,
    load_space,
    yarn_reference,
)

SEARCHES = ("grid", "evolution")
# the documents, as the CLI's data flags give them (io.documents.gather_documents), and the run's keywords
DATA_KEYWORDS = ("text_file", "text_dir", "dataset", "dataset_config", "split", "column", "limit", "corpus",
                 "encoding")
RUN_KEYWORDS = set(KEYWORDS) - {"model", "methods", "factor", "method_params", "variants", "tokenizer", "loaded"}


@dataclass(frozen=True)
class TuneSettings:
    """What ``hf-posenc tune`` searches and how (its flags; see the module docstring): the ``target_length``, the
    candidates (``methods``' grids, or a ``space`` file; ``method_params`` pinned for them), the ``budget_minutes``,
    ``max_short_cost``, ``rank_by`` (default: passkey for the grid, ppl for the evolution), the passkey ``depths``,
    ``windows`` and ``keys`` per candidate, the successive halving's ``reduction``, the LM head's ``chunk_size``,
    whether YaRN's paper setting runs beside them as a ``reference``, and the ``search``: "grid" (successive
    halving over the candidates) or "evolution" (per-dimension longrope factors, :mod:`.evolution`, with
    ``evolution``'s knobs). Checked when made (a bad space file or method before the slow load)."""

    target_length: int
    methods: list[str] | None = None
    space: str | None = None
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    budget_minutes: float | None = None
    max_short_cost: float = 0.01
    rank_by: str | None = None
    depths: tuple[float, ...] = DEPTHS
    windows: int = 1
    keys: int = 1
    reduction: int = 3
    chunk_size: int = 1024
    reference: bool = True
    search: str = "grid"
    evolution: EvolutionSettings | None = None

    def __post_init__(self):
        if self.search not in SEARCHES:
            raise ValueError(f"--search must be one of {', '.join(SEARCHES)}, got {self.search!r}")
        if self.rank_by is None:
            object.__setattr__(self, "rank_by", "passkey" if self.search == "grid" else "ppl")
        if self.search == "evolution":
            self._check_evolution()
        elif self.evolution is not None:
            raise ValueError("the evolution's settings (population, generations, ...) are for --search evolution")
        for name in ("target_length", "windows", "keys", "reduction", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} is a whole number >= 1, got {value!r}")
        if self.methods is not None and (isinstance(self.methods, str) or
                                         not all(isinstance(m, str) for m in self.methods)):
            raise ValueError(f"methods is a list of method names, e.g. ['yarn', 'ntk'], got {self.methods!r}")
        if not 0 <= self.max_short_cost < float("inf"):
            raise ValueError(f"--max-short-cost is a fraction >= 0 (0.01 = 1%), got {self.max_short_cost}")
        ranking(self.rank_by)
        if self.reduction < 2 or self.windows < 1 or self.keys < 1:
            raise ValueError(f"--reduction must be >= 2 and --windows, --keys >= 1, got reduction={self.reduction}, "
                             f"windows={self.windows}, keys={self.keys}")
        if any(not 0 <= d <= 1 for d in self.depths):
            raise ValueError(f"--depths must lie in [0, 1], got {list(self.depths)}")
        if self.budget_minutes is not None and not self.budget_minutes > 0:
            raise ValueError(f"--budget-minutes must be > 0, got {self.budget_minutes}")
        if self.space and self.methods:
            raise ValueError("--space replaces the grid of --methods: give one or the other")
        if self.methods:
            check_methods(self.methods)

    def _check_evolution(self) -> None:
        if self.evolution is None:
            object.__setattr__(self, "evolution", EvolutionSettings())
        if self.space:
            raise ValueError("--search evolution makes its own candidates: drop --space")
        for name in self.methods or ["longrope"]:
            if not getattr(SCALINGS.get(resolve_method(name).name), "per_dimension", False):
                per_dim = ", ".join(n for n, sc in SCALINGS.items() if sc.per_dimension)
                raise ValueError(f"--search evolution searches one factor per rotary dimension; {name!r} has no "
                                 f"per-dimension factors (methods that have them: {per_dim})")
        if self.rank_by == "passkey":
            raise ValueError("--search evolution ranks by a perplexity (ppl or needle_ppl), which separates "
                             "candidates that passkey accuracy ties: give --rank-by ppl or needle_ppl")

    @property
    def budget_seconds(self) -> float | None:
        return None if self.budget_minutes is None else 60 * self.budget_minutes


class Search:
    """One tune run: the candidates, the data, the cells, the rungs."""

    def __init__(self, job: Run, plan: TuneSettings, candidates: list[Variant], data: TuneData,
                 settings: dict[str, Any], chunk_size: int = 1024, original: int | None = None,
                 pinned: int | None = None):
        """``original``: the context L the search extends (default: the model's; the pinned one when given);
        ``pinned``: an ``original_max_position_embeddings`` fixed for every candidate, which the reference takes too."""
        self.job, self.plan, self.candidates, self.data, self.settings = job, plan, candidates, data, settings
        self.original = original or original_context(job.loaded[0])
        self.pinned = pinned
        self.compute = CellComputer(job.loaded[0], job.loaded[1], data, self.original, chunk_size)
        self.seconds: dict[str, float] = {}  # compute seconds recorded in each label's cells so far
        self.rungs: list[dict[str, Any]] = []

    @property
    def spent(self) -> float:
        return sum(self.seconds.values())

    def keys(self, part: str, windows: int, keys: int) -> list[list]:
        p = self.plan
        windows = min(windows, len(self.data.long[part]))
        return sample_keys(self.data, part, windows, keys, p.depths, self.job.seed, p.target_length, self.original,
                           needles=p.rank_by == "needle_ppl")

    def measure(self, variants: list[Variant], keys: list[list], desc: str) -> dict[str, dict[str, Any]]:
        done = self.job.cells("tune", self.settings, {v.label: keys for v in variants}, self.compute,
                              variants=variants, desc=desc, fields=result_fields)
        out = {label: {**measure(keys, cells), "seconds": self.job.cell_seconds("tune", label, keys)}
               for label, cells in done.items()}
        self.seconds.update({label: m["seconds"] for label, m in out.items()})
        return out

    def over_budget(self, metrics: dict[str, dict], survivors: int, now: list[list], windows: int, keys: int) -> bool:
        """Whether a next rung of ``windows`` and ``keys`` (its new cells, for the survivors and the unpatched
        model) and the confirmation after it (3 variants) would pass the budget, at the seconds per cell so far."""
        if self.plan.budget_seconds is None:
            return False
        per_cell = sum(m["seconds"] for m in metrics.values()) / (len(metrics) * len(now))
        later = len(self.keys("calibration", windows, keys))
        confirm = len(self.keys("confirmation", windows, keys)) * (3 + self.plan.reference)
        return self.spent + per_cell * ((survivors + 1) * (later - len(now)) + confirm) > self.plan.budget_seconds

    def run(self) -> dict[str, Any]:
        p, alive, windows, keys = self.plan, list(self.candidates), self.plan.windows, self.plan.keys
        stopped_by_budget = False
        while True:
            sample, rung = self.keys("calibration", windows, keys), len(self.rungs)
            print(f"tune rung {rung}: {len(alive)} candidates (and the unpatched model) x {len(sample)} cells",
                  file=sys.stderr)
            metrics = self.measure([BASELINE, *alive], sample, f"tune rung {rung}")
            baseline = metrics.pop(BASELINE.label)
            order = rank(metrics, baseline, p.max_short_cost, p.rank_by)
            self.rungs.append({"rung": rung, "windows": min(windows, len(self.data.long["calibration"])),
                            "keys_per_depth": keys, "baseline": baseline, "ranking": order, "metrics": metrics})
            if len(alive) <= 2:
                break
            keep = max(2, math.ceil(len(alive) / p.reduction))
            if self.over_budget({**metrics, "none": baseline}, keep, sample, windows * 2, keys * 2):
                stopped_by_budget = True
                print(f"tune: the budget ({p.budget_seconds / 60:g} min) stops the halving after rung {rung}",
                      file=sys.stderr)
                break
            alive = [v for label in order[:keep] for v in alive if v.label == label]
            windows, keys = windows * 2, keys * 2
        return self.confirm(order, stopped_by_budget)

    def confirm(self, order: list[str], stopped_by_budget: bool) -> dict[str, Any]:
        last = self.rungs[-1]
        top = [label for label in order[:2] if not last["metrics"][label]["disqualified"]]
        conf_windows = min(last["windows"], len(self.data.long["confirmation"]))
        chosen = [v for label in top for v in self.candidates if v.label == label]
        reference = self.reference(chosen[0]) if chosen and self.plan.reference else None
        if reference is not None and all(v.config != reference.config for v in chosen):
            chosen.append(reference)
        sample = self.keys("confirmation", conf_windows, last["keys_per_depth"])
        confirmed = self.measure([BASELINE, *chosen], sample, "tune confirmation") if chosen else {}
        baseline = confirmed.pop(BASELINE.label, None)
        if baseline is not None:
            rank(confirmed, baseline, self.plan.max_short_cost, self.plan.rank_by)
        return {"best": top[0] if top else None, "runner_up": top[1] if len(top) > 1 else None,
                "reference": None if reference is None else {"label": reference.label,
                                                             "config": reference.config.to_dict()},
                "stopped_by_budget": stopped_by_budget, "rungs": self.rungs,
                "confirmation": {"windows": conf_windows, "keys_per_depth": last["keys_per_depth"],
                                 "baseline": baseline, "metrics": confirmed},
                "configs": {v.label: v.config.to_dict() for v in self.candidates},
                "reached": {v.label: max(r["rung"] for r in self.rungs if v.label in r["metrics"])
                            for v in self.candidates}}

    def reference(self, winner: Variant) -> Variant:
        """YaRN with its default knobs at ``winner``'s factor (or the least half-step factor reaching the target)."""
        takes_factor = resolve_method(winner.config.method).uses_factor
        factor = winner.config.factor if takes_factor else factors(self.original, self.plan.target_length)[0]
        reference = yarn_reference(factor, self.pinned)
        same = [v for v in self.candidates if v.config == reference.config]
        return same[0] if same else reference


TUNE_KEYWORDS = tuple(f.name for f in dataclasses.fields(TuneSettings))
EVOLUTION_KEYWORDS = tuple(f.name for f in dataclasses.fields(EvolutionSettings))


def tune(model, tokenizer=None, *, docs=None, **keywords: Any) -> dict[str, Any]:
    """Find the method and knobs for ``model`` at ``target_length`` (see the module docstring).

    Args:
        model: a name (Hub id, folder, alias) or a loaded model (then ``tokenizer`` too).
        tokenizer: the loaded model's tokenizer.
        docs: the documents (:class:`hf_posenc.io.documents.Document` s); else the data keywords, else the default
            corpus.
        **keywords: :class:`TuneSettings`' (at least ``target_length``; ``search="evolution"`` with
            :class:`hf_posenc.tuning.evolution.EvolutionSettings`' keywords: ``population``, ``generations``, ...),
            the documents' as the CLI's data flags
            say them (``text_file``, ``text_dir``, ``dataset``, ``corpus``, ...: ``DATA_KEYWORDS``) and the run's
            (:data:`hf_posenc.eval.settings.KEYWORDS`: seed, output, dtype, device, ...).

    Returns:
        The report; with ``output``, ``tune.json``, ``tune.md``, a plot and ``best.json`` (the winner's
        :class:`PosEncConfig`) are written.
    """
    own = {k: keywords.pop(k) for k in TUNE_KEYWORDS if k in keywords}
    evolution = {k: keywords.pop(k) for k in EVOLUTION_KEYWORDS if k in keywords}
    if evolution:
        own["evolution"] = EvolutionSettings(**evolution)
    data_keys = {k: keywords.pop(k) for k in DATA_KEYWORDS if k in keywords}
    _check_keywords(docs, data_keys, keywords)
    if "target_length" not in own:
        raise ValueError("tune() needs target_length= (the context to extend the model to)")
    settings = TuneSettings(**{**own, "method_params": own.get("method_params") or {}})
    source = DocumentSource(**data_keys) if docs is None else docs
    return search(settings, source, _run_settings(model, tokenizer, keywords))


def search(settings: TuneSettings, docs, run: RunSettings) -> dict[str, Any]:
    """:func:`tune` with its settings made: ``docs`` the documents (a list, or a
    :class:`hf_posenc.io.documents.DocumentSource`), ``run`` the model and how it loads, the seed and the output (its
    methods are not read: the search makes its candidates)."""
    target_length, plan = settings.target_length, settings
    spaced = load_space(settings.space) if settings.space else None  # a bad file is found before the slow load
    methods, max_short_cost, rank_by = settings.methods, settings.max_short_cost, settings.rank_by
    windows, keys, reduction, reference = settings.windows, settings.keys, settings.reduction, settings.reference
    method_params, pinned = pinned_original(settings.method_params)
    if not spaced:
        default = ["longrope"] if settings.search == "evolution" else DEFAULT_METHODS
        check_pinned(list(methods or default), method_params)
    docs = documents_of(docs)  # read (a bad file refused) before the slow load
    with Run(dataclasses.replace(run, methods=["none"], variants=None)) as job:
        lm, tok, _ = job.load()
        require_causal_lm(lm)  # its objective is perplexity and the teacher-forced passkey
        original = pinned or original_context(lm)
        if original is None:
            raise ValueError(f"{type(lm).__name__} has no fixed context length: tune extends RoPE decoders")
        if rank_by == "needle_ppl":
            check_needles(tok, target_length, plan.depths)
        token_docs = tokenize_documents(tok, docs)
        recorded = {"target_length": target_length, "max_short_cost": max_short_cost, "rank_by": rank_by,
                    "depths": list(plan.depths), "windows": windows, "keys": keys, "reduction": reduction,
                    "reference": reference}
        if plan.search == "evolution":
            report = _evolve(job, plan, token_docs, docs, recorded, original, pinned, method_params)
        else:
            candidates = spaced or grid_candidates(list(methods or DEFAULT_METHODS), original, target_length,
                                                   method_params)
            job.variants = [BASELINE, *(pin_original(v, pinned) for v in candidates)]
            data = plan_data(token_docs, [d.name for d in docs], [doc_digest(t) for t in token_docs], original,
                             target_length)
            recorded.update(documents=data.names, document_tokens=[len(t) for t in token_docs])
            # the budget changes which cells are computed, never a cell: a resumed run may change it
            results = Search(job, plan, job.variants[1:], data, recorded, settings.chunk_size, original, pinned).run()
            report = job.report("tune", {**recorded, "budget_minutes": settings.budget_minutes}, results, tune_table,
                                tune_plots)
        if job.output and job.processes.is_main:
            write_best(report, job.output)
        return report


def _evolve(job: Run, plan: TuneSettings, token_docs, docs, recorded: dict[str, Any], original: int,
            pinned: int | None, method_params: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The evolutionary search's report (:mod:`.evolution`); its checks come before any cell."""
    if plan.target_length <= original:
        raise ValueError(f"--target-length {plan.target_length} is within the model's original context ({original}):"
                         " there is nothing to extend; give a target beyond it")
    knobs = sorted(f"{m}:{k}" if m != "*" else k for m, ks in method_params.items() for k in ks)
    if knobs:
        raise ValueError(f"--search evolution searches longrope's factors itself and seeds them from each method's "
                         f"default knobs: --method-param {', '.join(knobs)} cannot be fixed "
                         "(original_max_position_embeddings can)")
    freqs = frequencies_of(job.loaded[0], original, pinned)
    data = plan_data(token_docs, [d.name for d in docs], [doc_digest(t) for t in token_docs], original,
                     plan.target_length)
    recorded = {**recorded, "search": "evolution", "extended_context": original, "documents": data.names,
                "document_tokens": [len(t) for t in token_docs]}
    results = Evolution(job, plan, plan.evolution, data, recorded, original, freqs).run()
    chosen = [label for label in (results["best"], results["runner_up"]) if label]
    job.variants = [BASELINE, *(Variant(label, PosEncConfig.from_dict(results["configs"][label])) for label in chosen)]
    with quiet_composition():
        return job.report("tune", {**recorded, "budget_minutes": plan.budget_minutes,
                                   "evolution": dataclasses.asdict(plan.evolution)}, results, evolution_table,
                          evolution_plots)


def pinned_original(method_params: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], int | None]:
    """``method_params`` without ``original_max_position_embeddings``, and its value: a fixed original context
    applies to every candidate (and to the target check and the grid), whichever method it was given for."""
    key, rest, values = "original_max_position_embeddings", {}, set()
    for method, knobs in method_params.items():
        if key in knobs:
            values.add(json.dumps(knobs[key]))
        rest[method] = {k: v for k, v in knobs.items() if k != key}
    if len(values) > 1:
        raise ValueError(f"--method-param {key} is given {len(values)} values ({', '.join(sorted(values))}); the "
                         "original context is one for every candidate")
    if not values:
        return method_params, None
    value = json.loads(values.pop())
    PosEncConfig("none", original_max_position_embeddings=value)  # checked as every config checks it
    return rest, value


def pin_original(variant: Variant, pinned: int | None) -> Variant:
    """``variant`` with its ``original_max_position_embeddings`` set to ``pinned`` (when given and not its own)."""
    if pinned is None or variant.config.original_max_position_embeddings is not None:
        return variant
    return Variant(variant.label, variant.config.replace(original_max_position_embeddings=pinned))


def _check_keywords(docs, data_keys: dict[str, Any], run: dict[str, Any]) -> None:
    """Unknown keywords, or documents given twice, are refused before the slow load, naming what is allowed."""
    unknown = sorted(set(run) - RUN_KEYWORDS)
    if unknown:
        raise ValueError(f"tune() got unknown keyword(s) {', '.join(unknown)}; besides its own it takes the "
                         f"documents' ({', '.join(DATA_KEYWORDS)}) and the run's ({', '.join(sorted(RUN_KEYWORDS))})")
    if docs is not None and data_keys:
        raise ValueError(f"tune(): give docs or {', '.join(data_keys)}, not both")


def _run_settings(model, tokenizer, run: dict[str, Any]) -> RunSettings:
    if isinstance(model, (str, os.PathLike)):
        return RunSettings.of(model=os.fspath(model), methods=["none"], tokenizer=tokenizer, **run)
    if tokenizer is None or isinstance(tokenizer, str):
        raise ValueError("tune(model, tokenizer): a loaded model needs its loaded tokenizer")

    name = getattr(model.config, "_name_or_path", "") or type(model).__name__
    return RunSettings.of(model=name, methods=["none"], loaded=(model, tokenizer, ModelSource(name, {}, name)), **run)
