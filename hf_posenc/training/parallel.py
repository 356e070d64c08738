"""``hf-posenc finetune`` on the engines users train with: what each engine needs of a fine-tune.

* Context parallelism (``--context-parallel-size N``): accelerate's ``ParallelismConfig(cp_size=N)`` through
  ``TrainingArguments(parallelism_config=...)``: each sequence is split across N processes (torch's ring attention
  over SDPA, on FSDP2). A shard's RoPE must see the *global* position ids (the fine-tune always sends them); methods
  that need more than a token's own global position are refused by name before any compute
  (:func:`check_context_parallel`).
* Sharded weights (DeepSpeed ZeRO-3, FSDP2): the process that saves needs the full weights, gathered from every
  process (:func:`gathered_state_dict`, a collective every process calls).
* Which engine ran (:func:`engine_name`): accelerate quietly trains a CPU run with a FSDP config as DDP; said so.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import version as _version
from typing import Any

from ..checkpoints.runtime import default_device
from ..methods import resolve_method
from ..methods.rope import SCALINGS

CONTEXT_PARALLEL_KINDS = ("rope", "none")  # positions from each token's own position id alone


def check_context_parallel(method: str, size: int, seq_len: int, processes: int,
                           s2_attn_group: int | None = None, device: str | None = None) -> None:
    """Refuses, before any compute, a context-parallel fine-tune that would not train what one process trains:
    ``size`` not dividing the processes or (twice, for torch's load-balanced split) the sequence length, a method
    whose positions are not a function of each token's global position id alone, shifted sparse attention."""
    if size == 1:
        return
    if size < 1:
        raise ValueError(f"--context-parallel-size must be >= 1, got {size}")
    spec = resolve_method(method)
    name = spec.name
    if spec.kind == "attention":
        raise ValueError(f"--context-parallel-size {size} splits each sequence across processes whose attention is "
                         f"replaced by ring attention over the shards, and {name!r} is an attention-level method (it "
                         "computes positions from the keys' indices inside its own attention): not under context "
                         "parallelism. Train it on one process per sequence (drop --context-parallel-size).")
    follows = SCALINGS[name].follows_length if name in SCALINGS else ""
    if follows:
        raise ValueError(f"--context-parallel-size {size} gives each process a shard of the sequence, and {name!r} "
                         f"would differ by shard: {follows}. Use a static scaling (pi, ntk, yarn, "
                         "llama3) under context parallelism, or drop --context-parallel-size.")
    if spec.kind not in CONTEXT_PARALLEL_KINDS and not spec.positions_by_id:
        raise ValueError(f"--context-parallel-size applies to decoders whose positions come from the position ids "
                         f"(the static RoPE scalings pi, ntk, yarn, llama3; none; nope), not to {name!r} "
                         f"({spec.kind} method).")
    if s2_attn_group is not None:
        raise ValueError("--s2-attn-group shifts groups of tokens inside attention, which context parallelism replaces "
                         "by ring attention over the shards: use one or the other")
    if default_device(device).startswith("cpu"):
        raise ValueError(f"--context-parallel-size {size} needs accelerators: accelerate {_version('accelerate')} "
                         "runs context parallelism on FSDP2 over GPUs only (on CPU processes, MULTI_CPU, it refuses "
                         "the ParallelismConfig)")
    if processes % size:
        raise ValueError(f"--context-parallel-size {size} must divide the number of processes ({processes}): launch "
                         f"a multiple of {size} processes (torchrun --nproc_per_node / accelerate --num_processes)")
    if seq_len % (2 * size):
        raise ValueError(f"--context-parallel-size {size} cuts each sequence into 2 x {size} load-balanced chunks: "
                         f"the training length ({seq_len}) must be a multiple of {2 * size}")


def parallelism_config(size: int, processes: int):
    """accelerate's ``ParallelismConfig`` for context parallelism of ``size`` (FSDP2 shards the weights over the
    rest of the processes), or None for ``size`` 1."""
    if size == 1:
        return None
    from accelerate.parallelism_config import ParallelismConfig

    return ParallelismConfig(cp_size=size, dp_shard_size=processes // size)


def check_engine(trainer, model) -> str:
    """The engine the Trainer actually runs (``single``, ``ddp``, ``fsdp2``, ``deepspeed-zero<N>``; FSDP1 refused), with
    ``+cp<N>`` for context parallelism), before training; says on stderr when a FSDP config given to accelerate was
    left unused, and refuses LoRA on sharded weights (its adapter is saved from whole weights only)."""
    state = trainer.accelerator.state
    kind = str(getattr(state, "distributed_type", "NO")).rsplit(".", 1)[-1]
    if trainer.is_deepspeed_enabled:
        plugin = state.deepspeed_plugin
        name = f"deepspeed-zero{getattr(plugin, 'zero_stage', '?')}"
    elif trainer.is_fsdp_enabled:
        name = f"fsdp{getattr(state.fsdp_plugin, 'fsdp_version', 1)}"
        if name == "fsdp1":
            raise ValueError("FSDP version 1 (an accelerate FSDP config without fsdp_version: 2): its state dict is "
                             "gathered by collectives the one saving process cannot run alone, so hf-posenc finetune "
                             "does not run on it; use FSDP2 (configs/accelerate/fsdp.yaml) or DeepSpeed ZeRO-3")
    else:
        name = "single" if trainer.accelerator.num_processes == 1 else "ddp"
        if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and trainer.accelerator.is_main_process:
            print(f"hf-posenc finetune: accelerate left the FSDP config unused ({kind}: accelerate applies FSDP on "
                  "accelerators only, not to CPU processes); training as data parallel (every process holds the "
                  "whole model)", file=sys.stderr)
    pc = getattr(trainer.accelerator, "parallelism_config", None)
    if pc is not None and pc.cp_enabled:
        name += f"+cp{pc.cp_size}"
    sharded = name.startswith(("fsdp", "deepspeed-zero3"))
    if sharded and hasattr(model, "peft_config"):
        raise ValueError(_lora_sharded(name))
    return name


def _lora_sharded(engine: str) -> str:
    return (f"LoRA (--lora-r) under {engine}: the adapter is saved from whole weights, which this engine shards "
            "across the processes; train LoRA under DDP or DeepSpeed ZeRO-2 (configs/accelerate/ddp.yaml, zero2.yaml)")


def launched_sharding(device: str | None) -> str | None:
    """The sharding engine ``accelerate launch`` asked for, read from the environment it gives its processes (before
    any model is loaded): ``deepspeed-zero3`` (its stage from ``ACCELERATE_DEEPSPEED_ZERO_STAGE`` or the DeepSpeed
    config file's ``zero_optimization.stage``), ``fsdp`` on accelerators (accelerate trains CPU processes as DDP
    whatever the config says), else None."""
    env = os.environ
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        path = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
        if stage is None and path and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                stage = json.load(f).get("zero_optimization", {}).get("stage")
        return "deepspeed-zero3" if str(stage) == "3" else None
    on_cpu = default_device(device).startswith("cpu")
    if env.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not on_cpu:
        return "fsdp"
    return None


def check_lora_engine(device: str | None) -> None:
    """LoRA on weights sharded across processes, refused before the model loads (the same refusal
    :func:`check_engine` makes once the Trainer is built, for engines set up otherwise)."""
    engine = launched_sharding(device)
    if engine is not None:
        raise ValueError(_lora_sharded(engine))


def gathered_state_dict(model) -> dict[str, Any] | None:
    """None when this process holds the whole weights (one process, DDP, ZeRO-1/2); else the full state dict,
    gathered from every process (a collective: every process must call it), on CPU in the process of rank 0 (and an
    empty dict in the others): DeepSpeed ZeRO-3 partitions each parameter (gathered module by module, so that no
    device ever holds more than one module's weights whole), FSDP2 makes them DTensor shards."""
    params = list(model.parameters())
    if any(hasattr(p, "ds_id") for p in params):  # DeepSpeed ZeRO-3: one module's parameters whole at a time
        import deepspeed

        full: dict[str, Any] = {}
        for prefix, module in model.named_modules():
            own = list(module.named_parameters(recurse=False))
            if not own:
                continue
            with deepspeed.zero.GatheredParameters([p for _, p in own], modifier_rank=None):
                if _rank() == 0:
                    full.update((f"{prefix}.{n}" if prefix else n, p.detach().to("cpu", copy=True)) for n, p in own)
        if _rank() != 0:
            return {}
        for prefix, module in model.named_modules():  # the persistent buffers, as state_dict has them
            full.update((f"{prefix}.{n}" if prefix else n, b.detach().to("cpu", copy=True))
                        for n, b in module.named_buffers(recurse=False)
                        if b is not None and n not in module._non_persistent_buffers_set)
        return full
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in params):  # FSDP2 (and context parallelism, which runs on it)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return full if _rank() == 0 else {}
    return None


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
