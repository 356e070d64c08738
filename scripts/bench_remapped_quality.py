"""Quality of the long-context methods side by side on a real model: SmolLM2-135M (original context 8,192)
at 12,288 (1.5x) and 16,384 (2x) tokens, perplexity by position and passkey retrieval at depths 0.1/0.5/0.9,
for none, yarn, dynamic_ntk, dynamic_yarn, self_extend, dca, string, rerope and leaky_rerope (dynamic NTK because
the tune ranked it first at 12k).

Knobs are chosen on one book and reported on another: for each method, the configuration that
``hf-posenc tune`` ranked best among that method's candidates for the same target length on Pride and
Prejudice (``scripts/bench_tune.py``, ``benchmarks/tune/<T>/``); the numbers here are measured on
Frankenstein. Each length is two ordinary ``hf-posenc eval`` commands (ppl, passkey), printed with their
tables; the runs resume (cells.jsonl), so the script can be killed and run again. With --write the section
replaces this script's section of BENCHMARKS.md.

CPU cost (2 cores): one forward of SmolLM2 is ~90 s at 12k and ~150 s at 16k; each method costs one
perplexity window and one passkey prompt per depth and key, so with the defaults ~45 min at 12k and
~80 min at 16k.

    python scripts/bench_remapped_quality.py --write
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys

from _bench import ROOT, comma_list, rel, require_book, run_cli, tuned_run_flags

TITLE = "## Training-free long context side by side: perplexity and passkey (tuned on one book, measured on another)"
METHODS = ["yarn", "dynamic_ntk", "dynamic_yarn", "self_extend", "dca", "string", "rerope", "leaky_rerope"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, .gguf file or alias).")
    p.add_argument("--lengths", type=comma_list(int), default=[12288, 16384],
                   help="lengths in tokens (comma-separated); each needs a finished tune run for it in --tune.")
    p.add_argument("--methods", type=comma_list(str), default=METHODS,
                   help="methods compared with the unpatched model.")
    tuned_run_flags(p, "remapped_quality", "0.1,0.5,0.9", 1)
    return p


def chosen_variants(tune_dir: str, methods: list[str]) -> list[tuple[str, str, str]]:
    """(method, the ``--variant`` of its best-ranked tune candidate, that candidate's overall rank, with its short-input
    cost when the tune disqualified it) per method."""
    from hf_posenc.tuning.report import ranked_rows

    tune_json, space_json = os.path.join(tune_dir, "tune.json"), os.path.join(tune_dir, "space.json")
    for path in (tune_json, space_json):
        if not os.path.isfile(path):
            raise SystemExit(f"{rel(path)}: missing; run scripts/bench_tune.py for this length first")
    with open(tune_json, encoding="utf-8") as f:
        res = json.load(f)["results"]
    with open(space_json, encoding="utf-8") as f:
        space = {entry.split("=", 1)[0]: entry for entry in json.load(f)}
    rows = ranked_rows(res)
    out = []
    for method in methods:
        mine = [row for row in rows if res["configs"][row[1]]["method"] == method]
        if not mine:
            raise SystemExit(f"{rel(tune_json)} has no {method} candidate; add one to scripts/bench_tune.py")
        rank, label, status, cost = mine[0][0], mine[0][1], mine[0][3], mine[0][-1]
        said = f"{rank} (disqualified: {cost} on inputs of L tokens)" if status.startswith("disqualified") \
            else str(rank)
        out.append((method, space[label], said))
    return out


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _split_ppl(curve: list[dict], tokens: int, original: int) -> tuple[int, float, float]:
    """(E, perplexity of the predicted tokens before E, from E on), E the bucket edge of the loss curve
    nearest the original context."""
    edge = min((b["from"] for b in curve[1:]), key=lambda e: abs(e - original))
    sizes = [b["to"] - b["from"] for b in curve]
    if sum(sizes) != tokens:
        raise SystemExit(f"the loss curve covers {sum(sizes)} tokens, the window {tokens}: cannot split it")
    parts = [[(b["nll"], n) for b, n in zip(curve, sizes) if (b["from"] < edge) == before] for before in (True, False)]
    before, after = (math.exp(sum(x * n for x, n in p) / sum(n for _, n in p)) for p in parts)
    return edge, before, after


def side_by_side(out: str, length: int, chosen: list[tuple[str, str, int]]) -> list[str]:
    """One table: each method's configuration, perplexity (whole window, before and after the original
    context) and passkey hit rate per depth."""
    ppl, pk = _load(os.path.join(out, "ppl", "perplexity.json")), _load(os.path.join(out, "passkey", "passkey.json"))
    original, depths = ppl["setup"]["original_context"], pk["setup"]["depths"]
    base = ppl["setup"]["truncated_baseline"]
    truncated = ppl["results"][base["label"]][str(length)]
    rows, edge = [], None
    for method, variant in [("none", "none"), *[(m, v) for m, v, _ in chosen]]:
        label = variant.split("=", 1)[0]
        r = ppl["results"][label][str(length)]
        edge, before, after = _split_ppl(r["curve"], r["tokens"], original)
        cells = pk["results"][label]["cells"]
        hits = [f"{cells[f'{length}@{d:g}']['accuracy']:.2f}" for d in depths]
        rows.append(f"| {method} | `{variant}` | {r['ppl']:.2f} | {before:.2f} | {after:.2f} | "
                    f"{r['past_original']['ppl']:.2f} | {r['context_gain']:.3f} | {' | '.join(hits)} |")
    past = truncated["past_original"]
    rows.append(f"| none, truncated to L | {base['context']} tokens at most before each (stride {base['stride']}) | "
                f"{truncated['ppl']:.2f} | | | {past['ppl']:.2f} | 1 | {' | '.join('' for _ in depths)} |")
    head = (f"| method | configuration | ppl (whole window) | ppl, tokens < {edge} | ppl, tokens >= {edge} | "
            f"ppl, tokens >= {past['from']} | context gain | " + " | ".join(f"passkey @ {d:g}" for d in depths) + " |")
    return [head, "|" + "---|" * (7 + len(depths)), *rows]


def gain_verdict(out: str, length: int, chosen: list[tuple[str, str, int]]) -> str:
    """Which methods used the context past L (context gain > 1.01) and which only avoided breaking."""
    ppl = _load(os.path.join(out, "ppl", "perplexity.json"))
    gains = {m: ppl["results"][v.split("=", 1)[0]][str(length)]["context_gain"] for m, v, _ in chosen}
    used = [f"{m} ({g:.3f})" for m, g in gains.items() if g > 1.01]
    held = [f"{m} ({g:.3f})" for m, g in gains.items() if 0.99 <= g <= 1.01]
    lost = [f"{m} ({g:.3f})" for m, g in gains.items() if g < 0.99]
    return ("Context gain past L (the truncated baseline's perplexity of the same tokens over the method's): "
            f"used the context past L (> 1.01): {', '.join(used) or 'none'}; within 1% of truncation, i.e. did "
            f"not break but gained nothing measurable: {', '.join(held) or 'none'}; worse than truncating to L "
            f"(< 0.99): {', '.join(lost) or 'none'}. One window of one book: a small sample.")


def run_length(args, length: int) -> list[str]:
    """Both evaluations at ``length``; the lines of its part of the section."""
    chosen = chosen_variants(os.path.join(args.tune, str(length)), args.methods)
    variants = [a for _, variant, _ in chosen for a in ("--variant", variant)]
    out = os.path.join(args.output, str(length))
    common = ["--model", args.model, "--methods", "none", *variants, "--lengths", str(length), "--device", args.device]
    ppl = ["eval", "ppl", *common, "--text-file", rel(args.text_file), "--max-windows", "1",
           "--output", rel(os.path.join(out, "ppl"))]
    passkey = ["eval", "passkey", *common, "--depths", args.depths, "--trials", str(args.trials),
               "--output", rel(os.path.join(out, "passkey"))]
    run_cli(ppl, args.no_progress)
    run_cli(passkey, args.no_progress)
    ranks = ", ".join(f"{m} {rank}" for m, _, rank in chosen)
    return [f"### {length} tokens", "", *side_by_side(out, length, chosen), "", gain_verdict(out, length, chosen), "",
            f"Rank of each configuration in the tune run for {length} (out of all its candidates): {ranks}.", "",
            f"![loss by position]({rel(out)}/ppl/loss_by_position_{length}.png)", "",
            f"Perplexity: `hf-posenc {shlex.join(ppl)}`  ", f"Passkey: `hf-posenc {shlex.join(passkey)}`  ",
            compute_line(out), ""]


def compute_line(out: str) -> str:
    """The compute time of this length's cells, summed over the calls that computed them (the runs resume)."""
    spent = [_load(os.path.join(out, task, name))["setup"]["compute"]
             for task, name in (("ppl", "perplexity.json"), ("passkey", "passkey.json"))]
    cells, untimed = sum(c["cells"] for c in spent), sum(c["untimed"] for c in spent)
    if untimed == cells:
        return (f"Compute: not recorded for these {cells} cells (computed before `hf-posenc eval` recorded each "
                "cell's time).")
    line = f"Compute: {sum(c['seconds'] for c in spent) / 60:.1f} min for {cells} cells"
    if untimed:
        line += f" ({untimed} of them computed by a release that did not record their time, not counted)"
    return line + "."


def main(argv: list[str] | None = None) -> int:
    from hf_posenc.io.reports import emit_section

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    require_book(args.text_file)
    parts = [TITLE, "", f"Command: `python scripts/bench_remapped_quality.py {shlex.join(argv)}`", "",
             f"Machine: {os.cpu_count()} CPU cores, device {args.device}. How the knobs were chosen: for each method, "
             "the candidate `hf-posenc tune` ranked best among that method's candidates for the same length on "
             "pg1342.txt (Pride and Prejudice; see the tune section); measured here on "
             f"{os.path.basename(args.text_file)}. Passkey: {args.trials} key(s) per depth, so each depth is a "
             "single hit or miss -- a coarse signal. The dynamic methods recompute their frequencies for the length "
             "they are given: on one whole window of T tokens dynamic YaRN is YaRN with factor T/L whatever its "
             "`factor` knob (a floor only with `finetuned`), so its row equals YaRN's wherever the tune chose "
             "factor T/L for YaRN -- the same numbers, not a copy. STRING's only candidate in the tune was its "
             "defaults, which put keys past the original context at both lengths (see the tune section): its rows "
             "are STRING past its reach.", ""]
    for length in args.lengths:
        parts += run_length(args, length)
    emit_section("\n".join(parts).rstrip() + "\n", args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
