"""Short continued training of a patched model on long documents, as the PI and YaRN papers do after
changing the positions (a few hundred steps there; a few dozen show the direction on a CPU).

Documents are tokenized and cut into blocks of ``seq_len`` tokens, each document its own (``packing``: or joined
with the EOS token, optionally with position ids starting again after each);
training runs through ``transformers.Trainer`` (which runs on accelerate), optionally with gradient
checkpointing. Held-out perplexity (documents not trained on) is measured before and after with the
same windows; past the model's original context, the long-context evaluation (:mod:`hf_posenc.finetune_eval`)
measures perplexity with its truncated baseline and needles in the held-out prose, before and after. The result is
saved with ``hf_posenc.save_pretrained``: ``hf_posenc.from_pretrained`` loads it with the patch applied to the
trained weights.
"""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from .provenance import recorded_command
from .config import PosEncConfig
from .adapters.s2_attention import S2Training, check_group, check_s2_implementation, check_s2_method
from .encodings.pose import check_pose, pose_batch

from .finetune_eval import LongEvalSettings

if TYPE_CHECKING:
    from .lora import LoraSettings

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
    from .methods import resolve_method

    kind = resolve_method(config.method).kind
    if kind not in POSE_KINDS:
        raise ValueError(f"--pose-window trains on position ids that skip, which {config.method!r} ({kind} method) "
                         "does not read: it computes positions from the keys' indices or has none. PoSE applies to the "
                         "RoPE scalings (pi, ntk, yarn, dynamic_ntk, dynamic_yarn, llama3, longrope) and to 'none'; "
                         f"train {config.method!r} at full length with --seq-len instead.")


PACKINGS = ("document", "stream", "stream-restart")
MIXED_PRECISIONS = ("no", "bf16", "fp16")


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
    kind = (device or ("cuda" if torch.cuda.is_available() else "cpu")).split(":")[0]
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
    from .eval.perplexity import evaluate_perplexity

    was_training = model.training
    model.eval()
    try:
        res = evaluate_perplexity(model, token_docs, [seq_len], max_windows=windows, progress=False)[str(seq_len)]
    finally:
        model.train(was_training)
    return {"ppl": res["ppl"], "tokens": res["tokens"], "windows": res["windows"]}


def finetune(*, model: str, config: PosEncConfig, train_docs, eval_docs, output: str, seq_len: int = 1024,
             steps: int = 40, learning_rate: float = 1e-4, batch_size: int = 1, grad_accum: int = 1,
             warmup_steps: int = 0, weight_decay: float = 0.0, gradient_checkpointing: bool = True,
             eval_windows: int = 4, seed: int = 0, dtype: str = "float32", device: str | None = None,
             command: str | None = None, progress: bool = True, pose: PoseSettings | None = None,
             lora: "LoraSettings | None" = None, merge_lora: bool = False,
             s2_attn_group: int | None = None, chunked_loss: bool = True,
             packing: str = "document", long_eval: LongEvalSettings | None = LongEvalSettings(),
             context_parallel_size: int = 1, mixed_precision: str = "no") -> dict[str, Any]:
    """Patch ``model`` with ``config``, train it ``steps`` optimizer steps on packed ``train_docs``, measure
    held-out perplexity on ``eval_docs`` before and after, save to ``output``; returns the report. ``pose``:
    train on PoSE windows (their position ids skip to cover ``pose.target``) instead of ``seq_len`` blocks.
    ``lora``: train LoRA adapters (:mod:`hf_posenc.lora`, peft) instead of every weight; saved as the adapter beside
    the patched base (``hf_posenc.lora.load_lora``), or merged into the weights with ``merge_lora``.
    ``s2_attn_group``: train with LongLoRA's shifted sparse attention in groups of that many tokens
    (:mod:`hf_posenc.adapters.s2_attention`); evaluation and the saved model attend in full. ``chunked_loss``:
    the training loss over chunks of the LM head (never ``[tokens, vocab]`` logits), as evaluation computes it.
    ``packing``: how documents become blocks (:func:`pack`; ``document``: no block straddles two documents).
    ``mixed_precision``: ``bf16`` or ``fp16`` autocast over float32 weights (:func:`check_mixed_precision`).
    ``long_eval``: the long-context evaluation before and after training (:mod:`hf_posenc.finetune_eval`: perplexity
    past the original context L with the truncated baseline, needles in the held-out prose) at ``long_eval.length``,
    by default PoSE's target length (none without PoSE); None: none. Under several processes every process computes
    it (the same forwards in the same order: see :mod:`hf_posenc.finetune_eval`) and the main process saves it."""
    from .replaced_folder import ReplacedOutput, check_replaced_output
    from .models import resolve_source
    from .runtime import load_model_and_tokenizer, seed_everything
    from .eval.data import check_heldout, tokenize_documents
    from .patching import patch

    if steps < 1 or batch_size < 1 or grad_accum < 1 or not learning_rate > 0:
        raise ValueError(f"steps, batch_size and grad_accum must be >= 1 and learning_rate > 0, got steps={steps}, "
                         f"batch_size={batch_size}, grad_accum={grad_accum}, learning_rate={learning_rate}")
    if not eval_docs:
        raise ValueError("held-out evaluation needs at least one document that is not trained on")
    check_packing(packing)
    check_mixed_precision(mixed_precision, dtype, device)
    if pose is not None and packing == "stream-restart":
        raise ValueError("--packing stream-restart gives each document its own position ids, and PoSE draws them for "
                         "the whole window: use one or the other")
    if pose is not None:
        check_pose_method(config)
    if s2_attn_group is not None:
        from .methods import resolve_method

        check_s2_method(config.method, resolve_method(config.method).kind)
        check_group(s2_attn_group, pose.window if pose else seq_len)
    long_length = long_eval.length_for(pose.target if pose else None) if long_eval is not None else None
    read = seq_len * eval_windows  # the held-out tokens scored (the needles' haystack: every document whole)
    read = None if long_length and long_eval.needle_trials else max(read, long_length or 0)
    check_heldout(train_docs, eval_docs, read)  # by content, before any compute
    check_replaced_output(output, "finetune", resolve_source(model).path)  # before any compute
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # several: started by torchrun or accelerate launch
    main_process = int(os.environ.get("RANK", "0")) == 0
    if context_parallel_size != 1:  # each sequence split across processes (hf_posenc.parallel), refused before compute
        from .parallel import check_context_parallel

        check_context_parallel(config.method, context_parallel_size, pose.window if pose else seq_len, processes,
                               s2_attn_group, device)
        chunked_loss = False  # the shards' targets: the Trainer's shift_labels, which the model's own loss reads
    longer = None
    if pose is not None or long_length:  # checked before the load where the model's config says L (else after it)
        from .gguf_file import original_before_load

        declared = original_before_load(model, config)
        if pose is not None:
            _check_pose_target(declared, pose)
        if long_length:  # and its held-out text, from the tokenizer alone
            from .finetune_eval import prepared_long_eval

            longer = prepared_long_eval(model, declared, eval_docs, long_eval, long_length, seed,
                                        progress and main_process)
    # one run per --output, from here to the save (held by the process that saves)
    with ReplacedOutput(output, "finetune") if main_process else nullcontext() as out:
        seed_everything(seed)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        lm, tok, _ = load_model_and_tokenizer(model, dtype, device)
        patch(lm, config)
        if pose is not None or long_length:
            from .context import original_context

            original = original_context(lm)
            if pose is not None:
                _check_pose_target(original, pose)
            if long_length:
                from .finetune_eval import check_length

                check_length(long_length, original, lm)  # before training
                longer.bind(original)
        if lora is not None:
            from .lora import apply_lora

            lm = apply_lora(lm, lora)
            if gradient_checkpointing and not lora.train_embeddings_and_norms:  # the frozen embedding's output
                lm.enable_input_require_grads()  # must carry a gradient through the checkpointed layers
        blocks = pack(tokenize_documents(tok, train_docs), pose.window if pose else seq_len, tok.eos_token_id,
                      packing)
        positions = pose_batch(blocks.shape[0], pose.window, pose.target, pose.chunks, seed) if pose else None
        if packing == "stream-restart":
            if tok.eos_token_id is None:
                raise ValueError(f"--packing stream-restart starts positions again after each EOS token, and the "
                                 f"tokenizer of {model} has none: use --packing document")
            positions = restarted_positions(blocks, tok.eos_token_id)
        need = steps * batch_size * grad_accum
        heldout = tokenize_documents(tok, eval_docs, seq_len * eval_windows)
        if max(len(t) for t in heldout) < seq_len:
            raise ValueError(f"too little held-out text for seq_len={seq_len}: the longest held-out document has "
                             f"{max(len(t) for t in heldout)} tokens")
        before = heldout_perplexity(lm, heldout, seq_len, eval_windows)
        long_context = None
        if longer is not None:
            long_context = {**longer.describe(), "before": longer.measure(lm, "before training")}

        if s2_attn_group is not None:
            check_s2_implementation(getattr(lm.config, "_attn_implementation", None))
        engine: dict[str, str] = {}
        with S2Training(lm, s2_attn_group):
            losses, seconds = _train(lm, blocks, positions, steps=steps, batch_size=batch_size, grad_accum=grad_accum,
                                     learning_rate=learning_rate, warmup_steps=warmup_steps, weight_decay=weight_decay,
                                     gradient_checkpointing=gradient_checkpointing, seed=seed, device=device,
                                     progress=progress, chunked_loss=chunked_loss,
                                     context_parallel_size=context_parallel_size, engine=engine,
                                     mixed_precision=mixed_precision)
        lm.eval()
        after = heldout_perplexity(lm, heldout, seq_len, eval_windows)
        if long_context is not None:
            long_context["after"] = longer.measure(lm, "after training")
        report = {
            "task": "finetune",
            "setup": {"model": model, "method": config.to_dict(), "seq_len": seq_len, "steps": steps,
                      "batch_size": batch_size, "grad_accum": grad_accum, "learning_rate": learning_rate,
                      "warmup_steps": warmup_steps, "weight_decay": weight_decay,
                      "gradient_checkpointing": gradient_checkpointing, "train_blocks": int(blocks.shape[0]),
                      "blocks_seen": need, "train_documents": [d.name for d in train_docs],
                      "eval_documents": [d.name for d in eval_docs], "eval_windows": eval_windows, "seed": seed,
                      "device": device, "processes": processes, "dtype": dtype, "mixed_precision": mixed_precision,
                      "command": recorded_command(command),
                      "seconds": round(seconds, 1), "pose": asdict(pose) if pose else None,
                      "lora": dict(asdict(lora), merged=merge_lora) if lora else None,
                      "s2_attn_group": s2_attn_group, "chunked_loss": chunked_loss, "packing": packing,
                      "engine": engine.get("name"), "context_parallel_size": context_parallel_size,
                      "long_eval": dict(asdict(long_eval), length=long_length) if long_length else None},
            "losses": losses,
            "heldout_before": before,
            "heldout_after": after,
        }
        if long_context is not None:
            report["long_context"] = long_context
        report["table"] = finetune_table(report)
        from .parallel import gathered_state_dict

        state = gathered_state_dict(lm)  # ZeRO-3 / FSDP: every process gives its shards to the one that saves
        if main_process:  # one process saves (under torchrun / accelerate every process trained the same weights)
            report["plot"] = _save(lm, tok, report, out, output, model, command, lora, merge_lora, state)
    return report


def _save(lm, tok, report: dict[str, Any], out, output: str, model: str, command: str | None, lora, merge_lora: bool,
          state_dict: dict[str, Any] | None = None) -> str:
    """The checkpoint, its card (with the training table) and the report (JSON, Markdown) in hf_posenc_eval/,
    written into a staged folder that replaces --output only when all of it is written; returns the plot's path."""
    from .hub import EVAL_FOLDER, save_pretrained

    with out.staged() as staged:
        card = dict(eval_results=[report], base_model=model, command=command, trained=True)
        if lora is not None:  # (the adapter's folder gets the card and the reports, its base/ those of the base)
            from .lora import save_lora

            save_lora(lm, staged, merge_lora, tok, **card)
        else:
            save_pretrained(lm, staged, tok, **card, **({"state_dict": state_dict} if state_dict else {}))
        plotted = plot_losses(report, os.path.join(staged, EVAL_FOLDER, "finetune_loss.png"))
    return os.path.join(output, os.path.relpath(plotted, staged)) if plotted else ""


def _check_pose_target(original: int | None, pose: PoseSettings) -> None:
    if original is not None and pose.target <= original:
        raise ValueError(f"--target-length {pose.target} is within the model's original context ({original}): PoSE "
                         "covers a context longer than the trained one; give a target beyond it")


def _train(lm, blocks: torch.Tensor, positions: torch.Tensor | None, *, steps: int, batch_size: int,
           grad_accum: int, learning_rate: float, warmup_steps: int, weight_decay: float,
           gradient_checkpointing: bool, seed: int, device: str, progress: bool,
           chunked_loss: bool = True, context_parallel_size: int = 1,
           engine: dict[str, str] | None = None, mixed_precision: str = "no") -> tuple[list[dict[str, float]], float]:
    """Trains ``lm`` in place on the packed ``blocks`` (transformers' Trainer, cosine schedule); returns the
    logged losses by step and the seconds it took."""
    from datasets import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from .parallel import check_engine, parallelism_config

    columns = {"input_ids": blocks.tolist()}
    if positions is not None:  # PoSE: each window's own position ids
        columns["position_ids"] = positions.tolist()
    data = Dataset.from_dict(columns).with_format("torch")
    losses: list[dict[str, float]] = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append({"step": state.global_step, "loss": float(logs["loss"])})

    scratch = tempfile.TemporaryDirectory(prefix="hf_posenc-trainer-")  # Trainer's folder: never in --output
    args = TrainingArguments(
        output_dir=scratch.name, max_steps=steps, per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=grad_accum, learning_rate=learning_rate, warmup_steps=warmup_steps,
        weight_decay=weight_decay, lr_scheduler_type="cosine", logging_steps=1, save_strategy="no",
        report_to=[], seed=seed, data_seed=seed, use_cpu=device == "cpu", disable_tqdm=not progress,
        remove_unused_columns=False, dataloader_drop_last=True,
        bf16=mixed_precision == "bf16", fp16=mixed_precision == "fp16",
        parallelism_config=parallelism_config(context_parallel_size, int(os.environ.get("WORLD_SIZE", "1"))),
        # transformers >= 5.x renamed gradient checkpointing to activation checkpointing
        **{_checkpointing_arg(TrainingArguments): gradient_checkpointing},
    )

    def collate(rows):
        ids = torch.stack([r["input_ids"] for r in rows])
        batch = {"input_ids": ids, "labels": ids.clone()}
        # always the global position ids: under context parallelism each shard's RoPE reads its own tokens' ones
        batch["position_ids"] = (torch.stack([r["position_ids"] for r in rows]) if positions is not None
                                 else torch.arange(ids.shape[1]).repeat(ids.shape[0], 1))
        return batch

    lm.train()
    started = time.time()
    trainer_class = _chunked_loss_trainer() if chunked_loss else Trainer
    trainer = trainer_class(model=lm, args=args, train_dataset=data, data_collator=collate, callbacks=[Record()])
    name = check_engine(trainer, lm)  # before training
    if engine is not None:
        engine["name"] = name
    with scratch:
        trainer.train()
    seconds = time.time() - started
    if gradient_checkpointing:
        (getattr(lm, "activation_checkpointing_disable", None) or lm.gradient_checkpointing_disable)()
    return losses, seconds


def _chunked_loss_trainer():
    from transformers import Trainer

    class ChunkedLossTrainer(Trainer):
        """transformers' Trainer whose loss never holds ``[tokens, vocab]`` logits
        (:func:`hf_posenc.eval.scoring.chunked_lm_loss`), normalised as the Trainer normalises a model's own loss
        (by the tokens of the whole accumulated batch, scaled across processes)."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            from .eval.scoring import chunked_lm_loss

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
    import dataclasses

    names = {f.name for f in dataclasses.fields(training_args_cls)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def finetune_table(report: dict[str, Any]) -> str:
    from .eval.report import markdown_table

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
        from .finetune_eval import long_context_table

        table += "\n\n" + long_context_table(report["long_context"], s["method"]["method"])
    return table


def plot_losses(report: dict[str, Any], path: str) -> str:
    from .eval.report import plot_lines

    steps = [x["step"] for x in report["losses"]]
    values = [x["loss"] for x in report["losses"]]
    if not steps:
        return ""
    return plot_lines({report["setup"]["method"]["method"]: (steps, values)}, "Training loss", "step", "loss", path)
