"""``hf-posenc tune --search evolution`` shown on a real model: SmolLM2-135M (original context 8,192), per-dimension
longrope factors searched for 12,288 and 16,384 tokens on one book (Pride and Prejudice), then measured on another
(Frankenstein) beside the usual formulas: YaRN at T / L with its default knobs, the grid tuner's pick
(``benchmarks/tune/<T>/best.json``, when that benchmark has run), PI, NTK, dynamic NTK and Self-Extend.

Per target, three ordinary commands (each printed in the section, each resumable from its cells):
1. ``hf-posenc tune --methods longrope --search evolution --search-attention-factor`` on the tuning book ->
   ``search/best.json`` (the attention factor searched too: LongRoPE's default one alone scales inputs of L tokens);
2. ``hf-posenc eval ppl`` on the other book: perplexity past L beside the truncated baseline (the context gain);
3. ``hf-posenc eval passkey --haystack text`` on the other book: needles in prose, ``--trials`` keys per depth, with
   the needles out of truncation's reach counted apart; its JSON also holds each variant's short-input cost through
   eval ppl at L (the ``--lengths`` of step 2 include L).

CPU cost (2 cores): a 12k forward is ~90 s. The search is about population + (generations - 1) x population / 2
candidates, one window each, plus the finalists on a second window and the confirmation (~50 forwards at the
defaults: ~75 min at 12k); eval ppl ~10 forwards per length; eval passkey 5 depths x --trials forwards per variant
(7 variants x 25 prompts = 175 forwards at the defaults: hours). Kill it and run it again: every step resumes.

    python scripts/bench_tune_evolution.py --write
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from _bench import ROOT, comma_list, rel, require_book, run_cli, run_needles_far_first

TUNE_BOOK = os.path.join(ROOT, "..", "shared", "data", "books", "pg1342.txt")
TEST_BOOK = os.path.join(ROOT, "..", "shared", "data", "books", "pg84.txt")
TITLE = "## Searched per-dimension factors: hf-posenc tune --search evolution on SmolLM2"
ORIGINAL = 8192


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, .gguf file or alias).")
    p.add_argument("--original", type=int, default=ORIGINAL, help="the model's original context.")
    p.add_argument("--targets", type=comma_list(int), default=[12288, 16384], help="target lengths (comma-separated).")
    p.add_argument("--tune-file", default=TUNE_BOOK, help="the book the search ranks on.")
    p.add_argument("--test-file", default=TEST_BOOK, help="the book the comparison measures on.")
    p.add_argument("--population", type=int, default=8, help="candidates per generation.")
    p.add_argument("--generations", type=int, default=4, help="generations of the search.")
    p.add_argument("--rank-by", default="ppl", choices=["ppl", "needle_ppl"], help="the search's fitness.")
    p.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9", help="needle depths.")
    p.add_argument("--trials", type=int, default=5, help="needle keys per depth in the comparison.")
    p.add_argument("--steps", default="search,ppl,passkey", help="the steps to run (comma-separated).")
    p.add_argument("--no-run", action="store_true", help="run no step: only write the section from the reports "
                   "already there (the command it records is the same without this flag).")
    p.add_argument("--device", default="cpu", help="torch device.")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "tune_evolution"), help="folder of the runs.")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars.")
    return p


def variants(args, target: int, searched: str | None) -> list[str]:
    """The ``--variant`` strings compared at ``target``."""
    from hf_posenc.config import PosEncConfig
    from hf_posenc.tuning.space import method_grid

    f = target / args.original
    se = method_grid("self_extend", args.original, target)[0]
    out = [f"yarn-x{f:g}=yarn:factor={f:g}", f"pi-x{f:g}=pi:factor={f:g}", f"ntk-x{f:g}=ntk:factor={f:g}",
           f"dynamic_ntk-x{f:g}=dynamic_ntk:factor={f:g}",
           f"self_extend=self_extend:window={se['window']},group_size={se['group_size']}"]
    grid_best = os.path.join(ROOT, "benchmarks", "tune", str(target), "best.json")
    if os.path.isfile(grid_best):
        with open(grid_best, encoding="utf-8") as fh:
            out.append("grid-best=" + PosEncConfig.from_json(fh.read()).to_text())
    if searched:
        with open(searched, encoding="utf-8") as fh:
            out.insert(0, "searched=" + PosEncConfig.from_json(fh.read()).to_text())
    return out


def step(args, name: str, argv: list[str], lines: list[str], target: int | None = None) -> None:
    """Runs ``hf-posenc ARGV`` when ``name`` is among ``--steps`` (the passkey step: the depths past the truncated
    model's reach first, given ``target``) and records its command."""
    if name in args.steps.split(",") and not args.no_run:
        if target:
            run_needles_far_first(argv, args.original, target, args.no_progress)
        else:
            run_cli(argv, args.no_progress)
    lines.append(f"- {name}: `hf-posenc {shlex.join(argv)}`")


def run_target(args, target: int) -> list[str]:
    out = os.path.join(args.output, str(target))
    search, lines = os.path.join(out, "search"), []
    step(args, "search", ["tune", "--model", args.model, "--target-length", str(target), "--methods", "longrope",
                          "--search", "evolution", "--population", str(args.population), "--generations",
                          str(args.generations), "--rank-by", args.rank_by, "--search-attention-factor",
                          "--depths", "0.1,0.5,0.9",
                          "--text-file", rel(args.tune_file), "--device", args.device, "--output", rel(search)], lines)
    best = os.path.join(search, "best.json")
    flags = [f"--variant={v}" for v in variants(args, target, best if os.path.isfile(best) else None)]
    step(args, "ppl", ["eval", "ppl", "--model", args.model, "--lengths", f"{args.original},{target}",
                       "--max-windows", "1", "--text-file", rel(args.test_file), "--methods", "none", *flags,
                       "--device", args.device, "--output", rel(os.path.join(out, "ppl"))], lines)
    step(args, "passkey", ["eval", "passkey", "--model", args.model, "--lengths", str(target), "--depths",
                           args.depths, "--trials", str(args.trials), "--haystack", "text", "--text-file",
                           rel(args.test_file), "--methods", "none", *flags, "--device", args.device,
                           "--output", rel(os.path.join(out, "passkey"))], lines, target)
    return [f"### Target {target} tokens", "", *lines, "", *_tables(out, f"yarn-x{target / args.original:g}"),
            *_pending(out, args.depths)]


def _tables(out: str, yarn: str) -> list[str]:
    """The step reports of one target and their verdicts, ``yarn`` naming its YaRN variant."""
    parts = []
    for sub, stem in (("search", "tune"), ("ppl", "perplexity"), ("passkey", "passkey")):
        path = os.path.join(out, sub, f"{stem}.md")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                parts += [f"**{sub}**", "", f.read().strip(), ""]
        else:
            parts += [f"**{sub}**: not run yet (the command above computes it; it resumes).", ""]
    ppl = os.path.join(out, "ppl", "perplexity.json")
    if os.path.isfile(ppl):
        with open(ppl, encoding="utf-8") as f:
            parts += [_ppl_verdict(json.load(f)["results"], os.path.basename(out), yarn), ""]
    passkey = os.path.join(out, "passkey", "passkey.json")
    if os.path.isfile(passkey):
        with open(passkey, encoding="utf-8") as f:
            parts += [_passkey_verdict(json.load(f), yarn), ""]
    report = os.path.join(out, "search", "tune.json")
    if os.path.isfile(report):
        with open(report, encoding="utf-8") as f:
            tuned = json.load(f)
        compute = tuned["setup"].get("compute") or {}
        parts += [_verdict(tuned["results"]), ""] if _verdict(tuned["results"]) else []
        parts += [f"Search cost: {compute.get('cells', '?')} cells, {compute.get('seconds', 0) / 60:.0f} min of "
                  "forwards in all.", "", f"![factors]({rel(out)}/search/tune_factors.png)", ""]
    return parts


def _pending(out: str, depths: str) -> list[str]:
    """A line naming the needle depths the command asks for that its passkey report does not have yet."""
    path = os.path.join(out, "passkey", "passkey.json")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        done = {float(d) for d in json.load(f)["setup"].get("depths", [])}
    missing = [d for d in depths.split(",") if float(d) not in done]
    return [f"Needles at depths {', '.join(missing)} (within truncation's reach) are not in the report yet: the "
            "passkey command above computes them and resumes the cells it has.", ""] if missing else []


def _verdict(results: dict) -> str | None:
    """The confirmation in one sentence: the searched factors beside YaRN past L and on inputs of L, said plainly."""
    conf = results.get("confirmation") or {}
    metrics, best = conf.get("metrics") or {}, results.get("best")
    yarn = next((m for name, m in metrics.items() if name.startswith("reference-yarn")), None)
    if not best or best not in metrics or yarn is None:
        return None
    ours, base = metrics[best], conf.get("baseline") or {}
    gap = ours["ppl_beyond"] / yarn["ppl_beyond"] - 1
    past = ("no better than YaRN" if gap >= -0.005 else f"{-gap:.1%} better than YaRN") + (
        f" ({gap:+.1%})" if gap >= -0.005 else "")
    return (f"**Confirmation on unseen windows:** the searched factors give perplexity {ours['ppl_beyond']:.2f} past "
            f"the original context ({past}: {yarn['ppl_beyond']:.2f}; the unpatched model "
            f"{base.get('ppl_beyond', float('nan')):.2f}); on inputs of the original length they cost "
            f"{ours.get('short_cost', 0):+.2%} (YaRN {yarn.get('short_cost', 0):+.2%}). Passkey in the search's "
            f"confirmation: {ours['passkey']:.2f} vs YaRN's {yarn['passkey']:.2f} of {ours['passkey_trials']} keys "
            "(too few to rank; the passkey step measures more).")


def _passkey_verdict(report: dict, yarn_name: str) -> str:
    """The passkey step in one sentence: the searched factors beside YaRN and the best method, overall and on the
    needles the truncated model cannot see, with the depths measured, said plainly."""
    rows = {v: r for v, r in report["results"].items() if isinstance(r, dict)}
    overall = {v: r.get("accuracy") for v, r in rows.items() if r.get("accuracy") is not None}
    if "searched" not in overall or yarn_name not in overall:
        return ""
    best = max(overall, key=overall.get)
    ours, yarn = overall["searched"], overall[yarn_name]
    said = "no better than YaRN" if ours <= yarn else f"above YaRN by {ours - yarn:.2f}"
    far = {v: next(iter(r["beyond_reach"].values())) for v, r in rows.items() if r.get("beyond_reach")}
    reach = "" if "searched" not in far or yarn_name not in far else (
        f" Past truncation's reach: searched {far['searched']['hits']} of {far['searched']['trials']}, YaRN "
        f"{far[yarn_name]['hits']} of {far[yarn_name]['trials']}, "
        + ", ".join(f"{v} {f['hits']}" for v, f in far.items() if v not in ("searched", yarn_name)) + ".")
    depths = ", ".join(f"{d:g}" for d in report["setup"].get("depths", []))
    return (f"**Needles in prose (passkey step, depths {depths}):** the searched factors retrieve {ours:.2f} of the "
            f"keys, {said} ({yarn:.2f}); the best method here is {best} ({overall[best]:.2f}); truncation's reach is "
            f"in the last column.{reach} Five keys per depth: a difference of one or two keys is not a ranking.")


def _ppl_verdict(results: dict, target: str, yarn: str) -> str:
    """The ppl step in one sentence: past L beside the truncated baseline (the context gain), and inputs of L."""
    past = {v: r[target].get("past_original") for v, r in results.items() if target in r}
    gains = {v: r[target].get("context_gain") for v, r in results.items() if target in r}
    short = {v: r[k]["ppl"] for v, r in results.items() for k in r if k != target}
    truncated = next((v for v in past if v.startswith("none-truncated")), None)
    ranked = sorted((v for v in past if past[v] and gains.get(v) is not None), key=lambda v: past[v]["ppl"])
    best = ranked[0] if ranked else None
    if best is None or truncated is None or "searched" not in past:
        return ""
    helped = [v for v in ranked if gains[v] > 1.0]
    return (f"**On the other book (ppl step):** past the original context the searched factors give "
            f"{past['searched']['ppl']:.2f} (context gain x{gains['searched']:.3f}), YaRN "
            f"{past[yarn]['ppl'] if yarn in past else float('nan'):.2f}, the best {best} "
            f"{past[best]['ppl']:.2f}, truncating {past[truncated]['ppl']:.2f}: "
            + (f"{', '.join(helped)} beat truncating" if helped else "no method beats truncating here: the context "
               "past L is not used, the methods only avoid breaking")
            + f"; on inputs of the original length the searched factors give {short.get('searched', float('nan')):.2f}"
            f" (unpatched {short.get('none', float('nan')):.2f}, YaRN {short.get(yarn, float('nan')):.2f}). "
            "One window of each length: a difference below a few percent is not a ranking.")


def main(argv: list[str] | None = None) -> int:
    from hf_posenc.io.reports import emit_section

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    require_book(args.tune_file)
    require_book(args.test_file)
    shown = [a for a in argv if a != "--no-run"]
    parts = [TITLE, "", f"Command: `python scripts/bench_tune_evolution.py {shlex.join(shown)}`", "",
             f"Machine: {os.cpu_count()} CPU cores, device {args.device}. Searched on "
             f"{os.path.basename(args.tune_file)}, measured on {os.path.basename(args.test_file)}.", ""]
    for target in args.targets:
        parts += run_target(args, target)
    emit_section("\n".join(parts).rstrip() + "\n", args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
