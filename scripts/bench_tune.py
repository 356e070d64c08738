"""``hf-posenc tune`` shown on a real model: SmolLM2-135M (original context 8,192) tuned for 12,288 and 16,384
tokens on one book, each run an ordinary ``hf-posenc tune`` command (printed with its table) whose candidates
come from a ``--space`` file this script writes beside the results. With --write the section replaces this
script's section of BENCHMARKS.md.

The candidates (F = T / L rounded up to a half): YaRN with its defaults at F (also the reference of the
confirmation), at G = 4F/3 (rounded up to a half: some room beyond T) YaRN with attention_factor 1.0, YaRN,
dynamic NTK and dynamic YaRN, and the
attention-level methods with the grid's first setting that reaches T (Self-Extend) or their defaults (DCA,
STRING, ReRoPE, leaky ReRoPE). The full grid (``hf-posenc tune --methods ...``) is ~30 candidates: hours per rung on 2
CPU cores.

CPU cost (2 cores): a 12k forward is ~60-90 s; each candidate's first rung is 5 forwards (one window of T, one
of L, 3 passkey prompts), so about 1 h for rung 0 at 12k; run to its end (rungs 0-2 and the confirmation) the
12k search is ~4 h of compute. At 16k (a forward ~1.7x dearer) the run is given ``--budget-minutes`` 200
(``--budget-minutes 16384:200``, the default): the budget stops the halving where the next rung and the
confirmation would no longer fit, as a user with an afternoon would run it. The runs resume: kill the script and
run it again (the budget counts the compute seconds recorded in the cells, resumed ones included).

    python scripts/bench_tune.py --write
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys

from _bench import ROOT, comma_list, rel, require_book, run_cli

BOOK = os.path.join(ROOT, "..", "shared", "data", "books", "pg1342.txt")
TITLE = "## Choosing the method and knobs: hf-posenc tune on SmolLM2"
ORIGINAL = 8192


def candidates(original: int, target: int) -> list[str]:
    """The ``--space`` list for ``target`` (see the module docstring)."""
    from hf_posenc.tuning.space import factors, method_grid

    f = factors(original, target)[0]
    f2 = math.ceil(4 * f / 3 * 2) / 2  # a third more than needed, rounded up to a half
    se = method_grid("self_extend", original, target)[0]
    return [f"yarn-factor_{f:g}=yarn:factor={f:g}",
            f"yarn-factor_{f2:g}-attention_factor_1=yarn:factor={f2:g},attention_factor=1.0",
            f"yarn-factor_{f2:g}=yarn:factor={f2:g}",
            f"dynamic_ntk-factor_{f2:g}=dynamic_ntk:factor={f2:g}",
            f"dynamic_yarn-factor_{f2:g}=dynamic_yarn:factor={f2:g}",
            f"self_extend-window_{se['window']}-group_size_{se['group_size']}=self_extend:window={se['window']},"
            f"group_size={se['group_size']}",
            "dca-default=dca", "string-default=string", "rerope-default=rerope",
            "leaky_rerope-default=leaky_rerope"]


def string_reach(original: int, targets: list[int]) -> str:
    """What ``string-default`` means at these targets: the farthest relative position it gives a key, beside
    the settings of the grid that keep every position below the original context."""
    from hf_posenc.methods.remapped import REMAPPED
    from hf_posenc.tuning.space import method_grid

    string = REMAPPED["string"]
    defaults = string.defaults(dict(string.spec.params), original)
    offset, window = defaults["shifted_offset"], defaults["local_window"]
    parts = []
    for t in targets:
        grid = [g["shifted_offset"] for g in method_grid("string", original, t)]
        fits = (f"the grid's offsets {', '.join(map(str, grid))} would stay below {original}" if grid else
                f"no offset stays below {original}: STRING reaches at most 2L - window")
        parts.append(f"at {t} it reaches {t - 1 - offset + window} ({fits})")
    return (f"STRING enters with its defaults (offset L/3 = {offset}, local window {window}), so its keys sit at "
            f"relative positions the model never saw: {'; '.join(parts)}. Its rows measure STRING past its reach, "
            "as a user taking its defaults would run it, not STRING at its best.")


def budget_pair(text: str) -> tuple[int, float]:
    """``"16384:200"`` -> ``(16384, 200.0)``."""
    target, sep, minutes = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(target), float(minutes)
    except ValueError:
        raise argparse.ArgumentTypeError(f"budget {text!r}: expected TARGET:MINUTES, e.g. 16384:200") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, .gguf file or alias).")
    p.add_argument("--original", type=int, default=ORIGINAL, help="the model's original context (for the space).")
    p.add_argument("--targets", type=comma_list(int), default=[12288, 16384], help="target lengths (comma-separated).")
    p.add_argument("--text-file", default=BOOK, help="the book tuned on (default: Pride and Prejudice).")
    p.add_argument("--depths", default="0.1,0.5,0.9", help="passkey depths.")
    p.add_argument("--reduction", type=int, default=4, help="each rung keeps 1/reduction of the candidates.")
    p.add_argument("--budget-minutes", type=comma_list(budget_pair), default=[(16384, 200.0)],
                   help="per-target compute budgets, TARGET:MINUTES pairs (comma-separated); targets not named "
                        "run without a budget.")
    p.add_argument("--device", default="cpu", help="torch device.")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "tune"), help="folder of the runs.")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars.")
    return p


def verdict(res: dict) -> str:
    """One sentence from a tune report's results: the winner beside YaRN with its default knobs, on the
    confirmation data."""
    conf, ref = res["confirmation"]["metrics"], (res.get("reference") or {}).get("label")
    if res["best"] is None or ref is None or ref == res["best"]:
        return ""

    def said(label):
        m = conf[label]
        return (f"passkey {m['passkey']:.2f} ({m['passkey_trials']} keys), perplexity beyond L {m['ppl_beyond']:.2f}, "
                f"short-input cost {100 * m['short_cost']:+.2f}%")
    return (f"On the confirmation data (never used for ranking): `{res['best']}` {said(res['best'])}; YaRN with its "
            f"default knobs (`{ref}`) {said(ref)}.")


def run_target(args, target: int) -> list[str]:
    """Tune for ``target``; the lines of its part of the section."""
    out = os.path.join(args.output, str(target))
    os.makedirs(out, exist_ok=True)
    space = os.path.join(out, "space.json")
    with open(space, "w", encoding="utf-8") as f:
        json.dump(candidates(args.original, target), f, indent=1)
    argv = ["tune", "--model", args.model, "--target-length", str(target), "--space", rel(space),
            "--text-file", rel(args.text_file), "--depths", args.depths, "--reduction", str(args.reduction),
            "--device", args.device, "--output", rel(out)]
    budget = dict(args.budget_minutes).get(target)
    if budget is not None:
        argv += ["--budget-minutes", f"{budget:g}"]
    run_cli(argv, args.no_progress)
    with open(os.path.join(out, "tune.md"), encoding="utf-8") as f:
        table = f.read().strip()
    with open(os.path.join(out, "best.json"), encoding="utf-8") as f:
        best = f.read().strip()
    with open(os.path.join(out, "tune.json"), encoding="utf-8") as f:
        report = json.load(f)
    minutes = report["setup"]["compute"]["seconds"] / 60  # every call's cells, resumed ones included
    return [f"### Target {target} tokens", "", f"Command: `hf-posenc {shlex.join(argv)}`  ",
            f"Compute: {minutes:.0f} min of forwards in all (the `seconds` of each cell in "
            f"`{rel(out)}/cells.jsonl`; a rerun resumes from them).", "", verdict(report["results"]), "", table, "",
            f"Chosen configuration (`{rel(out)}/best.json`, apply with `hf-posenc patch --config`):", "",
            "```json", best, "```", "", f"![loss by position]({rel(out)}/tune_loss_by_position.png)", ""]


def main(argv: list[str] | None = None) -> int:
    from hf_posenc.io.reports import emit_section

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    require_book(args.text_file)
    parts = [TITLE, "", f"Command: `python scripts/bench_tune.py {shlex.join(argv)}`", "",
             f"Machine: {os.cpu_count()} CPU cores, device {args.device}. Each target is one `hf-posenc tune` run "
             "(below) on one book; the confirmation re-measures the winner, the runner-up and YaRN with its "
             "default knobs at the winner's factor (at T / L rounded up to a half when the winner takes no factor) on "
             "windows and keys never used for ranking. " + string_reach(args.original, args.targets), ""]
    for target in args.targets:
        parts += run_target(args, target)
    emit_section("\n".join(parts).rstrip() + "\n", args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
