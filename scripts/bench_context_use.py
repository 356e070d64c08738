"""Does a method *use* the context past the original length L, or only avoid breaking? SmolLM2-135M (L = 8,192)
on a book it was not tuned on, per method (the knobs ``hf-posenc tune`` chose on another book, as in
``bench_remapped_quality.py``):

- perplexity of the tokens past L beside the unpatched model truncated to L (the context gain, > 1: used);
- key-token perplexity (LongPPL, Fang et al. 2024, arXiv:2410.23771): perplexity over the tokens the context past L
  makes at least e^2 times likelier, judged by each method's own model, and judged by one evaluator for every
  method (SmolLM2 patched by ``--evaluator`` method's chosen configuration: the evaluator must share the tokenizer,
  and no longer-context model with SmolLM2's tokenizer is at hand);
- needle-in-text accuracy (a RULER-worded needle in the book's prose) at depths 0.1..0.9, several keys per depth,
  beside the filler passkey on the same grid. The unpatched model truncated to L can only see a needle at depth
  >= 1 - L / T: its reach is stated beside the accuracy (no forward needed).

Every number comes from ordinary ``hf-posenc eval`` commands (printed in the section), whose cells resume: the
script can be stopped and run again, and ``--needle-methods`` grows the needle runs method by method. CPU cost
(2 cores): a SmolLM2 forward is ~90 s at 12k and ~150 s at 16k; key tokens cost (T - L) / (L / 4) forwards of L
tokens more per method; each needle prompt is one forward, so 5 depths x 5 keys x 2 haystacks is ~75 min per
method at 12k.

    python scripts/bench_context_use.py --write
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from _bench import ROOT, comma_list, load_json, rel, require_book, run_cli, tuned_run_flags
from bench_remapped_quality import METHODS, chosen_variants

TITLE = "## Is the context past L used? Context gain, key-token perplexity, needles in text"
NEEDLE_METHODS = ["self_extend", "yarn", "rerope", "dca", "dynamic_ntk"]
EVALUATOR = "self_extend"  # the best context gain at both lengths in bench_remapped_quality


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, .gguf file or alias).")
    p.add_argument("--lengths", type=comma_list(int), default=[12288], help="lengths in tokens (comma-separated); each "
                   "needs a finished tune run for it in --tune.")
    p.add_argument("--methods", type=comma_list(str), default=METHODS,
                   help="methods whose perplexity and key tokens are measured (beside the unpatched model).")
    p.add_argument("--needle-methods", type=comma_list(str), default=NEEDLE_METHODS,
                   help="methods whose needle accuracy is measured (a subset of --methods; the slow part).")
    p.add_argument("--evaluator", default=EVALUATOR, help="the method (one of --methods) whose chosen configuration, "
                   "on the model under test, judges key tokens for every method in the second perplexity run.")
    tuned_run_flags(p, "context_use", "0.1,0.3,0.5,0.7,0.9", 5)
    p.add_argument("--no-run", action="store_true", help="only write the section from the reports already there "
                   "(runs not yet made show as –); the commands printed are those that make them all.")
    return p


PPL, JUDGED, TEXT, FILLER = "ppl", "ppl_judged", "needle_text", "needle_filler"  # one length's run folders
REPORTS = {PPL: "perplexity.json", JUDGED: "perplexity.json", TEXT: "passkey.json", FILLER: "passkey.json"}


def _report(out: str, folder: str) -> dict | None:
    """The report of one run folder of a length's output ``out``, or None before it is written."""
    return load_json(os.path.join(out, folder, REPORTS[folder]))


def commands(args, length: int, chosen) -> dict[str, list[str]]:
    """The ``hf-posenc`` argv of each run at ``length``: ppl (with key tokens), needles in text, filler passkey."""
    out = os.path.join(args.output, str(length))
    variants = [a for _, v, _ in chosen for a in ("--variant", v)]
    needle = [a for m, v, _ in chosen if m in args.needle_methods for a in ("--variant", v)]
    common = ["--model", args.model, "--lengths", str(length), "--device", args.device]
    grid = ["--depths", args.depths, "--trials", str(args.trials)]
    judge = next(v for m, v, _ in chosen if m == args.evaluator).split("=", 1)[1]
    ppl = ["eval", "ppl", *common, "--methods", "none", *variants, "--text-file", rel(args.text_file),
           "--max-windows", "1", "--key-tokens"]
    return {
        "ppl": [*ppl, "--output", rel(os.path.join(out, PPL))],
        "judged": [*ppl, "--evaluator-method", judge, "--output", rel(os.path.join(out, JUDGED))],
        "text": ["eval", "passkey", *common, *needle, *grid, "--haystack", "text", "--text-file", rel(args.text_file),
                 "--output", rel(os.path.join(out, TEXT))],
        "filler": ["eval", "passkey", *common, *needle, *grid, "--output", rel(os.path.join(out, FILLER))],
    }


def _needle(report: dict | None, label: str, length: int, depths: list[float]) -> list[str]:
    if report is None or label not in report["results"]:
        return ["–"] * (len(depths) + 1)
    r = report["results"][label]
    return [f"{r['cells'][f'{length}@{d:g}']['accuracy']:.1f}" for d in depths] + [f"{r['by_length'][str(length)]:.2f}"]


def _exact(result: dict, length: int) -> str:
    """`` [hits/needles]`` of the report's exact count beyond truncation's reach (by each needle's recorded span;
    ``eval passkey``'s ``beyond_reach``), or nothing for cells that predate the recorded spans."""
    got = (result.get("beyond_reach") or {}).get(str(length))
    return f" [{got['hits']}/{got['trials']}]" if got and got["trials"] else ""


def _label(variant: str) -> str:
    """``LABEL=METHOD:...`` -> ``LABEL``, the key of a variant's results in a report."""
    return variant.split("=", 1)[0]


def _depths(args) -> list[float]:
    return [float(d) for d in args.depths.split(",")]


def _edge(original: int, length: int) -> float:
    """The shallowest depth at which a model truncated to its original context L still sees a needle."""
    return 1 - original / length


def _rows(lines_head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(lines_head) + " |", "|" + "---|" * len(lines_head),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def table(args, length: int, chosen) -> list[str]:
    """Two tables: perplexity past L, context gain and key tokens for every method; then needle accuracy per depth
    (in text and in filler) for the needle methods, under the depths a model truncated to L can see."""
    from hf_posenc.eval.run_ppl import key_tokens_text

    out = os.path.join(args.output, str(length))
    ppl, judged = _report(out, PPL), _report(out, JUDGED)
    original = ppl["setup"]["original_context"]
    base = ppl["results"][ppl["setup"]["truncated_baseline"]["label"]][str(length)]["past_original"]
    rows = []
    for method, variant in [("none", "none"), *[(m, v) for m, v, _ in chosen]]:
        label = _label(variant)
        r = ppl["results"][label][str(length)]
        rows.append([method, f"`{variant}`", f"{r['past_original']['ppl']:.2f}", f"{r.get('context_gain', 1):.3f}",
                     key_tokens_text(r), key_tokens_text(judged["results"][label][str(length)]) if judged else "–"])
    rows.append(["none, truncated to L", f"{original} tokens at most before each token", f"{base['ppl']:.2f}", "1",
                 "", ""])
    lines = _rows(["method", "configuration", f"ppl past L (from {base['from']})", "context gain",
                   "key-token ppl, own judge (count)", "key-token ppl, one judge (count)"], rows)
    if judged:
        own = judged["setup"]["key_tokens"]["evaluator_own"][str(length)]
        own_ppl = f"{own['ppl']:.2f}" if own["ppl"] else "-"
        lines += ["", f"One judge: {judged['setup']['key_tokens']['evaluator']}, for every method ({own['count']} key "
                  f"tokens, {100 * own['share']:.2f}% of the scored ones; its own key-token perplexity {own_ppl}"
                  + (f"; the largest gain any token got from past L, LSD max {own['lsd_max']:.2f} nats"
                     if "lsd_max" in own else "") + "). "
                  "Own judge: each method's own model (its own key tokens)."]
    return lines + ["", *needle_table(args, length, chosen, original)]


def needle_table(args, length: int, chosen, original: int) -> list[str]:
    out = os.path.join(args.output, str(length))
    text, filler = _report(out, TEXT), _report(out, FILLER)
    depths, seen = _depths(args), _edge(original, length)
    labels = {m: _label(v) for m, v, _ in chosen}
    rows = [[m, *_needle(text, labels[m], length, depths), *_needle(filler, labels[m], length, depths)]
            for m in args.needle_methods]
    reach = ["✓" if d >= seen else "✗" for d in depths]
    rows.append(["none, truncated to L: can it see the needle?", *reach, "", *reach, ""])
    head = (["method"] + [f"text @ {d:g}" for d in depths] + ["text, all"]
            + [f"filler @ {d:g}" for d in depths] + ["filler, all"])
    note = (f"Needles: {args.trials} keys per depth (accuracy per depth in steps of {1 / args.trials:g}); text: a "
            "RULER-worded needle in the book's prose; filler: the repeated-filler passkey. A model truncated to "
            f"L = {original} tokens sees a needle at {length} tokens only at depth >= {seen:.2f}; a method that finds "
            "needles at shallower depths retrieves from past L. –: not run yet (the runs resume method by method, "
            "in --needle-methods order); the filler passkey of every method, one key per depth at 0.1 / 0.5 / 0.9, "
            "is in the section 'Training-free long context side by side'.")
    return [*_rows(head, rows), "", note]


def verdict(args, length: int, chosen) -> str:
    """What the runs say, plainly: by perplexity (context gain, key tokens) and by needles out of truncation's reach."""
    ppl = _report(os.path.join(args.output, str(length)), PPL)
    labels = {m: _label(v) for m, v, _ in chosen}
    gains = {m: ppl["results"][labels[m]][str(length)]["context_gain"] for m in labels}
    used = [f"{m} ({g:.3f})" for m, g in gains.items() if g > 1.01]
    held = [f"{m} ({g:.3f})" for m, g in gains.items() if 0.99 <= g <= 1.01]
    lost = [f"{m} ({g:.3f})" for m, g in gains.items() if g < 0.99]
    said = (f"**By perplexity** (one window of one book): used the context past L (gain > 1.01): "
            f"{', '.join(used) or 'none'}; only avoided breaking (within 1% of truncation): "
            f"{', '.join(held) or 'none'}; worse than truncating: {', '.join(lost) or 'none'}.")
    original = ppl["setup"]["original_context"]
    beyond = [d for d in _depths(args) if d < _edge(original, length)]
    for kind in ("text", "filler"):
        report = load_json(os.path.join(args.output, str(length), f"needle_{kind}", "passkey.json"))
        found = []
        for m in args.needle_methods:
            r = (report or {}).get("results", {}).get(labels[m], {})
            if r.get("cells") and beyond:
                hits = [r["cells"][f"{length}@{d:g}"]["accuracy"] for d in beyond]
                found.append(f"{m} {sum(hits) / len(hits):.2f}{_exact(r, length)}")
        if found:
            said += (f" **Needles in {kind}** at the depths a model truncated to L cannot see "
                     f"({', '.join(f'{d:g}' for d in beyond)}): mean accuracy {', '.join(found)} (above 0: the "
                     "method retrieves from past L" + ("; [hits/needles]: every needle of the run lying wholly before "
                     "the last L tokens, by its recorded position, where the run's cells record it" if "[" in
                     "".join(found) else "") + ").")
    return said


def judged(argv: list[str], out: str, no_progress: bool) -> None:
    """The one-judge perplexity run; its window cells are those of the first run (the same fingerprint), so its
    folder starts from a copy of them and only the evaluator's and the methods' key-token cells are computed."""
    import shutil

    from hf_posenc.eval.cells import CELLS_FILE

    cells = os.path.join(out, JUDGED, CELLS_FILE)
    if not os.path.exists(cells):
        os.makedirs(os.path.dirname(cells), exist_ok=True)
        shutil.copyfile(os.path.join(out, PPL, CELLS_FILE), cells)
    run_cli(argv, no_progress)


def run_length(args, length: int) -> list[str]:
    chosen = chosen_variants(os.path.join(args.tune, str(length)), args.methods)
    argv = commands(args, length, chosen)
    if args.no_run:
        return section(args, length, chosen, argv)
    run_cli(argv["ppl"], args.no_progress)
    judged(argv["judged"], os.path.join(args.output, str(length)), args.no_progress)
    order = args.needle_methods.index
    needle_chosen = sorted((c for c in chosen if c[0] in args.needle_methods), key=lambda c: order(c[0]))
    for i in range(1, len(needle_chosen) + 1):  # in --needle-methods order; a stopped run keeps whole methods
        sub = argparse.Namespace(**{**vars(args), "needle_methods": [m for m, _, _ in needle_chosen[:i]]})
        part = commands(sub, length, chosen)
        run_cli(part["text"], args.no_progress)
        run_cli(part["filler"], args.no_progress)
    return section(args, length, chosen, argv)


def computed_on(reports: list[dict]) -> str:
    """The cells of one length's reports counted by the device that computed them (a run resumed on another
    machine keeps each cell's own; a report older than per-cell devices counts its cells as not recorded)."""
    from hf_posenc.io.reports import NOT_RECORDED, device_counts

    counts: dict[str, int] = {}
    for report in reports:
        compute = report["setup"].get("compute", {})
        for device, n in (compute.get("devices") or {NOT_RECORDED: compute.get("cells", 0)}).items():
            counts[device] = counts.get(device, 0) + n
    return device_counts(counts) or "none yet"


def versions_of(reports: list[dict]) -> str:
    """The library versions one length's reports were computed with (a resume needs the same hf_posenc and
    transformers and the same torch release, so each report names those of all its cells)."""
    seen = []
    for report in reports:
        env = report["setup"].get("environment", {})
        said = ", ".join(f"{name} {env[name]}" for name in ("hf_posenc", "transformers", "torch") if name in env)
        if said and said not in seen:
            seen.append(said)
    return "; ".join(seen) or "none yet"


def section(args, length: int, chosen, argv: dict[str, list[str]]) -> list[str]:
    """The lines of one length's part of the section, from the reports written so far."""
    out = os.path.join(args.output, str(length))
    reports = [r for r in (_report(out, folder) for folder in REPORTS) if r is not None]  # read once for both lines
    return [f"### {length} tokens", "", *table(args, length, chosen), "", verdict(args, length, chosen), "",
            f"Cells of these reports, by the device that computed them: {computed_on(reports)} (not recorded: "
            f"computed before cells recorded their device); computed with {versions_of(reports)}.", "",
            *(f"`hf-posenc {shlex.join(a)}`  " for a in argv.values()), ""]


def main(argv: list[str] | None = None) -> int:
    from hf_posenc.io.reports import emit_section

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    require_book(args.text_file)
    unknown = sorted(set(args.needle_methods + [args.evaluator]) - set(args.methods))
    if unknown:
        raise SystemExit(f"--needle-methods / --evaluator {unknown} are not among --methods {args.methods}")
    full = shlex.join(a for a in argv if a != "--no-run")
    said = (" (this section was written with --no-run from the runs finished so far; the command resumes the rest)"
            if args.no_run else "")
    parts = [TITLE, "", f"Command: `python scripts/bench_context_use.py {full}`{said}", "",
             f"Machine of this call: {os.cpu_count()} CPU cores, device {args.device}; measured on "
             f"{os.path.basename(args.text_file)}, knobs chosen by `hf-posenc tune` on pg1342.txt.", ""]
    for length in args.lengths:
        parts += run_length(args, length)
    emit_section("\n".join(parts).rstrip() + "\n", args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
