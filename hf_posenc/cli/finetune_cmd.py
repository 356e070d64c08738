"""``hf-posenc finetune``: patch a model and adapt it with a short continued training on long documents."""

from __future__ import annotations

from ..checkpoints.models import DEFAULT_MODEL
from ..io.documents import BUILTIN_CORPORA, builtin_corpus, gather_documents, read_text_file
from ..io.output_folder import check_replaced_output
from ..training.finetune import PoseSettings, check_pose_method, finetune
from ..training.long_eval import DEPTHS, LongEvalSettings
from ..training.lora import LoraSettings, require_peft
from ..training.settings import CheckpointSettings, TrainSettings
from .flags import LoadFlags, data_flags, floats, method_config, method_flags, names, positive, seed
from .parser import DefaultsShown

# the built-in corpus's 4 documents: these trained on, that one held out (document 0 shares passages with 3)
CORPUS_TRAIN, CORPUS_HELD_OUT = (1, 2), 3

# --model goes with the method; the precision and the device with the training
LOAD = LoadFlags(DEFAULT_MODEL, "Hub id, local folder, .gguf file or alias of the base model.", tokenizer_help=None,
                 dtype_help="float32 or bfloat16: the precision the weights are loaded and trained in (bfloat16: the "
                            "optimizer state too; prefer --mixed-precision bf16).",
                 device=None, device_help="torch device (default: cuda if available, else cpu).")


def add_parser(sub) -> None:
    ft = sub.add_parser("finetune", allow_abbrev=False, help="patch a model and adapt it with a short continued "
                        "training on long documents (Trainer + accelerate), measuring held-out perplexity before and "
                        "after.",
                        formatter_class=DefaultsShown)
    g = ft.add_argument_group("model and method")
    LOAD.add_model(g)
    method_flags(g, required=True)
    g.add_argument("--output", required=True,
                   help="folder for the trained checkpoint, its card and the training report.")
    d = data_flags(ft, "train", "training ")
    d.add_argument("--corpus", choices=BUILTIN_CORPORA, default=None,
                   help="train on a built-in corpus, nothing outside the package read (python-docs: CPython's "
                        f"Language Reference in 4 documents): documents {CORPUS_TRAIN} trained on, document "
                        f"{CORPUS_HELD_OUT} held out unless --eval-text-file is given.")
    d.add_argument("--eval-text-file", action="append", default=None,
                   help="held-out text (never trained on) for perplexity before/after; repeatable (required unless "
                        "--corpus holds out its own).")
    t = ft.add_argument_group("training")
    t.add_argument("--seq-len", type=positive, default=1024,
                   help="tokens per packed training sequence (and eval window).")
    t.add_argument("--steps", type=positive, default=40, help="optimizer steps.")
    t.add_argument("--learning-rate", type=float, default=1e-4, help="peak learning rate (AdamW, cosine decay).")
    t.add_argument("--batch-size", type=positive, default=1, help="sequences per device step.")
    t.add_argument("--grad-accum", type=positive, default=1, help="gradient-accumulation steps per optimizer step.")
    t.add_argument("--warmup-steps", type=int, default=0, help="linear warm-up steps.")
    t.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay.")
    t.add_argument("--no-gradient-checkpointing", action="store_true", help="keep activations (faster, more memory).")
    _lora_flags(ft)
    _pose_flags(ft)
    t.add_argument("--packing", choices=["document", "stream", "stream-restart"], default="document",
                   help="document: each document cut into blocks of its own (no block straddles two; remainders "
                        "dropped); stream: documents joined with EOS and cut into blocks; stream-restart: the same, "
                        "position ids starting again after each EOS.")
    t.add_argument("--full-logits-loss", action="store_true",
                   help="compute the training loss from the model's whole [tokens x vocab] logits (the default runs "
                        "the LM head and the loss over chunks, recomputed in the backward pass: far less memory at "
                        "long lengths, the same loss).")
    t.add_argument("--context-parallel-size", type=positive, default=1,
                   help="split each training sequence across this many processes (accelerate's context parallelism, "
                        "torch ring attention over SDPA on FSDP2; accelerators only; the model's own full-logits "
                        "loss). Static RoPE scalings, none and nope only; must divide the processes, and twice it the "
                        "training length.")
    t.add_argument("--eval-windows", type=positive, default=4,
                   help="held-out windows of --seq-len tokens per document.")
    _long_eval_flags(ft)
    LOAD.add_loading(t)
    t.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"), default="no",
                   help="compute the forward and backward passes in bf16 (CPUs and recent GPUs) or fp16 (CUDA) "
                        "under autocast, keeping float32 weights and optimizer state.")
    t.add_argument("--seed", type=seed, default=0, help="random seed (data order, initialisation).")
    t.add_argument("--no-progress", action="store_true", help="hide the progress bars.")
    _checkpoint_flags(ft)


def _lora_flags(ft) -> None:
    """The LoRA group (and S²-Attn, LongLoRA's other half)."""
    lo = ft.add_argument_group("LoRA (peft; LongLoRA's trainable embeddings and norms, arXiv:2309.12307)")
    lo.add_argument("--lora-r", type=positive, default=None,
                    help="train LoRA adapters of this rank instead of every weight (needs peft: pip install .[lora]).")
    lo.add_argument("--lora-alpha", type=float, default=None, help="LoRA's scaling numerator (default: 2 x --lora-r).")
    lo.add_argument("--lora-targets", type=names, default=None,
                    help="comma-separated names of the linear layers to adapt (default: q_proj,k_proj,v_proj,o_proj).")
    lo.add_argument("--lora-dropout", type=float, default=0.0, help="dropout on the LoRA path.")
    lo.add_argument("--lora-frozen-embeddings-and-norms", action="store_true",
                    help="train only the adapters (LongLoRA also trains the input embedding and every norm layer).")
    lo.add_argument("--lora-merge", action="store_true",
                    help="save the adapters merged into the weights (default: the adapter beside the patched base).")
    lo.add_argument("--s2-attn-group", type=positive, default=None,
                    help="train with LongLoRA's shifted sparse attention in groups of this many tokens (even; "
                         "a divisor of the training length); evaluation and the saved model attend in full.")


def _pose_flags(ft) -> None:
    """The PoSE group."""
    p = ft.add_argument_group("PoSE (positional skip-wise training, arXiv:2309.10400)")
    p.add_argument("--pose-window", type=positive, default=None,
                   help="train on windows of this many tokens whose position ids skip to cover --target-length "
                        "(RoPE scalings and none only).")
    p.add_argument("--target-length", type=positive, default=None,
                   help="the context the PoSE windows' position ids cover (with --pose-window).")
    p.add_argument("--pose-chunks", type=positive, default=None,
                   help="chunks each PoSE window is cut into (default 2).")


def _long_eval_flags(ft) -> None:
    """The long-context evaluation group."""
    le = ft.add_argument_group("long-context evaluation (before and after training, on the held-out text)")
    le.add_argument("--eval-length", type=positive, default=None,
                    help="the length in tokens (above the model's original context L) at which the held-out text is "
                         "evaluated before and after training: perplexity past L, its truncated baseline and the "
                         "context gain, and needles in the prose (default: --target-length with PoSE, else none).")
    le.add_argument("--eval-needle-depths", type=floats, default=None,
                    help="comma-separated needle depths in [0, 1] for the long-context evaluation "
                         "(default 0.1,0.3,0.5,0.7,0.9).")
    le.add_argument("--eval-needle-trials", type=int, default=None,
                    help="needle keys per depth in the long-context evaluation (default 5; 0: perplexity only).")
    le.add_argument("--no-long-eval", action="store_true",
                    help="skip the long-context evaluation (perplexity past L and needles before and after).")


def _checkpoint_flags(ft) -> None:
    """The resumable-training group."""
    c = ft.add_argument_group("resumable training (a run stopped by a kill, a time limit or a crash goes on)")
    c.add_argument("--checkpoint-every", type=int, default=0,
                   help="save a resumable checkpoint (weights, optimizer and scheduler state, RNG states, the losses "
                        "so far) every this many optimizer steps (0: none); the last two are kept, in "
                        "--checkpoint-dir, which is removed once the trained model is saved.")
    c.add_argument("--checkpoint-dir", default=None,
                   help="the folder of the checkpoints (default: <output>.checkpoints, beside --output).")
    c.add_argument("--resume", action="store_true",
                   help="continue the run whose checkpoints are in --checkpoint-dir from its last one (the same "
                        "settings and data are required; its before-training measurements are reused); with no "
                        "checkpoint there, train from the start.")



def run(args, command: str) -> int:
    config = method_config(args)  # validated before the slow load
    training, checkpoints = _training(args), _checkpoints(args)
    pose, lora = _pose(args), _lora(args)
    long_eval = _long_eval(args, pose)
    train, held = _documents(args)
    report = finetune(model=args.model, config=config, train_docs=train, eval_docs=held, output=args.output,
                      training=training, pose=pose, lora=lora, long_eval=long_eval, checkpoints=checkpoints,
                      command=command, progress=not args.no_progress)
    print(report["table"])
    loaded = " -- a peft model: the patched base in base/, then the adapter" if lora is not None and not lora.merge \
        else ""
    print(f"\nsaved: {args.output} (load with hf_posenc.from_pretrained{loaded}); training report in "
          f"{args.output}/hf_posenc_eval/")
    return 0


def _documents(args):
    """The training and held-out documents of the data flags, each source checked (and the output folder against
    them) before any is read: files, folders, a dataset or the built-in corpus to train on; files, or the corpus's
    own held-out document, to measure on."""
    given = [flag for flag, value in (("--text-file", args.text_file), ("--text-dir", args.text_dir),
                                      ("--dataset", args.dataset)) if value]
    if args.corpus and given:
        raise ValueError(f"--corpus {args.corpus} is the training text; {', '.join(given)} too: give one or the other")
    if not (given or args.corpus):
        raise ValueError("finetune needs training text: --text-file, --text-dir, --dataset or --corpus python-docs")
    if not (args.eval_text_file or args.corpus):
        raise ValueError("finetune needs held-out text (never trained on): --eval-text-file FILE (repeatable)")
    reads = [*(args.text_file or []), args.text_dir, args.dataset, *(args.eval_text_file or [])]
    check_replaced_output(args.output, "finetune", reads=reads)  # before reading any of them
    corpus = builtin_corpus(args.corpus) if args.corpus else None
    train = [corpus[i] for i in CORPUS_TRAIN] if corpus else gather_documents(
        args.text_file, args.text_dir, args.dataset, args.dataset_config, args.split, args.column,
        encoding=args.encoding)
    held = [read_text_file(p, args.encoding) for p in args.eval_text_file or []]
    return train, held or [corpus[CORPUS_HELD_OUT]]  # (no files: --corpus was given, checked above)


def _training(args):
    return TrainSettings(seq_len=args.seq_len, steps=args.steps, learning_rate=args.learning_rate,
                         batch_size=args.batch_size, grad_accum=args.grad_accum, warmup_steps=args.warmup_steps,
                         weight_decay=args.weight_decay, gradient_checkpointing=not args.no_gradient_checkpointing,
                         eval_windows=args.eval_windows, seed=args.seed, chunked_loss=not args.full_logits_loss,
                         packing=args.packing, dtype=args.dtype, device=args.device,
                         mixed_precision=args.mixed_precision, s2_attn_group=args.s2_attn_group,
                         context_parallel_size=args.context_parallel_size)


def _checkpoints(args):
    if args.checkpoint_dir is not None and not (args.checkpoint_every or args.resume):
        raise ValueError("--checkpoint-dir is where --checkpoint-every saves and --resume reads: add one of them, or "
                         "drop it")
    return CheckpointSettings(every=args.checkpoint_every, folder=args.checkpoint_dir, resume=args.resume)


def _pose(args):
    if args.pose_window is None and args.target_length is None:
        if args.pose_chunks is not None:
            raise ValueError("--pose-chunks applies to PoSE training: add --pose-window and --target-length, or "
                             "drop it")
        return None
    if args.pose_window is None or args.target_length is None:
        raise ValueError("--pose-window and --target-length go together: PoSE trains on windows of --pose-window "
                         "tokens whose position ids cover --target-length")
    settings = PoseSettings(args.pose_window, args.target_length, args.pose_chunks or 2)
    check_pose_method(method_config(args))
    return settings


def _long_eval(args, pose):
    given = [flag for flag, value in (("--eval-length", args.eval_length), ("--eval-needle-depths",
                                                                             args.eval_needle_depths),
                                      ("--eval-needle-trials", args.eval_needle_trials)) if value is not None]
    if args.no_long_eval:
        if given:
            raise ValueError(f"{', '.join(given)} shape the long-context evaluation that --no-long-eval skips: drop "
                             "one or the other")
        return None
    if args.eval_length is None and pose is None and given:
        raise ValueError(f"{', '.join(given)} shape the long-context evaluation, which runs at --eval-length N (past "
                         "the model's original context) or PoSE's --target-length: add one, or drop them")
    trials = 5 if args.eval_needle_trials is None else args.eval_needle_trials
    return LongEvalSettings(args.eval_length, tuple(args.eval_needle_depths or DEPTHS), trials)


def _lora(args):
    lora_only = {"--lora-alpha": args.lora_alpha is not None, "--lora-targets": args.lora_targets is not None,
                 "--lora-dropout": args.lora_dropout != 0.0, "--lora-merge": args.lora_merge,
                 "--lora-frozen-embeddings-and-norms": args.lora_frozen_embeddings_and_norms}
    if args.lora_r is None:
        given = [flag for flag, on in lora_only.items() if on]
        if given:
            raise ValueError(f"{', '.join(given)} apply to LoRA training: add --lora-r RANK, or drop them")
        return None

    try:
        require_peft()  # said before the slow load
    except ImportError as err:
        raise ValueError(str(err)) from None
    extra = {"targets": tuple(args.lora_targets)} if args.lora_targets else {}
    return LoraSettings(r=args.lora_r, alpha=args.lora_alpha, dropout=args.lora_dropout,
                        train_embeddings_and_norms=not args.lora_frozen_embeddings_and_norms, merge=args.lora_merge,
                        **extra)
