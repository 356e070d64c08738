"""``hf-posenc patch --method dca --dual-chunk-config``: a DCA checkpoint of a Qwen2-family model saved with the
``dual_chunk_attention_config`` block of Qwen's own 1M configs (Qwen2.5-7B-Instruct-1M: ``{"chunk_size": 262144,
"local_size": 8192, "original_max_position_embeddings": 262144}``), which SGLang reads (``get_rope`` builds its
``DualChunkRotaryEmbedding`` from it, Qwen2/Qwen3 models, attention backend ``dual_chunk_flash_attn``).

Their positions are hf_posenc's DCA (An et al. 2024, ChunkLlama): with c = chunk_size - local_size, keys at
j mod c; queries at i mod c in their chunk, c + min(i mod c, local_size) against the previous chunk, chunk_size
against the earlier ones (vLLM's ``dual_chunk_rope.py`` spells the same three query tables). Opt-in: the plain
fields keep the original context, so every engine that does not read the block still refuses longer inputs;
``hf-posenc serve-config`` prints the settings that take them (SGLang's override of the context length).
"""

from __future__ import annotations

import json
import os
from typing import Any

from .files import atomic_write_text

KEY = "dual_chunk_attention_config"
FAMILIES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")  # the model types whose SGLang/vLLM files read the block


def check_dual_chunk_config(method: str, model_type: str | None = None) -> None:
    """Refuse ``--dual-chunk-config`` for another method, or (once the model is known) another family."""
    if method != "dca":
        raise ValueError(f"--dual-chunk-config writes DCA's settings in Qwen's dual_chunk_attention_config; the method "
                         f"is {method!r}: use it with --method dca, or drop it")
    if model_type is not None and model_type not in FAMILIES:
        raise ValueError(f"--dual-chunk-config: engines read dual_chunk_attention_config for {', '.join(FAMILIES)} "
                         f"models only, and this model is {model_type!r}; drop the flag (the checkpoint still "
                         "loads with DCA in hf_posenc.from_pretrained)")


def block_of(params: dict[str, Any], original: int) -> dict[str, int]:
    """The ``dual_chunk_attention_config`` of DCA's resolved ``params`` over the original context ``original``."""
    return {"chunk_size": int(params["chunk_size"]), "local_size": int(params["local_window"]),
            "original_max_position_embeddings": int(original)}


def write_dual_chunk_config(folder: str) -> dict[str, int]:
    """Add the block to the DCA checkpoint saved in ``folder`` (its config.json replaced whole); returns it."""
    from .config import CONFIG_KEY

    path = os.path.join(folder, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    saved = config.get(CONFIG_KEY) or {}
    check_dual_chunk_config(saved.get("method", "none"), config.get("model_type"))
    block = block_of(saved["params"], saved["original_max_position_embeddings"])
    config[KEY] = block
    atomic_write_text(path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return block
