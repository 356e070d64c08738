"""Which engine computes each variant of an evaluation run: transformers in this process, or vLLM serving the
variant's saved checkpoint (:mod:`hf_posenc.engines.vllm_engine`), and that engine while it runs."""

from __future__ import annotations

import os
from typing import Any

from ..engines.vllm_engine import EnginePool, rank_gpus, vllm_version
from ..serving.support import proportional_refusal, vllm_positions, vllm_refusal


class EngineChoice:
    """Which engine computes each variant of a run (see :class:`Run`), and the vLLM engine while one is running.
    A variant goes to vLLM when the run asks for it and vLLM computes its method as hf_posenc does
    (:func:`serving.vllm_refusal`); the truncated baseline of ``eval ppl`` (the unpatched model) too."""

    NAMES = ("transformers", "vllm", "auto")

    def __init__(self, name: str, variants: list, python: str | None, tensor_parallel_size: int,
                 engine_args: dict[str, Any] | None):
        if name not in self.NAMES:
            raise ValueError(f"--engine must be one of {list(self.NAMES)}, got {name!r}")
        self.name, self.python, self.tp, self.engine_args = name, python, tensor_parallel_size, engine_args or {}
        refused = {label: why for label, why in ((v.label, self.refusal(v)) for v in variants) if why}
        if name == "vllm" and refused:
            raise ValueError("--engine vllm: vLLM does not compute " + "; ".join(
                f"{label} ({reason})" for label, reason in refused.items())
                + ". Drop those variants, or use --engine auto to run them on transformers")
        self.served = name != "transformers" and len(refused) < len(variants)
        self.version = None
        if self.served:
            self.version = vllm_version(python)  # a missing vLLM is said before the slow load
        self.pool = None
        self.fallbacks: dict[str, str] = {}  # label -> why --engine auto ran it on transformers after all
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # with several processes: an engine each

    def refusal(self, variant) -> str | None:
        return None if self.name == "transformers" else vllm_refusal(variant.method)

    def on_vllm(self, variant) -> bool:
        return self.served and self.refusal(variant) is None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "vllm": self.version, "tensor_parallel_size": self.tp,
                "engine_args": self.engine_args}

    def model_for(self, variant, lm, longest: int, dtype: str, seed: int):
        if not self.on_vllm(variant):
            return lm

        why, shorter = self._unserved(variant, lm, longest)
        if why:
            if self.name == "vllm":
                raise ValueError(f"--engine vllm: {why}. Use --engine auto to run it on transformers"
                                 + (", or shorter --lengths" if shorter else ""))
            self.fallbacks[variant.label] = why
            return lm
        if self.pool is None:
            self.pool = EnginePool(python=self.python, dtype=dtype, seed=seed, max_model_len=longest,
                                   tensor_parallel_size=self.tp, engine_args=self.engine_args,
                                   gpus=rank_gpus(self.local_rank, self.tp))
        return self.pool.get(variant.label, variant.config.to_dict(), lm)

    @staticmethod
    def _unserved(variant, lm, longest: int) -> tuple[str | None, bool]:
        """Why vLLM cannot compute ``variant`` on ``lm`` for inputs of ``longest`` tokens, known from the model (None:
        it can), and whether shorter inputs would do."""
        params = getattr(getattr(variant, "config", None), "params", None) or {}
        proportional = proportional_refusal(lm.config, variant.method, params.get("layer_types"))
        if proportional:
            return proportional, False
        table = vllm_positions(lm.config)
        if table is not None and longest > table:
            return (f"vLLM's rotary table of {variant.label} holds the {table} positions its config advertises; "
                    f"inputs of {longest} tokens would read past it"), True
        return None, False

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
