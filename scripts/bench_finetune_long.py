"""Does a short fine-tune past L make SmolLM2-135M (L = 8,192) *use* the context past L? PoSE windows (arXiv
2309.10400) whose position ids cover the target length, LoRA with trainable embeddings and norms (LongLoRA, arXiv
2309.12307) or every weight, after YaRN x2 and PI x2, on the shared books other than the held-out one; then on the
held-out book at the target length, before and after training:

- perplexity of the tokens past L, beside the original model truncated to L (context gain > 1: the context past L
  is used), and the fine-tuned weights' own truncated baseline (what ``hf-posenc eval ppl`` computes);
- needles in the book's prose (``--haystack text``, RULER's wording), 5 keys per depth; a model truncated to L only
  sees needles at depth >= 1 - L / T, so the shallower depths say whether anything is retrieved from past L;
- the ceiling for this model: the unpatched model given 8,192 tokens instead of 4,096 (inside L) on the same book.

Every number comes from an ordinary ``hf-posenc finetune`` / ``hf-posenc eval`` command (printed in the section)
whose cells resume; a finished training run is not repeated, and one stopped midway resumes from its last checkpoint
(``--checkpoint-every``). Each run is kept under its step count (``<run>-<steps>steps``), so a longer run is a new
row beside the shorter ones. The order puts what answers the question first (per
run: perplexity before, training, perplexity after, needles at the depths truncation cannot see), the other depths
last, so a stopped run has the most useful part. CPU cost (2 cores): a training step of a 2,048-token window ~35-60
s, a 16,384-token forward ~150 s (each needle is one).

    python scripts/bench_finetune_long.py --write
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys

from _bench import BOOK, ROOT, comma_list, load_json, rel, require_book, run_cli, run_then_write

TITLE = "## Fine-tuning past L: PoSE + LoRA / full on SmolLM2, before and after at 16,384 tokens"
BOOKS = os.path.dirname(BOOK)
RUNS = {  # name -> (method, LoRA?)
    "yarn-lora": ("yarn", True), "pi-lora": ("pi", True), "yarn-full": ("yarn", False), "pi-full": ("pi", False),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="base model (Hub id, folder, .gguf file or alias).")
    p.add_argument("--runs", type=comma_list(str), default=list(RUNS),
                   help=f"training runs in the order they are made (of {', '.join(RUNS)}).")
    p.add_argument("--factor", type=float, default=2.0, help="the scaling factor of yarn and pi.")
    p.add_argument("--target-length", type=int, default=16384, help="PoSE's target and the evaluation length.")
    p.add_argument("--original-context", type=int, default=8192, help="the model's original context L (SmolLM2's "
                   "8192; the inside-L ceiling is measured for L = 8192 and --target-length 16384 only).")
    p.add_argument("--pose-window", type=int, default=2048, help="tokens per PoSE training window.")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps of each training run (a run is kept under "
                   "its step count: another --steps is another run, shown beside it).")
    p.add_argument("--checkpoint-every", type=int, default=5, help="optimizer steps between the resumable "
                   "checkpoints of a training run (a stopped run resumes from its last one).")
    p.add_argument("--lora-r", type=int, default=8, help="LoRA rank of the *-lora runs.")
    p.add_argument("--lora-learning-rate", type=float, default=1e-4, help="peak learning rate of the *-lora runs.")
    p.add_argument("--full-learning-rate", type=float, default=2e-5, help="peak learning rate of the *-full runs "
                   "(YaRN's).")
    p.add_argument("--train", type=comma_list(str), default=["pg1342.txt", "pg1513.txt"],
                   help="training books in ../shared/data/books (comma-separated).")
    p.add_argument("--text-file", default=BOOK, help="the held-out book measured on (default: Frankenstein).")
    p.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9", help="needle depths.")
    p.add_argument("--trials", type=int, default=5, help="needle keys per depth.")
    p.add_argument("--device", default="cpu", help="torch device.")
    p.add_argument("--seed", type=int, default=0, help="random seed of training (data order, PoSE skips).")
    p.add_argument("--checkpoints", default=os.path.join(ROOT, "runs", "finetune_long"),
                   help="where the trained checkpoints go (not versioned).")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "finetune_long"),
                   help="folder of the evaluation runs and copies of the training reports.")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    p.add_argument("--no-run", action="store_true", help="only write the section from the reports already there.")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars.")
    return p


def variant(args, run: str | None, method: str) -> str:
    """``LABEL=METHOD:factor=F,original_max_position_embeddings=L`` (explicit: a fine-tuned checkpoint's config
    already holds the scaling)."""
    return f"{run or method}={method}:factor={args.factor:g},original_max_position_embeddings={args.original_context}"


def _folder(args, run: str) -> str:
    """A run's folder name: the run and its step count."""
    return f"{run}-{args.steps}steps"


def _checkpoint(args, run: str) -> str:
    return os.path.join(args.checkpoints, _folder(args, run))


def trained_folders(args, run: str) -> list[tuple[int, str]]:
    """``(steps, folder name)`` of every trained or evaluated length of ``run`` under ``--output``, fewest first."""
    got = []
    for name in os.listdir(args.output) if os.path.isdir(args.output) else []:
        m = re.fullmatch(re.escape(run) + r"-(\d+)steps", name)
        if m:
            got.append((int(m.group(1)), name))
    return sorted(got)


def commands(args, run: str) -> dict[str, list[str]]:
    """The ``hf-posenc`` argv of one run: train, and evaluate before (the base model patched, one folder shared by
    every run) and after (the trained checkpoint), perplexity and needles."""
    method, lora = RUNS[run]
    books = [a for b in args.train for a in ("--text-file", rel(os.path.join(BOOKS, b)))]
    lr = args.lora_learning_rate if lora else args.full_learning_rate
    train = ["finetune", "--model", args.model, "--method", method, "--factor", f"{args.factor:g}", *books,
             "--eval-text-file", rel(args.text_file), "--pose-window", str(args.pose_window), "--target-length",
             str(args.target_length), "--seq-len", str(args.pose_window), "--eval-windows", "2", "--steps",
             str(args.steps), "--learning-rate", f"{lr:g}", "--warmup-steps", str(max(1, args.steps // 20)),
             "--seed", str(args.seed), "--device", args.device, "--no-long-eval",  # the eval commands below, resumable
             "--checkpoint-every", str(args.checkpoint_every), "--resume", "--output", rel(_checkpoint(args, run))]
    if lora:
        train += ["--lora-r", str(args.lora_r), "--lora-merge"]
    common = ["--lengths", str(args.target_length), "--device", args.device]
    ppl = ["eval", "ppl", *common, "--text-file", rel(args.text_file), "--max-windows", "1"]
    needles = ["eval", "passkey", *common, "--trials", str(args.trials), "--haystack", "text", "--text-file",
               rel(args.text_file)]
    base = ["--model", args.model, "--variant", variant(args, None, method)]
    after = ["--model", rel(_checkpoint(args, run)), "--variant", variant(args, run, method)]
    out = lambda *parts: ["--output", rel(os.path.join(args.output, *parts))]  # noqa: E731
    return {"train": train,
            "ppl_before": [*ppl, *base, *out("before", method, "ppl")],
            "ppl_after": [*ppl, *after, *out(_folder(args, run), "ppl")],
            "needles_before": [*needles, *base, "--depths", args.depths, *out("before", method, "needles")],
            "needles_after": [*needles, *after, "--depths", args.depths, *out(_folder(args, run), "needles")]}


def beyond(args, depths: str) -> str:
    """The depths of ``depths`` a model truncated to L cannot see (all of them when none is)."""
    edge = 1 - args.original_context / args.target_length
    near = [d for d in depths.split(",") if float(d) < edge]
    return ",".join(near) or depths


def ceiling(args) -> dict:
    """The model's own gain from more context inside L, on the held-out book, in ``ceiling.json``: the tokens
    8,192..16,383 of the first 16,384 (those scored past L) given at most 8,192 tokens before each (stride 2,048,
    as ``eval ppl``'s truncated baseline) and at most 4,096 (stride 1,024); and the same on the first 8,192 tokens
    (the tokens past 4,096 with their whole context vs at most 4,096)."""
    path = os.path.join(args.output, "ceiling.json")
    got = load_json(path) or {}
    if "past_l" in got or args.no_run or (args.original_context, args.target_length) != (8192, 16384):
        return got
    import math

    import torch

    from hf_posenc.checkpoints.runtime import load_model_and_tokenizer
    from hf_posenc.eval.perplexity import truncated_nll
    from hf_posenc.eval.scoring import token_nll
    from hf_posenc.io.documents import read_text_file, tokenize_documents

    lm, tok, _ = load_model_and_tokenizer(args.model, "float32", args.device)
    ids = tokenize_documents(tok, [read_text_file(args.text_file)], 16384)[0][None].to(args.device)
    ppl = lambda nll: math.exp(nll.double().mean().item())  # noqa: E731
    with torch.no_grad():
        if "ppl_8192" not in got:  # inside L: the first 8,192 tokens
            first = ids[:, :8192]
            got.update(tokens=4096, ppl_8192=ppl(token_nll(lm, first, start=4096)[0]),
                       ppl_truncated_4096=ppl(truncated_nll(lm, first, 4096, 1024)[0, 4095:]))
            got["context_gain"] = got["ppl_truncated_4096"] / got["ppl_8192"]
        window = ids[:, :16384]
        at_l, at_half = (ppl(truncated_nll(lm, window, n, n // 4)[0, 8191:]) for n in (8192, 4096))
    got.update(book=os.path.basename(args.text_file), model=args.model,
               past_l={"tokens": 16384 - 8192, "ppl_truncated_8192": at_l, "ppl_truncated_4096": at_half,
                       "context_gain": at_half / at_l})
    os.makedirs(args.output, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(got, f, indent=1)
    return got


def train(args, run: str, argv: list[str]) -> None:
    """``hf-posenc finetune`` unless the checkpoint is there; its report copied to ``<output>/<run>/`` unless one is
    there already (a checkpoint trained again, as on a new machine, leaves the recorded training as it was)."""
    import shutil

    report = os.path.join(_checkpoint(args, run), "hf_posenc_eval", "finetune.json")
    if load_json(report) is None:  # (resumed from its last checkpoint when an earlier call was stopped)
        run_cli(argv, args.no_progress)
    dest = os.path.join(args.output, _folder(args, run), "training")
    if load_json(os.path.join(dest, "finetune.json")) is not None:
        return
    os.makedirs(dest, exist_ok=True)
    for name in ("finetune.json", "finetune.md", "finetune_loss.png"):
        if os.path.isfile(os.path.join(os.path.dirname(report), name)):
            shutil.copy(os.path.join(os.path.dirname(report), name), dest)


def run_all(args) -> None:
    ceiling(args)
    for run in args.runs:  # what answers the question first
        argv = commands(args, run)
        run_cli(argv["ppl_before"], args.no_progress)
        train(args, run, argv["train"])
        run_cli(argv["ppl_after"], args.no_progress)
        near = beyond(args, args.depths)
        for key in ("needles_before", "needles_after"):
            run_cli([*argv[key][: argv[key].index("--depths") + 1], near, *argv[key][argv[key].index("--depths") + 2:]],
                    args.no_progress)
    for run in args.runs:  # then every depth
        argv = commands(args, run)
        run_cli(argv["needles_before"], args.no_progress)
        run_cli(argv["needles_after"], args.no_progress)


def _ppl(report: dict | None, label: str, length: int) -> dict | None:
    r = (report or {}).get("results", {}).get(label, {}).get(str(length))
    return r


def _baseline(report: dict | None, length: int) -> dict | None:
    if report is None:
        return None
    return _ppl(report, report["setup"]["truncated_baseline"]["label"], length)["past_original"]


def _needles(report: dict | None, label: str, length: int, depths: list[float]) -> list[str]:
    r = (report or {}).get("results", {}).get(label)
    if r is None:
        return ["–"] * (len(depths) + 1)
    cells = r["cells"]
    got = [f"{cells[f'{length}@{d:g}']['accuracy']:.1f}" if f"{length}@{d:g}" in cells else "–" for d in depths]
    exact = (r.get("beyond_reach") or {}).get(str(length))
    return got + [f"{exact['hits']}/{exact['trials']}" if exact and exact["trials"] else "–"]


def rows(args) -> list[list[str]]:
    """One row per model: the base model patched (before) and each trained checkpoint (after)."""
    n, depths = args.target_length, [float(d) for d in args.depths.split(",")]
    out, table = args.output, []
    methods = list(dict.fromkeys(RUNS[r][0] for r in args.runs))
    base_truncated = None
    for method in methods:
        ppl = load_json(os.path.join(out, "before", method, "ppl", "perplexity.json"))
        base_truncated = base_truncated or _baseline(ppl, n)
    for name, _method, folder, label in ([(f"{m} x{args.factor:g}, training-free", m, os.path.join("before", m), m)
                                         for m in methods]
                                        + [(f"{r}{f', {k} steps' if k else ''}: PoSE {args.pose_window} -> {n}",
                                            RUNS[r][0], f, r)
                                           for r in args.runs for k, f in trained_folders(args, r) or [(0, r)]]):
        ppl = load_json(os.path.join(out, folder, "ppl", "perplexity.json"))
        needles = load_json(os.path.join(out, folder, "needles", "passkey.json"))
        r = _ppl(ppl, label, n)
        past = r["past_original"]["ppl"] if r and r.get("past_original") else None
        gain = f"{base_truncated['ppl'] / past:.3f}" if past and base_truncated else "–"
        own = f"{r['context_gain']:.3f}" if r and "context_gain" in r else "–"
        table.append([name, f"{past:.2f}" if past else "–", gain, own, *_needles(needles, label, n, depths)])
    table += measured_rows(args, base_truncated, depths)
    if base_truncated:
        table.append(["original model, truncated to L (needle columns: can it see the needle?)",
                      f"{base_truncated['ppl']:.2f}", "1", "",
                      *["✓" if d >= 1 - args.original_context / n else "✗" for d in depths], ""])
    return table


MEASURED = {"self_extend": "self_extend-window_2046-group_size_3", "dca": "dca-default"}  # bench_context_use labels


def measured_rows(args, base_truncated: dict | None, depths: list[float]) -> list[list[str]]:
    """The training-free attention-level rows already measured on the same book, window and needle grid by
    ``bench_context_use.py`` (``benchmarks/context_use/<length>/``), when they are there."""
    n = args.target_length
    folder = os.path.join(ROOT, "benchmarks", "context_use", str(n))
    ppl = load_json(os.path.join(folder, "ppl", "perplexity.json"))
    needles = load_json(os.path.join(folder, "needle_text", "passkey.json"))
    got = []
    for method, label in MEASURED.items():
        r = _ppl(ppl, label, n)
        if not r or not r.get("past_original"):
            continue
        past = r["past_original"]["ppl"]
        gain = f"{base_truncated['ppl'] / past:.3f}" if base_truncated else "–"
        got.append([f"{method}, training-free (bench_context_use.py)", f"{past:.2f}", gain,
                    f"{r['context_gain']:.3f}", *_needles(needles, label, n, depths)])
    return got


def training_rows(args) -> list[list[str]]:
    got = []
    for run, folder in [(r, f) for r in args.runs for _, f in trained_folders(args, r) or [(0, r)]]:
        rep = load_json(os.path.join(args.output, folder, "training", "finetune.json"))
        if rep is None:
            got.append([run, "not trained yet", "", "", "", "", ""])
            continue
        s, losses = rep["setup"], [x["loss"] for x in rep["losses"]]
        k = min(5, len(losses))
        tokens = s["blocks_seen"] * s["pose"]["window"]
        lora = f"r={s['lora']['r']}, embeddings and norms" if s.get("lora") else "every weight"
        got.append([run, lora, f"{s['blocks_seen']} x {s['pose']['window']} = {tokens:,}", f"{s['learning_rate']:g}",
                    f"{sum(losses[:k]) / k:.3f} -> {sum(losses[-k:]) / k:.3f}",
                    f"{rep['heldout_before']['ppl']:.2f} -> {rep['heldout_after']['ppl']:.2f}",
                    f"{s['seconds'] / 60:.0f}"])
    return got


def verdicts(args) -> list[str]:
    """What each trained run did, plainly: its ppl past L before and after, beside the same weights truncated to L
    (training that only fits the prose lowers both; using the context past L puts the first below the second)."""
    n, said = args.target_length, []
    for run, steps, folder in [(r, k, f) for r in args.runs for k, f in trained_folders(args, r)]:
        method = RUNS[run][0]
        before = _ppl(load_json(os.path.join(args.output, "before", method, "ppl", "perplexity.json")), method, n)
        after = _ppl(load_json(os.path.join(args.output, folder, "ppl", "perplexity.json")), run, n)
        if not (before and after and after.get("context_gain")):
            continue
        own = after["past_original"]["ppl"] * after["context_gain"]  # the same weights, truncated to L
        used = after["context_gain"] > 1.0
        said.append(f"**{run}, {steps} steps**: ppl past L {before['past_original']['ppl']:.2f} -> "
                    f"{after['past_original']['ppl']:.2f}; "
                    f"the same trained weights truncated to L: {own:.2f}. "
                    + ("The trained model predicts the tokens past L better with the context past L than without it: "
                       "it uses that context." if used else "Training lowered the perplexity at every length (it "
                       "fitted the prose) but the context past L still does not help: no gain in context use."))
    return said


def _table(head: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in body)]


def command_lines(args) -> list[str]:
    """Every command behind the section's numbers, once each, in the order they run: per run and step count, the
    training (as it was run, when its report recorded that) and the evaluations before and after (reading the
    checkpoint where that training wrote it)."""
    said: dict[str, None] = {}
    for run in args.runs:
        for steps in sorted({k for k, _ in trained_folders(args, run)} | {args.steps}):
            these = argparse.Namespace(**{**vars(args), "steps": steps})
            argv = commands(these, run)
            report = load_json(os.path.join(args.output, _folder(these, run), "training", "finetune.json"))
            ran = (report or {}).get("setup", {}).get("command")
            if ran and ran != f"hf-posenc {shlex.join(argv['train'])}":
                ran_argv = shlex.split(ran)
                folder = ran_argv[ran_argv.index("--output") + 1] if "--output" in ran_argv else None
                for key in ("ppl_after", "needles_after") if folder else ():
                    argv[key][argv[key].index("--model") + 1] = folder
                said[f"`{ran}` (the training as it was run)  "] = None
            else:
                said[f"`hf-posenc {shlex.join(argv['train'])}`  "] = None
            for key in ("ppl_before", "ppl_after", "needles_before", "needles_after"):
                said[f"`hf-posenc {shlex.join(argv[key])}`  "] = None
    return list(said)


def section(args, argv: list[str]) -> str:
    n, depths = args.target_length, args.depths.split(",")
    top = ceiling(args)
    table = rows(args)
    missing = any("–" in row for row in table)
    other_steps = re.compile(rf", (?!{args.steps} steps)\d+ steps: ")  # rows the command does not compute
    pending = any("–" in row for row in table if not other_steps.search(row[0]))
    said = (" (this section was written with --no-run from the runs finished so far; the command resumes the rest)"
            if args.no_run and pending else "")
    lines = [TITLE, "", f"Command: `python scripts/bench_finetune_long.py {shlex.join(argv)}`{said}", "",
             f"Machine of this call: {os.cpu_count()} CPU cores, device {args.device}. Trained on "
             f"{', '.join(args.train)}; measured on {os.path.basename(args.text_file)} (never trained on), its first "
             f"{n} tokens.", "", "Training (one PoSE window per step, AdamW, cosine schedule, activation "
             "checkpointing, chunked loss; held-out perplexity at the window length):", "",
             *_table(["run", "trained", "blocks x tokens = tokens seen", "learning rate",
                      "train loss (first 5 -> last 5)", f"held-out ppl at {args.pose_window}", "minutes"],
                     training_rows(args)), "",
             f"At {n} tokens (ppl of the tokens past L = {args.original_context}; needles: {args.trials} keys per "
             "depth in the book's prose):", "",
             *_table(["model", "ppl past L", "context gain vs the original truncated", "gain vs its own truncated",
                      *[f"needle @ {d}" for d in depths], "needles before the last L tokens (hits)"], table), ""]
    lines += [*verdicts(args), ""] if verdicts(args) else []
    if top:
        lines += [f"The ceiling for this model, inside L, on {top['book']}: given 8192 tokens instead of 4096, the "
                  f"unpatched model predicts the tokens past 4096 of the first 8192 with ppl {top['ppl_8192']:.2f} vs "
                  f"{top['ppl_truncated_4096']:.2f} (context gain {top['context_gain']:.4f})"
                  + (f"; the very tokens scored past L above (8192..16383) with at most 8192 tokens before each vs "
                     f"at most 4096: ppl {top['past_l']['ppl_truncated_8192']:.2f} vs "
                     f"{top['past_l']['ppl_truncated_4096']:.2f} (context gain "
                     f"**{top['past_l']['context_gain']:.4f}**)" if "past_l" in top else "")
                  + ". Doubling the context inside L gains this much on this book: a gain near that past L is what "
                  "using the context would look like for SmolLM2-135M.", ""]
    lines += [("–: not measured (the command measures every depth of the runs of its --steps; a row of another step "
               "count keeps the depths it was measured at). " if missing else "")
              + "Context gain vs the original truncated: the original model's ppl past L with at most L tokens of "
              "context, over the row's (> 1: better than simply truncating). Own truncated: the same weights, "
              "unpatched, truncated to L (what `hf-posenc eval ppl` reports).", "", *command_lines(args)]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    require_book(args.text_file)
    unknown = [r for r in args.runs if r not in RUNS]
    if unknown:
        raise SystemExit(f"--runs {unknown}: not among {', '.join(RUNS)}")
    for b in args.train:
        require_book(os.path.join(BOOKS, b))
    return run_then_write(args, argv, run_all, section)


if __name__ == "__main__":
    sys.exit(main())
