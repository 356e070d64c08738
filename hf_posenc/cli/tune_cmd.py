"""``hf-posenc tune``: rank methods and knobs for a model at a target length, write best.json."""

from __future__ import annotations

import argparse
import dataclasses
import functools

from ..checkpoints.models import DEFAULT_MODEL
from ..config_syntax import parse_method_params
from ..eval.settings import RunSettings
from ..tuning.evolution import EvolutionSettings
from ..tuning.factors import HOLDS
from ..tuning.objective import DEPTHS, objectives
from ..tuning.search import SEARCHES, TuneSettings, search
from ..tuning.space import DEFAULT_METHODS
from .flags import (
    LoadFlags,
    OutputFlags,
    data_flags,
    depths,
    document_source,
    method_param_flag,
    names,
    positive,
    positive_float,
)
from .parser import DefaultsShown

LOAD = LoadFlags(DEFAULT_MODEL, tokenizer_help="where the tokenizer comes from when the model's folder has none.",
                 attention=True)


OUTPUT = OutputFlags("folder for tune.json, tune.md, the plot, best.json and the cells (the same command run again "
                     "resumes).", required=True, seed_help="random seed (passkey keys).",
                     plots_help="skip the PNG plot.")


def add_parser(sub) -> None:
    tu = sub.add_parser("tune", allow_abbrev=False, help="measure, don't guess: rank methods and knobs for a model at "
                        "a target length (successive halving, confirmed on unseen data), write best.json.",
                        formatter_class=DefaultsShown)
    g = tu.add_argument_group("model and candidates")
    LOAD.add(g)
    g.add_argument("--target-length", type=positive, required=True, help="the context length to extend to (tokens).")
    g.add_argument("--methods", type=names, default=None, help="methods whose grid is searched (default: "
                   f"{','.join(DEFAULT_METHODS)}); the grid per method is in 'hf_posenc.tuning.space' and the README.")
    g.add_argument("--space", default=None, metavar="FILE", help="a JSON file of candidates that replaces the grid: a "
                   "list of 'LABEL=METHOD:K=V,...' / {label, method, factor, params}, or {METHOD: {KNOB: [values]}}.")
    method_param_flag(g, "a knob fixed for every candidate that takes it (the grid does not vary it); repeatable.",
                      per_method=True)
    d = data_flags(tu, "test", "")
    d.add_argument("--corpus", choices=["python-docs"], default=None,
                   help="the built-in corpus (see 'eval ppl --help').")
    d.add_argument("--limit", type=positive, help="use at most this many documents.")
    s = tu.add_argument_group("search")
    s.add_argument("--budget-minutes", type=positive_float, default=None,
                   help="compute time the halving may spend (the cells' recorded seconds); default: no limit.")
    s.add_argument("--max-short-cost", type=float, default=0.01, help="a candidate whose perplexity on inputs of the "
                   "original length is more than this fraction above the unpatched model's is disqualified.")
    s.add_argument("--rank-by", choices=list(objectives()), default=None, help="passkey: passkey accuracy at "
                   "the target, then perplexity beyond the original context; ppl: the other way round; needle_ppl: "
                   "the loss of the answer tokens of needles hidden in prose (LongRoPE2). Default: passkey for "
                   "--search grid, ppl for --search evolution.")
    s.add_argument("--depths", type=depths, default=list(DEPTHS), help="passkey depths.")
    s.add_argument("--windows", type=positive, default=1, help="windows of each length per candidate at the first "
                   "rung (doubled at each rung).")
    s.add_argument("--keys", type=positive, default=1, help="passkey keys per depth at the first rung (doubled at "
                   "each rung).")
    s.add_argument("--reduction", type=positive, default=3, help="each rung keeps 1/reduction of the candidates.")
    s.add_argument("--chunk-size", type=positive, default=1024, help="tokens per LM-head chunk.")
    s.add_argument("--no-reference", action="store_true", help="confirm only the winner and the runner-up, not "
                   "also YaRN with its default knobs at the winner's factor (the reference).")
    _evolution_flags(tu)
    o = tu.add_argument_group("run and output")
    OUTPUT.add(o)


class _Given(argparse.Action):
    """Stores the flag's value and notes that it was given (a grid search refuses it, even at its default)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True if self.nargs == 0 else values)
        namespace.given_evolution = [*getattr(namespace, "given_evolution", []), option_string]


def _evolution_flags(tu) -> None:
    e = tu.add_argument_group("evolutionary search (--search evolution: per-dimension longrope factors, LongRoPE)")
    e.add_argument("--search", choices=list(SEARCHES), default="grid", help="grid: successive halving over the "
                   "methods' grids; evolution: search one longrope factor per rotary dimension (mutation and "
                   "crossover from PI's, NTK's, YaRN's and llama3's factors).")
    d, add = EvolutionSettings(), functools.partial(e.add_argument, action=_Given)  # (each noted when given)
    add("--population", type=positive, default=d.population, help="candidates per generation (>= 2).")
    add("--generations", type=positive, default=d.generations, help="generations of the search.")
    add("--mutation-rate", type=positive_float, default=d.mutation_rate, help="probability that a "
        "mutation moves each searched dimension's factor.")
    add("--mutation-step", type=positive_float, default=d.mutation_step, help="standard deviation of a "
        "mutation's step, in ln(factor).")
    add("--finalists", type=positive, default=d.finalists, help="the best candidates measured again on "
        "twice the windows (the ranking there picks the winner and checks the cheaper sample's).")
    add("--search-attention-factor", nargs=0, default=False, help="search the attention factor too "
        "(LongRoPE2), between 1 and 1.5; default: LongRoPE's sqrt(1 + ln s / ln L).")
    add("--hold", choices=list(HOLDS), default=d.hold, help="which high-frequency dimensions keep factor "
        "1: critical, those that turn at least once within the original context (LongRoPE2's critical "
        "dimension); yarn, those that turn more than 32 times there (the band YaRN leaves unchanged: its "
        "ramp stays within reach); none: every dimension searched.")


def _evolution(args) -> EvolutionSettings | None:
    given = EvolutionSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EvolutionSettings)})
    if args.search == "evolution":
        return given
    changed = list(dict.fromkeys(getattr(args, "given_evolution", [])))  # given, at their defaults too
    if changed:
        raise ValueError(f"{', '.join(changed)} belong(s) to --search evolution; add it, or drop them")
    return None


def run(args, command: str) -> int:
    settings = TuneSettings(args.target_length, args.methods, args.space, parse_method_params(args.method_param),
                            args.budget_minutes, args.max_short_cost, args.rank_by, tuple(args.depths), args.windows,
                            args.keys, args.reduction, args.chunk_size, not args.no_reference, args.search,
                            _evolution(args))
    run = RunSettings(LOAD.settings(args), methods=["none"], seed=args.seed,
                      output=OUTPUT.settings(args, command))
    report = search(settings, document_source(args), run)
    if report.get("written_by_another_process"):
        return 0
    print(report["table"])
    best = report["results"]["best"]
    print(f"\nresults: {args.output}/ (tune.json, tune.md" + (", plot" if not args.no_plots else "") + ")")
    if best:
        print(f"best: {best} -> {args.output}/best.json (apply: hf-posenc patch --config {args.output}/best.json ...)")
    return 0
