"""Short continued training of a patched model on long documents, as the PI and YaRN papers do after
changing the positions (a few hundred steps there; a few dozen show the direction on a CPU).

Documents are tokenized and cut into blocks of ``seq_len`` tokens, each document its own (``packing``: or joined
with the EOS token, optionally with position ids starting again after each);
training runs through ``transformers.Trainer`` (which runs on accelerate), optionally with gradient
checkpointing. Held-out perplexity (documents not trained on) is measured before and after with the
same windows; past the model's original context, the long-context evaluation (:mod:`hf_posenc.training.long_eval`)
measures perplexity with its truncated baseline and needles in the held-out prose, before and after. The result is
saved with ``hf_posenc.save_pretrained``: ``hf_posenc.from_pretrained`` loads it with the patch applied to the
trained weights.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from ..adapters.s2_attention import S2Training, check_group, check_s2_implementation, check_s2_method
from ..checkpoints import runtime  # (its loader looked up when called: tests replace it)
from ..checkpoints.context import original_context
from ..checkpoints.loading import BASE_FOLDER
from ..checkpoints.models import resolve_source
from ..checkpoints.runtime import default_device
from ..config import PosEncConfig, as_config
from ..encodings.pose import check_pose, pose_batch
from ..eval.common import model_identity
from ..eval.perplexity import evaluate_perplexity
from ..eval.scoring import chunked_lm_loss
from ..io.documents import Document, check_heldout, documents_of, tokenize_documents
from ..io.output_folder import ReplacedOutput, check_replaced_output
from ..io.provenance import environment, recorded_command
from ..io.reports import markdown_table, plot_lines
from ..methods import resolve_method
from ..patching import patch
from ..publishing.hub import EVAL_FOLDER, save_pretrained
from ..serving.gguf_file import original_before_load
from .long_eval import LongEvalSettings, check_length, long_context_table, prepared_long_eval
from .lora import LoraSettings, apply_lora, check_targets_before_load, save_lora
from .parallel import check_context_parallel, check_engine, check_lora_engine, gathered_state_dict, parallelism_config
from .resume import ResumableRun, document_digests, quiet_about_tied_weights
from .settings import MIXED_PRECISIONS, PACKINGS, CheckpointSettings, TrainSettings

__all__ = ["finetune", "PoseSettings", "LoraSettings", "TrainSettings", "CheckpointSettings", "LongEvalSettings"]

POSE_KINDS = ("rope", "none")  # methods whose positions come from the position ids (the RoPE scalings, plain RoPE)


@dataclass(frozen=True)
class PoseSettings:
    """PoSE training (:mod:`hf_posenc.encodings.pose`): windows of ``window`` tokens whose position ids cover
    ``[0, target)`` in ``chunks`` chunks, drawn per training window from the run's seed."""

    window: int
    target: int
    chunks: int = 2

    def __post_init__(self) -> None:
        check_pose(self.window, self.target, self.chunks)


def check_pose_method(config: PosEncConfig) -> None:
    """PoSE moves the position ids; a method that computes positions from key indices (the attention-level
    methods) or has none to move (the swaps) would train at positions it never uses: refused by name."""
    kind = resolve_method(config.method).kind
    if kind not in POSE_KINDS:
        raise ValueError(f"--pose-window trains on position ids that skip, which {config.method!r} ({kind} method) "
                         "does not read: it computes positions from the keys' indices or has none. PoSE applies to the "
                         "RoPE scalings (pi, ntk, yarn, dynamic_ntk, dynamic_yarn, llama3, longrope) and to 'none'; "
                         f"train {config.method!r} at full length with --seq-len instead.")


def check_mixed_precision(mixed_precision: str, dtype: str, device: str | None) -> None:
    """``bf16``/``fp16``: the Trainer's autocast over float32 weights (and optimizer state); refused where the
    device cannot compute it, and over weights already loaded in a half precision (``--dtype``)."""
    if mixed_precision not in MIXED_PRECISIONS:
        raise ValueError(f"--mixed-precision must be one of {', '.join(MIXED_PRECISIONS)}, got {mixed_precision!r}")
    if mixed_precision == "no":
        return
    if dtype != "float32":
        raise ValueError(f"--mixed-precision {mixed_precision} computes in half precision over float32 weights; "
                         f"--dtype {dtype} already loads the weights in it: use one or the other")
    kind = default_device(device).split(":")[0]
    if mixed_precision == "fp16" and kind != "cuda":
        raise ValueError(f"--mixed-precision fp16 needs a CUDA device (its loss scaling), got device {kind!r}: use "
                         "bf16, which CPUs compute")
    if mixed_precision == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("--mixed-precision bf16: this GPU does not support bfloat16; use fp16")


def check_packing(packing: str) -> None:
    if packing not in PACKINGS:
        raise ValueError(f"--packing must be one of {', '.join(PACKINGS)}, got {packing!r}")


def pack(token_docs: list[torch.Tensor], seq_len: int, eos: int | None, packing: str = "stream") -> torch.Tensor:
    """``[n_blocks, seq_len]`` training blocks. ``document``: each document cut into whole blocks of its own (its
    remainder dropped; no block straddles two documents); ``stream`` and ``stream-restart``: the documents joined
    (EOS between them) and cut into whole blocks (see :func:`restarted_positions` for the second)."""
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    check_packing(packing)
    if packing == "document":
        blocks = [t[: len(t) // seq_len * seq_len].view(-1, seq_len) for t in token_docs if len(t) >= seq_len]
        if not blocks:
            longest = max((len(t) for t in token_docs), default=0)
            raise ValueError(f"too little training text: no document holds a block of seq_len={seq_len} tokens "
                             f"(the longest has {longest}); pass longer documents, a smaller --seq-len, or "
                             "--packing stream to join documents")
        return torch.cat(blocks)
    parts = []
    for t in token_docs:
        parts.append(t)
        if eos is not None:
            parts.append(torch.tensor([eos], dtype=t.dtype))
    stream = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    n = stream.numel() // seq_len
    if n == 0:
        raise ValueError(f"too little training text: {stream.numel()} tokens make no block of seq_len={seq_len}; "
                         "pass more text or a smaller --seq-len.")
    return stream[: n * seq_len].view(n, seq_len)


def restarted_positions(blocks: torch.Tensor, eos: int) -> torch.Tensor:
    """Position ids of stream-packed ``blocks`` that start again at 0 at each block's start and after each EOS, so
    that each document is at the positions it would have alone (attention still reaches the document before)."""
    after_eos = torch.zeros_like(blocks, dtype=torch.bool)
    after_eos[:, 1:] = blocks[:, :-1] == eos
    after_eos[:, 0] = True
    index = torch.arange(blocks.shape[1]).expand_as(blocks)
    starts = torch.where(after_eos, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - starts


def heldout_perplexity(model, token_docs: list[torch.Tensor], seq_len: int, windows: int) -> dict[str, Any]:
    was_training = model.training
    model.eval()
    try:
        res = evaluate_perplexity(model, token_docs, [seq_len], max_windows=windows, progress=False)[str(seq_len)]
    finally:
        model.train(was_training)
    return {"ppl": res["ppl"], "tokens": res["tokens"], "windows": res["windows"]}


def finetune(*, model: str, config: PosEncConfig, train_docs, eval_docs, output: str,
             training: TrainSettings = TrainSettings(), pose: PoseSettings | None = None,
             lora: LoraSettings | None = None, long_eval: LongEvalSettings | None = LongEvalSettings(),
             checkpoints: CheckpointSettings = CheckpointSettings(), command: str | None = None,
             progress: bool = True) -> dict[str, Any]:
    """Patch ``model``, fine-tune it, measure it before and after, and save it.

    Args:
        model: a name (Hub id, folder, alias) to load and patch.
        config: the method (:class:`PosEncConfig`, its text form ``"yarn:factor=2"`` or a dict).
        train_docs: the documents trained on (packed into blocks).
        eval_docs: held-out documents: perplexity before and after, and the long-context evaluation's text.
        output: the folder the trained checkpoint, its card and the report go to (replaced whole).
        training: :class:`TrainSettings` (steps, lengths, optimizer, S²-Attn, chunked loss, devices).
        pose: train on PoSE windows whose position ids skip to cover ``pose.target``, instead of blocks.
        lora: train LoRA adapters (:mod:`hf_posenc.training.lora`, peft) instead of every weight; saved beside
            the patched base (``hf_posenc.from_pretrained`` loads both), or merged with ``lora.merge``.
        long_eval: perplexity past L beside the truncated baseline and needles in the held-out prose, before and
            after training (:mod:`hf_posenc.training.long_eval`; default length: PoSE's target); None: none.
        checkpoints: resumable checkpoints every N steps, and resuming from them (:mod:`hf_posenc.training.resume`).
        command: the command line the report and card record.
        progress: show progress bars.

    Returns:
        The report (setup, losses, held-out perplexity before and after, the long-context numbers, the table).
        Under several processes every process computes the evaluations and the main process saves.
    """

    t, config = training, as_config(config)  # a PosEncConfig, its text form ("yarn:factor=2") or a dict
    train_docs, eval_docs = _documents("train_docs", train_docs), _documents("eval_docs", eval_docs)
    long_length = _checked_inputs(model, config, (train_docs, eval_docs), output, t, pose, lora, long_eval)
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # several: started by torchrun or accelerate launch
    run = ResumableRun(checkpoints, output, _fingerprint(model, config, train_docs, eval_docs, t, pose, lora,
                                                         long_eval, long_length), processes)
    main_process = int(os.environ.get("RANK", "0")) == 0
    # each sequence split across processes (hf_posenc.training.parallel), before compute
    if t.context_parallel_size != 1:
        check_context_parallel(config.method, t.context_parallel_size, pose.window if pose else t.seq_len, processes,
                               t.s2_attn_group, t.device)
        # the shards' targets: the Trainer's shift_labels, which the model's own loss reads
        t = replace(t, chunked_loss=False)
    longer = _checked_before_load(model, config, pose, eval_docs, long_eval, long_length, t.seed,
                                  progress and main_process)
    # one run per --output, from here to the save (held by the process that saves)
    with ReplacedOutput(output, "finetune") if main_process else nullcontext() as out:
        lm, tok, device = _patched(model, config, t, pose, longer, lora)
        data = _training_data(tok, model, train_docs, eval_docs, t, pose)
        measured = _measured_before(run, lm, data, longer, t)
        if t.s2_attn_group is not None:
            check_s2_implementation(getattr(lm.config, "_attn_implementation", None))
        engine: dict[str, str] = {}
        with S2Training(lm, t.s2_attn_group):
            losses, seconds = _train(lm, data.blocks, data.positions, t, run, progress=progress, engine=engine,
                                     main_process=main_process)
        lm.eval()
        setup = {"model": model, "method": config.to_dict(), **_setup(t), "chunked_loss": t.chunked_loss,
                 "train_blocks": int(data.blocks.shape[0]), "blocks_seen": blocks_seen(t, processes),
                 "train_documents": [d.name for d in train_docs], "eval_documents": [d.name for d in eval_docs],
                 "device": device, "processes": processes, "command": recorded_command(command),
                 "seconds": round(seconds, 1), "pose": asdict(pose) if pose else None,
                 "lora": _lora_setup(lora), "engine": engine.get("name"), "resumed_from_step": run.resumed_step,
                 "long_eval": dict(asdict(long_eval), length=long_length) if long_length else None}
        report = {"task": "finetune", "setup": setup, "losses": losses, "heldout_before": measured["heldout"],
                  "heldout_after": heldout_perplexity(lm, data.heldout, t.seq_len, t.eval_windows)}
        if longer is not None:
            report["long_context"] = {**longer.describe(), "before": measured["long_context"],
                                      "after": longer.measure(lm, "after training")}
        report["table"] = finetune_table(report)

        state = gathered_state_dict(lm)  # ZeRO-3 / FSDP: every process gives its shards to the one that saves
        if main_process:  # one process saves (under torchrun / accelerate every process trained the same weights)
            report["plot"] = _save(lm, tok, report, out, output, model, command, lora, state)
    if main_process and run.active:
        run.finish()  # the trained model is saved: its checkpoints go
    return report


def _documents(name: str, docs) -> list[Document]:
    """``docs`` as a list of Documents, anything else refused by name (a text is not a document: it has no name)."""
    if isinstance(docs, (str, Document)) or docs is None:
        raise ValueError(f"{name} must be a list of Documents (hf_posenc.io.documents.read_text_file(path), "
                         f"gather_documents(...), or Document(name, text)), got {type(docs).__name__}")
    return documents_of(docs)


def _check_settings(config: PosEncConfig, eval_docs, t: TrainSettings, pose: PoseSettings | None) -> None:
    """What the settings alone refuse, before anything is read or loaded."""
    if not eval_docs:
        raise ValueError("held-out evaluation needs at least one document that is not trained on")
    check_mixed_precision(t.mixed_precision, t.dtype, t.device)
    if pose is not None and t.packing == "stream-restart":
        raise ValueError("--packing stream-restart gives each document its own position ids, and PoSE draws them for "
                         "the whole window: use one or the other")
    if pose is not None:
        check_pose_method(config)
    if t.s2_attn_group is not None:
        check_s2_method(config.method, resolve_method(config.method).kind)
        check_group(t.s2_attn_group, pose.window if pose else t.seq_len)


def _checked_before_load(model: str, config: PosEncConfig, pose: PoseSettings | None, eval_docs,
                         long_eval: LongEvalSettings | None, long_length: int | None, seed: int, progress: bool):
    """PoSE's target and the long evaluation's length checked against the original context L where the model's
    config says it (else after the load), and the long evaluation's held-out text prepared from the tokenizer
    alone: its :class:`finetune_eval.LongEval`, None without one."""
    if pose is None and not long_length:
        return None
    declared = original_before_load(model, config)
    if pose is not None:
        _check_pose_target(declared, pose)
    return prepared_long_eval(model, declared, eval_docs, long_eval, long_length, seed, progress) if long_length \
        else None


def _patched(model: str, config: PosEncConfig, t: TrainSettings, pose: PoseSettings | None, longer,
             lora: LoraSettings | None):
    """The model loaded (after seeding), patched, its original context checked against PoSE's target and the
    long evaluation's length, wrapped in LoRA adapters when asked: ``(model, tokenizer, device)``."""
    runtime.seed_everything(t.seed)
    device = default_device(t.device)
    lm, tok, _ = runtime.load_model_and_tokenizer(model, t.dtype, device)
    patch(lm, config)
    if pose is not None or longer is not None:
        original = original_context(lm)
        if pose is not None:
            _check_pose_target(original, pose)
        if longer is not None:
            check_length(longer.length, original, lm)  # before training
            longer.bind(original)
    if lora is not None:
        lm = apply_lora(lm, lora)
        if t.gradient_checkpointing and not lora.train_embeddings_and_norms:  # the frozen embedding's output
            lm.enable_input_require_grads()  # must carry a gradient through the checkpointed layers
    return lm, tok, device


@dataclass(frozen=True)
class _TrainingData:
    blocks: torch.Tensor  # [n, window] token ids
    positions: torch.Tensor | None  # [n, window] position ids (PoSE's, or restarted per document); None: 0..window-1
    heldout: list[torch.Tensor]  # the held-out documents' tokens


def _training_data(tok, model: str, train_docs, eval_docs, t: TrainSettings, pose: PoseSettings | None):
    """The training blocks and their position ids, and the held-out tokens."""
    blocks = pack(tokenize_documents(tok, train_docs), pose.window if pose else t.seq_len, tok.eos_token_id,
                  t.packing)
    positions = pose_batch(blocks.shape[0], pose.window, pose.target, pose.chunks, t.seed) if pose else None
    if t.packing == "stream-restart":
        if tok.eos_token_id is None:
            raise ValueError(f"--packing stream-restart starts positions again after each EOS token, and the "
                             f"tokenizer of {model} has none: use --packing document")
        positions = restarted_positions(blocks, tok.eos_token_id)
    heldout = tokenize_documents(tok, eval_docs, t.seq_len * t.eval_windows)
    longest = max(len(x) for x in heldout)
    if longest < t.seq_len:
        raise ValueError(f"too little held-out text for seq_len={t.seq_len}: the longest held-out document has "
                         f"{longest} tokens")
    return _TrainingData(blocks, positions, heldout)


def _fingerprint(model: str, config: PosEncConfig, train_docs, eval_docs, training: TrainSettings, pose, lora,
                 long_eval, long_length) -> dict[str, Any]:
    """What a resumed run must share with the run whose checkpoints it continues."""
    versions = {k: v for k, v in environment().items() if k in ("hf_posenc", "torch", "transformers")}
    return {"model": model_identity(model, None, resolve_source(model)), "versions": versions,
            "method": config.to_dict(), "training": training.fingerprint(),
            "pose": asdict(pose) if pose else None,
            "lora": {k: v for k, v in asdict(lora).items() if k != "merge"} if lora else None,
            "long_eval": dict(asdict(long_eval), length=long_length) if long_length else None,
            "train_documents": document_digests(train_docs), "eval_documents": document_digests(eval_docs)}


def _setup(t: TrainSettings) -> dict[str, Any]:
    """The training settings as the report has always named them."""
    return {k: v for k, v in asdict(t).items() if k not in ("device", "chunked_loss")}


def blocks_seen(t: TrainSettings, processes: int) -> int:
    """The training blocks every process together went through: each optimizer step takes ``batch_size`` x
    ``grad_accum`` blocks on each data-parallel rank (the processes over the context-parallel size; the processes
    that split one sequence see the same block)."""
    return t.steps * t.batch_size * t.grad_accum * (processes // t.context_parallel_size)


def _lora_setup(lora) -> dict[str, Any] | None:
    if lora is None:
        return None
    got = asdict(lora)
    got["merged"] = got.pop("merge")
    return got


def _save(lm, tok, report: dict[str, Any], out, output: str, model: str, command: str | None, lora,
          state_dict: dict[str, Any] | None = None) -> str:
    """The checkpoint, its card (with the training table) and the report (JSON, Markdown) in hf_posenc_eval/,
    written into a staged folder that replaces --output only when all of it is written; returns the plot's path."""
    with out.staged() as staged:
        card = dict(eval_results=[report], base_model=model, command=command, trained=True)
        if lora is not None:  # (the adapter's folder gets the card and the reports, its base/ those of the base)
            base_path = os.path.join(os.path.abspath(output), BASE_FOLDER)  # where base/ is once staged is moved
            save_lora(lm, staged, lora.merge, tok, base_path=base_path, **card)
        else:
            save_pretrained(lm, staged, tok, **card, **({"state_dict": state_dict} if state_dict else {}))
        plotted = plot_losses(report, os.path.join(staged, EVAL_FOLDER, "finetune_loss.png"))
    return os.path.join(output, os.path.relpath(plotted, staged)) if plotted else ""


def _check_pose_target(original: int | None, pose: PoseSettings) -> None:
    if original is not None and pose.target <= original:
        raise ValueError(f"--target-length {pose.target} is within the model's original context ({original}): PoSE "
                         "covers a context longer than the trained one; give a target beyond it")


def _train(lm, blocks: torch.Tensor, positions: torch.Tensor | None, t: TrainSettings,
           run: ResumableRun | None = None, *, progress: bool = True, engine: dict[str, str] | None = None,
           main_process: bool = True) -> tuple[list[dict[str, float]], float]:
    """Trains ``lm`` in place on the packed ``blocks`` (transformers' Trainer, cosine schedule), from ``run``'s last
    checkpoint when it resumes one and saving one every ``run.every`` steps (None: no checkpoints); returns the
    logged losses by step (the resumed run's earlier ones included) and the seconds of training in all."""
    from datasets import Dataset
    from transformers import Trainer, TrainerCallback

    columns = {"input_ids": blocks.tolist()}
    if positions is not None:  # PoSE: each window's own position ids
        columns["position_ids"] = positions.tolist()
    data = Dataset.from_dict(columns).with_format("torch")
    run = run or ResumableRun(CheckpointSettings(), "", {})  # inactive: no checkpoints, never looks at a folder
    engine = {} if engine is None else engine
    resume_from = run.resume_from()
    earlier = run.seconds_until(run.resumed_step)
    started = time.time()

    class Record(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if main_process:  # every check has passed: the run file of a new run
                run.begin()

        def on_save(self, args, state, control, **kwargs):
            if main_process:  # (the Trainer has written the whole checkpoint)
                run.saved(state.global_step, earlier + time.time() - started)

    scratch = None if run.active else tempfile.TemporaryDirectory(prefix="hf_posenc-trainer-")  # never in --output
    args = _training_arguments(t, run.folder if run.active else scratch.name, run.every if run.active else None,
                               progress)

    def collate(rows):
        ids = torch.stack([r["input_ids"] for r in rows])
        batch = {"input_ids": ids, "labels": ids.clone()}
        # always the global position ids: under context parallelism each shard's RoPE reads its own tokens' ones
        batch["position_ids"] = (torch.stack([r["position_ids"] for r in rows]) if positions is not None
                                 else torch.arange(ids.shape[1]).repeat(ids.shape[0], 1))
        return batch

    lm.train()
    trainer_class = _chunked_loss_trainer() if t.chunked_loss else Trainer
    trainer = trainer_class(model=lm, args=args, train_dataset=data, data_collator=collate, callbacks=[Record()])
    engine["name"] = check_engine(trainer, lm)  # before training
    with scratch or nullcontext(), quiet_about_tied_weights(lm):
        trainer.train(resume_from_checkpoint=resume_from)
    seconds = earlier + time.time() - started
    if t.gradient_checkpointing:
        (getattr(lm, "activation_checkpointing_disable", None) or lm.gradient_checkpointing_disable)()
    losses = [{"step": h["step"], "loss": float(h["loss"])} for h in trainer.state.log_history if "loss" in h]
    return losses, seconds


def _training_arguments(t: TrainSettings, folder: str, save_every: int | None, progress: bool):
    """The Trainer's arguments of ``t``: a cosine schedule, a loss logged every step, a checkpoint in ``folder``
    every ``save_every`` steps (the last two kept; None: none)."""
    from transformers import TrainingArguments

    saving = {"save_strategy": "steps", "save_steps": save_every, "save_total_limit": 2} if save_every else \
        {"save_strategy": "no"}
    return TrainingArguments(
        output_dir=folder, max_steps=t.steps,
        per_device_train_batch_size=t.batch_size, gradient_accumulation_steps=t.grad_accum,
        learning_rate=t.learning_rate, warmup_steps=t.warmup_steps, weight_decay=t.weight_decay,
        lr_scheduler_type="cosine", logging_steps=1, **saving, report_to=[], seed=t.seed, data_seed=t.seed,
        use_cpu=default_device(t.device) == "cpu", disable_tqdm=not progress,
        remove_unused_columns=False, dataloader_drop_last=True,
        bf16=t.mixed_precision == "bf16", fp16=t.mixed_precision == "fp16",
        parallelism_config=parallelism_config(t.context_parallel_size, int(os.environ.get("WORLD_SIZE", "1"))),
        # transformers >= 5.x renamed gradient checkpointing to activation checkpointing
        **{_checkpointing_arg(TrainingArguments): t.gradient_checkpointing},
    )


def _chunked_loss_trainer():
    from transformers import Trainer

    class ChunkedLossTrainer(Trainer):
        """transformers' Trainer whose loss never holds ``[tokens, vocab]`` logits
        (:func:`hf_posenc.eval.scoring.chunked_lm_loss`), normalised as the Trainer normalises a model's own loss
        (by the tokens of the whole accumulated batch, scaled across processes)."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            total, count = chunked_lm_loss(model, inputs["input_ids"], inputs.get("position_ids"))
            normalised = self.model_accepts_loss_kwargs and num_items_in_batch is not None
            loss = total / (num_items_in_batch if normalised else count)
            if normalised and self.args.average_tokens_across_devices:
                loss = loss * (self.accelerator.num_processes // self.get_tp_size())
            if return_outputs:
                raise ValueError("the chunked loss computes no logits to return")
            return loss

    return ChunkedLossTrainer


def _checkpointing_arg(training_args_cls) -> str:
    names = {f.name for f in dataclasses.fields(training_args_cls)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def _checked_inputs(model: str, config: PosEncConfig, docs: tuple[list, list], output: str, t: TrainSettings,
                    pose: PoseSettings | None, lora: LoraSettings | None,
                    long_eval: LongEvalSettings | None) -> int | None:
    """Everything checkable before any compute: the settings, the held-out documents by content, the output folder,
    LoRA's engine and targets. Returns the long-context evaluation's length (None: none)."""
    train_docs, eval_docs = docs
    _check_settings(config, eval_docs, t, pose)
    long_length = long_eval.length_for(pose.target if pose else None) if long_eval is not None else None
    read = t.seq_len * t.eval_windows  # the held-out tokens scored (the needles' haystack: every document whole)
    read = None if long_length and long_eval.needle_trials else max(read, long_length or 0)
    check_heldout(train_docs, eval_docs, read)
    check_replaced_output(output, "finetune", resolve_source(model).path)
    if lora is not None:
        check_lora_engine(t.device)  # sharded weights, read from the launcher's environment
        check_targets_before_load(model, lora)
    return long_length


def _measured_before(run: ResumableRun, lm, data, longer, t: TrainSettings) -> dict[str, Any]:
    """The held-out (and long-context) numbers before training: a resumed run's, measured before its first step (its
    long-context ones measured again when an older release counted them otherwise), or measured now."""
    measured = run.before()
    if measured is not None and longer is not None and not longer.counted_exactly(measured.get("long_context")):
        measured = {**measured, "long_context": longer.measure(lm, "before training")}
    if measured is None:
        measured = {"heldout": heldout_perplexity(lm, data.heldout, t.seq_len, t.eval_windows)}
        if longer is not None:
            measured["long_context"] = longer.measure(lm, "before training")
        run.start(measured)  # for the run file, written when training begins
    return measured


def finetune_table(report: dict[str, Any]) -> str:
    s, losses = report["setup"], report["losses"]
    first = sum(x["loss"] for x in losses[:5]) / max(1, len(losses[:5]))
    last = sum(x["loss"] for x in losses[-5:]) / max(1, len(losses[-5:]))
    pose = s.get("pose")
    trained = f"{pose['window']} (PoSE to {pose['target']})" if pose else s["seq_len"]
    rows = [[s["method"]["method"], s["steps"], trained, round(first, 3), round(last, 3),
             round(report["heldout_before"]["ppl"], 2), round(report["heldout_after"]["ppl"], 2)]]
    table = markdown_table(["method", "steps", "seq_len", "train loss (first 5)", "train loss (last 5)",
                            f"held-out ppl before (at {s['seq_len']})", "held-out ppl after"], rows)
    if report.get("long_context"):
        table += "\n\n" + long_context_table(report["long_context"], s["method"]["method"])
    return table


def plot_losses(report: dict[str, Any], path: str) -> str:
    steps = [x["step"] for x in report["losses"]]
    values = [x["loss"] for x in report["losses"]]
    if not steps:
        return ""
    return plot_lines({report["setup"]["method"]["method"]: (steps, values)}, "Training loss", "step", "loss", path)
