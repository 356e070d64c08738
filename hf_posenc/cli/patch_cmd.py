"""``hf-posenc patch``: patch a model, optionally evaluate it, save it with a model card, optionally upload it."""

from __future__ import annotations

import logging
import os

from ..checkpoints.models import DEFAULT_MODEL, resolve_source
from ..engines.registry import runnable
from ..eval.tasks import eval_names, lengths_flags, patch_tasks
from ..publishing.patch_job import PatchEvals, PatchJob, UploadSettings, patch_and_save
from ..serving.freezing import check_freeze
from ..serving.gguf_file import original_before_load, patch_gguf
from ..tuning.report import tune_report_beside
from .flags import (
    LoadFlags,
    depths,
    encoding_flag,
    ints,
    method_config,
    method_flags,
    names,
    positive,
    seed,
    upload_flags,
)
from .parser import DefaultsShown

logger = logging.getLogger(__name__)

LOAD = LoadFlags(DEFAULT_MODEL, "Hub id, local folder, .gguf file or alias of the base model.",
                 "where the tokenizer comes from when the model's folder has none (needed only with --eval; saved "
                 "with the checkpoint).", "float32, bfloat16 or float16 (also the dtype saved).",
                 device_help="torch device for the evaluation.")


def add_parser(sub) -> None:
    pa = sub.add_parser("patch", allow_abbrev=False, help="patch a model, optionally evaluate it, save it with a "
                        "model card, optionally upload it to the Hub.", formatter_class=DefaultsShown)
    g = pa.add_argument_group("model and method")
    LOAD.add(g)
    method_flags(g, config_file=True)
    g.add_argument("--output", default=None, help="folder to save the patched checkpoint, tokenizer and model card in "
                   "(or --gguf).")
    g.add_argument("--gguf", default=None, metavar="OUT.gguf",
                   help="instead of --output: write this GGUF file, --model's GGUF with the same tensors (quantized "
                        "ones stay so, byte for byte) and the method's RoPE metadata as llama.cpp reads it (none, pi, "
                        "ntk, yarn, llama3, a frozen longrope; others are refused by name, nothing written). The "
                        "source file is never changed; an existing OUT.gguf is replaced only if hf-posenc wrote it.")
    g.add_argument("--freeze-at", type=int, default=None, metavar="N",
                   help="turn a length-dependent method (dynamic_ntk, dynamic_yarn, longrope) into the static one that "
                        "equals it at N tokens (dynamic_ntk: ntk with a new rope_theta; dynamic_yarn: yarn with factor "
                        "N/L; longrope: the list N picks, a rope_freqs tensor in a --gguf), which vLLM and llama.cpp "
                        "compute. Trade-off: every input "
                        "gets the frequencies of N; a shorter one no longer gets its own (below L: not the unscaled "
                        "ones), a longer one not the further scaled ones.")
    g.add_argument("--dual-chunk-config", action="store_true",
                   help="with --method dca on a Qwen2-family model (qwen2, qwen2_moe, qwen3, qwen3_moe): also write "
                        "Qwen's dual_chunk_attention_config (chunk_size, local_size = local_window, "
                        "original_max_position_embeddings), which SGLang reads; the plain fields keep the original "
                        "context, so engines that do not read it still refuse longer inputs (see serve-config).")
    e = pa.add_argument_group("evaluation (results go into the model card and its model-index metadata)")
    tasks = patch_tasks()
    e.add_argument("--eval", type=names, default=[], help=f"comma-separated eval tasks: {eval_names(tasks)}; each "
                   "compares the patched model with the unpatched one (see 'hf-posenc eval TASK --help').")
    for flag in lengths_flags():
        users = ", ".join(t.name for t in tasks if t.patch.lengths_flag == flag)
        e.add_argument(f"--{flag}-lengths", type=ints, default=None, help=f"lengths of {users} (default: the original "
                       "context and original x factor).")
    e.add_argument("--harness-limit", type=positive, default=50, help="lm-eval prompts per task and length.")
    e.add_argument("--max-gen-tokens", type=positive, default=None,
                   help="tokens generated per lm-eval answer (default: the task's, 128 for RULER).")
    e.add_argument("--text-file", action="append", help="text for perplexity (default: the default corpus, see "
                   "'hf-posenc eval ppl --help'); repeatable.")
    encoding_flag(e)
    e.add_argument("--max-windows", type=positive, default=1, help="perplexity windows per document and length.")
    e.add_argument("--depths", type=depths, default=[0.5], help="passkey needle depths.")
    e.add_argument("--trials", type=positive, default=2, help="passkey keys per (length, depth).")
    e.add_argument("--seed", type=seed, default=0, help="random seed.")
    e.add_argument("--no-progress", action="store_true", help="hide the progress bars.")
    v = pa.add_argument_group("serving check (its verdicts go into the model card's Serving section)")
    v.add_argument("--serve-check", choices=list(runnable()), default=None,
                   help="check the saved folder in this engine before it is moved into place (see 'hf-posenc "
                        "serve-check --help'); a method no engine computes, or one serve-config says this engine "
                        "cannot, is reported so without starting it.")
    v.add_argument("--serve-check-lengths", type=ints, default=None,
                   help="token counts of that check (default: half the original context, and the advertised one "
                        "less one token, at most 32768).")
    v.add_argument("--engine-python", default=None, metavar="PYTHON",
                   help="the Python that has vLLM (default: $HF_POSENC_VLLM_PYTHON, else this one).")
    h = pa.add_argument_group("upload (token: HF_TOKEN or 'hf auth login'; endpoint: HF_ENDPOINT)")
    h.add_argument("--push-to-hub", metavar="USER/NAME", default=None, help="upload the saved folder to this repo.")
    upload_flags(h)



def run(args, command: str) -> int:
    config = method_config(args)
    if args.freeze_at is not None:
        check_freeze(config, args.freeze_at, original_before_load(args.model, config))  # before the load
    if args.gguf is not None:
        return _run_gguf(args, config)
    if not args.output:
        raise ValueError("give --output FOLDER (a patched checkpoint with its model card) or --gguf FILE.gguf")
    lengths = {flag: getattr(args, f"{flag}_lengths") for flag in lengths_flags() if getattr(args, f"{flag}_lengths")}
    evals = PatchEvals(args.eval or [], lengths, args.text_file or [], args.encoding, args.max_windows, args.depths,
                       args.trials, args.harness_limit, args.max_gen_tokens)
    upload = UploadSettings(args.push_to_hub, args.private, args.revision, args.commit_message, args.timeout)
    done = patch_and_save(PatchJob(
        LOAD.settings(args), config, args.output, evals,
        upload, serve_check=args.serve_check, engine_python=args.engine_python,
        serve_check_lengths=args.serve_check_lengths, freeze_at=args.freeze_at,
        dual_chunk_config=args.dual_chunk_config, tuned=_tune_report(args.config, args.model), seed=args.seed,
        command=command, progress=not args.no_progress))
    for report in done["reports"]:
        print(report["table"] + "\n")
    tokenizer = "tokenizer, " if done["tokenizer_saved"] else ""
    print(f"saved: {done['output']} (weights, {tokenizer}config.json with the hf_posenc block, README.md model card)")
    if not done["tokenizer_saved"]:
        print("note: the model has no tokenizer, so none was saved; evaluations of this checkpoint need --tokenizer")
    if done["commit_url"]:
        print(f"uploaded: {done['commit_url']}")
    return 0


def _run_gguf(args, config) -> int:
    """``--gguf``: the GGUF of ``--model`` with the method's RoPE metadata (:mod:`hf_posenc.serving.gguf_file`)."""
    extra = [flag for flag, value in (("--output", args.output), ("--eval", args.eval),
                                      ("--serve-check", args.serve_check), ("--push-to-hub", args.push_to_hub),
                                      ("--tokenizer", args.tokenizer),
                                      ("--dual-chunk-config", args.dual_chunk_config)) if value]
    if extra:
        raise ValueError(f"--gguf writes one GGUF file, without loading the model: drop {', '.join(extra)} (or drop "
                         "--gguf to save, evaluate and upload an HF checkpoint)")
    source = resolve_source(args.model)
    if "gguf_file" not in source.kwargs:
        raise ValueError(f"--gguf patches a GGUF model, and --model {args.model!r} is not one; give a .gguf file (or "
                         "save an HF checkpoint with --output)")
    done = patch_gguf(os.path.join(source.path, source.kwargs["gguf_file"]), args.gguf, config,
                      freeze_at=args.freeze_at)
    cfg = done["config"]
    frozen = f" (frozen at {args.freeze_at} tokens from {config.method})" if args.freeze_at is not None else ""
    print(f"method: {cfg.method} x{cfg.factor:g}{frozen}, original context {cfg.original_max_position_embeddings}")
    for key, value in done["metadata"].items():
        print(f"  {key} = {value}")
    if done["note"]:
        print(f"note: {done['note']}")
    added = f", and {', '.join(done['added'])} written" if done["added"] else ""
    print(f"saved: {done['output']} ({done['tensors']} tensors of the source, byte for byte{added})")
    return 0


def _tune_report(config_path: str | None, model: str):
    """The tune report beside a best.json (its table goes into the model card), when there is one and it tuned
    ``model``; a best.json tuned on another model is applied as given, said in a warning, without that report."""
    report = tune_report_beside(config_path) if config_path else None
    if report is None:
        return None
    tuned = str(report.get("setup", {}).get("model_source", ""))
    try:
        source = resolve_source(model)
    except ValueError:  # the load that follows names what is wrong with --model
        return None
    here = source.label or source.path
    if tuned == here or (os.path.exists(tuned) and os.path.exists(here) and os.path.samefile(tuned, here)):
        return report
    logger.warning("%s was tuned on %s, not on %s: it is applied as given, and the model card does not show that "
                   "tuning (its numbers are another model's)", config_path, tuned or "another model", here)
    return None
