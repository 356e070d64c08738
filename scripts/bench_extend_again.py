"""Extending a checkpoint that is already extended, on real weights: SmolLM2-135M (L = 8,192) given YaRN x2 and
fine-tuned to 16,384 with PoSE (``bench_finetune_long.py``'s yarn-full run, trained here when its folder is absent),
then extended once more to 24,576 tokens, on the held-out book (Frankenstein):

- ``composed``: ``yarn:factor=1.5`` on the checkpoint, which hf_posenc composes over its own YaRN x2 (one longrope:
  inputs up to 16,384 keep the trained frequencies, YaRN's rule on them past it);
- ``replacing``: ``yarn:factor=3,original_max_position_embeddings=8192``, the same target from the pretraining
  context, the checkpoint's own scaling replaced (what a config edited by hand gives; YaRN x1.5 from 8,192 would
  advertise 12,288, fewer than the checkpoint's 16,384, and is refused);
- ``checkpoint``: the fine-tuned checkpoint as it is (its own configuration restated, ``yarn:factor=2`` over
  8,192), run past its 16,384;
- the baseline: the checkpoint as it is truncated to its 16,384 tokens (``eval ppl --original-context 16384``'s
  truncated baseline, ``checkpoint-truncated-16384-stride-4096``).

Both evaluations run with ``--original-context 16384``: past the context the checkpoint was trained at, not the
pretraining 8,192 that its stored scaling records (``eval``'s default).

Perplexity of a 16,384-token window (inside the checkpoint's context: the composed scaling keeps the checkpoint's
frequencies there, the replacing one does not), of the tokens past 16,384 (one window of 24,576), and needles in the
book's prose (``--trials`` keys per depth; depths below 1 - 16,384 / 24,576 = 0.33 are out of the truncated model's
reach, measured first). Every number comes from an ordinary ``hf-posenc`` command printed in the section, whose
cells resume. CPU cost (2 cores): the training ~45-75 min, a 24,576-token forward ~5.5 min (each needle is one); on
a GPU, minutes in all (``--device cuda``).

    python scripts/bench_extend_again.py --write
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from _bench import BOOK, ROOT, load_json, rel, require_book, run_cli, run_needles_far_first, run_then_write
from bench_finetune_long import _needles, _ppl, _table
from bench_finetune_long import build_parser as training_parser
from bench_finetune_long import commands as training_commands
from bench_finetune_long import train as train_run

TITLE = "## Extending an extended checkpoint: SmolLM2 YaRN x2 fine-tuned to 16,384, then x1.5 composed vs replacing"
RUN = "yarn-full"
CONTEXT = 16384  # what the checkpoint was trained at (SmolLM2's 8,192 x 2): the evaluations measure past it
VARIANTS = {  # label -> (configuration on the checkpoint, what it is); the two the comparison is about first
    "composed": ("yarn:factor=1.5", "YaRN x1.5 composed over the checkpoint's YaRN x2"),
    "replacing": ("yarn:factor=3,original_max_position_embeddings=8192",
                  "YaRN x3 from 8,192, replacing the checkpoint's YaRN x2"),
    "composed-own-temperature": ("yarn:factor=1.5,attention_factor=1",
                                 "YaRN x1.5 composed, the checkpoint's attention temperature kept (YaRN x1.5's own "
                                 "not added: inputs up to 16,384 are then exactly the checkpoint)"),
    "checkpoint": ("yarn:factor=2,original_max_position_embeddings=8192",
                   "the fine-tuned checkpoint as it is (its own YaRN x2 restated), past its context"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--steps", type=int, default=100, help="optimizer steps of the yarn-full training run (the "
                   "checkpoint extended here; bench_finetune_long.py's folder of that step count is reused).")
    p.add_argument("--length", type=int, default=24576, help="the evaluation length, past the checkpoint's 16,384.")
    p.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9", help="needle depths (those out of the truncated "
                   "model's reach first).")
    p.add_argument("--trials", type=int, default=5, help="needle keys per depth.")
    p.add_argument("--text-file", default=BOOK, help="the held-out book measured on (default: Frankenstein).")
    p.add_argument("--device", default="cpu", help="torch device of the training and the evaluations.")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "extend_again"),
                   help="folder of the evaluation runs.")
    p.add_argument("--steps-to-run", default="ppl,needles", help="what to compute after the training, in order "
                   "(comma-separated of ppl, needles; the training runs when its checkpoint is absent).")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    p.add_argument("--no-run", action="store_true", help="only write the section from the reports already there.")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars.")
    return p


def training(args):
    """bench_finetune_long.py's arguments for the yarn-full run of ``--steps`` (its defaults otherwise)."""
    return training_parser().parse_args(["--runs", RUN, "--steps", str(args.steps), "--checkpoint-every", "10",
                                         "--text-file", args.text_file, "--device", args.device])


def commands(args) -> dict[str, list[str]]:
    """The ``hf-posenc`` argv of each step: train (bench_finetune_long's), perplexity, needles."""
    t = training(args)
    trained = training_commands(t, RUN)
    checkpoint = trained["train"][trained["train"].index("--output") + 1]
    variants = [a for label, (cfg, _) in VARIANTS.items() for a in ("--variant", f"{label}={cfg}")]
    common = ["--original-context", str(CONTEXT), "--device", args.device, "--model", checkpoint, *variants]
    out = lambda part: ["--output", rel(os.path.join(args.output, part))]  # noqa: E731
    return {"train": trained["train"],
            "ppl": ["eval", "ppl", "--lengths", f"{CONTEXT},{args.length}", *common,
                    "--text-file", rel(args.text_file), "--max-windows", "1", *out("ppl")],
            "needles": ["eval", "passkey", "--lengths", str(args.length), *common, "--trials", str(args.trials),
                        "--haystack", "text", "--text-file", rel(args.text_file), "--depths", args.depths,
                        *out("needles")]}


def run_all(args) -> None:
    argv = commands(args)
    train_run(training(args), RUN, argv["train"])
    for step in args.steps_to_run.split(","):
        if step == "ppl":
            run_cli(argv["ppl"], args.no_progress)
        elif step == "needles":
            run_needles_far_first(argv["needles"], CONTEXT, args.length, args.no_progress)
        else:
            raise SystemExit(f"--steps-to-run {step!r}: not among ppl, needles")


def rows(args) -> tuple[list[list[str]], dict | None]:
    ppl = load_json(os.path.join(args.output, "ppl", "perplexity.json"))
    needles = load_json(os.path.join(args.output, "needles", "passkey.json"))
    depths = [float(d) for d in args.depths.split(",")]
    base = _ppl(ppl, ppl["setup"]["truncated_baseline"]["label"], args.length) if ppl else None
    table = []
    for label, (cfg, what) in VARIANTS.items():
        r, inside = _ppl(ppl, label, args.length), _ppl(ppl, label, CONTEXT)
        past = r["past_original"]["ppl"] if r and r.get("past_original") else None
        gain = f"{r['context_gain']:.3f}" if r and "context_gain" in r else "–"
        table.append([f"`{label}`: {what} (`{cfg}`)", f"{inside['ppl']:.2f}" if inside else "–",
                      f"{past:.2f}" if past else "–", gain,
                      *_needles(needles, label, args.length, depths)])
    if base and base.get("past_original"):
        edge = 1 - CONTEXT / args.length
        table.append(["the checkpoint as it is, truncated to its 16,384 tokens (needle columns: can it see the "
                      "needle?)", "–",
                      f"{base['past_original']['ppl']:.2f}", "1",
                      *["✓" if d >= edge else "✗" for d in depths], ""])
    return table, ppl


def reading(args, ppl: dict | None) -> list[str]:
    """What the perplexities say, from the numbers: gain or only no loss past 16,384, and which extension keeps the
    checkpoint inside its context."""
    got = {label: (_ppl(ppl, label, CONTEXT), _ppl(ppl, label, args.length)) for label in VARIANTS}
    if ppl is None or any(inside is None or past is None or "context_gain" not in past
                          for label, (inside, past) in got.items() if label != "checkpoint"):
        return []
    extensions = {label: v for label, v in got.items() if label != "checkpoint"}
    gains = {label: past["context_gain"] for label, (_, past) in extensions.items()}
    own_inside, own_past = got["checkpoint"][0]["ppl"], got["checkpoint"][1]["past_original"]["ppl"]
    best = min(extensions, key=lambda label: extensions[label][1]["past_original"]["ppl"])
    same = [label for label, (inside, _) in extensions.items() if abs(inside["ppl"] - own_inside) <= 1e-3 * own_inside]
    verdict = ("every extension gains over truncating there (context gain > 1)" if min(gains.values()) > 1 else
               "no extension beats the checkpoint truncated to 16,384 tokens on those tokens (context gain "
               f"{min(gains.values()):.3f} to {max(gains.values()):.3f}): they avoid the checkpoint's own loss past "
               f"its context ({own_past:.2f}), they do not use the longer context measurably"
               if max(gains.values()) < 1 else "the extensions differ in whether they gain over truncating")
    kept = (f"Inside 16,384 tokens {', '.join(f'`{label}`' for label in same)} equal(s) the checkpoint "
            f"({own_inside:.2f}); " if same else "Inside 16,384 tokens no extension equals the checkpoint; ")
    others = ", ".join(f"`{label}` {inside['ppl']:.2f}" for label, (inside, _) in extensions.items()
                       if label not in same)
    return [f"**Reading it.** Past 16,384, {verdict}. Lowest past 16,384: `{best}` "
            f"({extensions[best][1]['past_original']['ppl']:.2f}). {kept}"
            + (f"the others change it ({others})." if others else "") + " One window of one book.", ""]


def needle_reading(args) -> list[str]:
    """What the needles say, from the numbers: hits before the last 16,384 tokens (where the checkpoint truncated
    there cannot see a needle) per variant, and the accuracy inside them; [] until every variant is measured."""
    report = load_json(os.path.join(args.output, "needles", "passkey.json"))
    results = (report or {}).get("results", {})
    far = {label: (results.get(label) or {}).get("beyond_reach", {}).get(str(args.length)) for label in VARIANTS}
    if any(not got or not got.get("trials") for got in far.values()):
        return []
    edge = 1 - CONTEXT / args.length
    near = {label: [cell["accuracy"] for key, cell in results[label]["cells"].items()
                    if key.startswith(f"{args.length}@") and float(key.split("@")[1]) >= edge] for label in VARIANTS}
    hits = ", ".join(f"`{label}` {got['hits']}/{got['trials']}" for label, got in far.items())
    inside = ", ".join(f"`{label}` {sum(a) / len(a):.2f}" for label, a in near.items() if a)
    return [f"**Needles.** Before the last 16,384 tokens, which the checkpoint truncated there cannot see: {hits}. "
            f"Inside them (which truncating sees), mean accuracy: {inside}. {args.trials} needles per depth, one "
            "book: a difference of a hit or two is noise.", ""]


def section(args, argv: list[str]) -> str:
    table, ppl = rows(args)
    pending = any("–" in row for row in table[:len(VARIANTS)]) or ppl is None  # (the truncated row has no ppl at L)
    said = (" (written with --no-run from the steps finished so far; the command resumes the rest)"
            if args.no_run and pending else "")
    cmds = commands(args)
    lines = [TITLE, "", f"Command: `python scripts/bench_extend_again.py {shlex.join(argv)}`{said}", "",
             f"Machine of this call: {os.cpu_count()} CPU cores, device {args.device}. The checkpoint: "
             f"`{cmds['train'][cmds['train'].index('--output') + 1]}` (bench_finetune_long.py's {RUN} run, "
             f"{args.steps} steps). Measured on {os.path.basename(args.text_file)} (never trained on), its first "
             f"{args.length} tokens.", "",
             *_table(["variant", "ppl at 16,384 (its context)", "ppl past 16,384 (at 24,576)",
                      "context gain vs the checkpoint truncated",
                      *[f"needle @ {d}" for d in args.depths.split(",")], "needles before the last 16,384 (hits)"],
                     table), "",
             "Context gain: the checkpoint truncated to 16,384 tokens over the variant's perplexity of the same "
             "tokens (> 1: the context past 16,384 helped). –: not measured yet.", "",
             *reading(args, ppl), *needle_reading(args),
             *[f"`hf-posenc {shlex.join(c)}`  " for c in cmds.values()]]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    require_book(args.text_file)
    if args.length <= CONTEXT:
        raise SystemExit(f"--length must be past the checkpoint's 16,384 tokens, got {args.length}")
    return run_then_write(args, argv, run_all, section)


if __name__ == "__main__":
    sys.exit(main())
