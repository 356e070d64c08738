"""What a saved checkpoint states, read without loading it: ``config.json`` and its hf_posenc record, or a GGUF's
metadata in the same terms; read by ``serve-check`` and ``serve-config`` alike."""

from __future__ import annotations

import json
import os
from typing import Any

from ..adapters.layout import current_context
from ..checkpoints import loading
from ..config import CONFIG_KEY, SavedBlock
from .gguf_file import is_gguf, served_facts


def read_block(folder: str, command: str = "hf-posenc serve-check") -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, its hf_posenc block) of a checkpoint folder; a plain checkpoint's block is ``{}``. A GGUF file
    (checked by llama.cpp alone): its metadata in those terms (:func:`gguf_block`). ``command``: the command that
    reads it, named in the errors (a file that is neither, a folder without config.json, a LoRA adapter folder)."""
    if is_gguf(folder):
        return gguf_block(folder)
    if os.path.isfile(folder):
        raise ValueError(f"{folder} is a file but not a GGUF one (it does not start with the 'GGUF' magic); {command} "
                         "reads a checkpoint folder or a .gguf file")
    loading.refuse_lora_folder(folder, command)
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"{folder} is not a saved checkpoint folder (no config.json); {command} reads the folder "
                         "'hf-posenc patch --output' wrote")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    plain = config.get("text_config", config)
    block = config.get(CONFIG_KEY) or {}
    if block:
        SavedBlock.from_dict(block, folder)  # a malformed block is refused by name
    return plain, block


def gguf_block(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A GGUF's context and the patch :func:`hf_posenc.serving.gguf_file.patch_gguf` recorded in it, as (config, block)
    (a method written into a GGUF is one llama.cpp computes: native), and its quantized weight types."""
    facts = served_facts(path)
    plain = {"max_position_embeddings": facts["context"], "quantized": facts["quantized"], "arch": facts["arch"],
             "llama_cpp": facts["metadata"]}
    block = ({"method": facts["method"], "native": True, "original_max_position_embeddings": facts["original"],
              **({"frozen_at": facts["frozen_at"]} if facts.get("frozen_at") else {})}
             if facts["method"] != "none" else {})
    return plain, block


def context_of(plain: dict[str, Any]) -> int | None:
    """The context the checkpoint whose (text) config is ``plain`` serves now (``layout.current_context``: a
    Qwen-style YaRN x4 left at its pretraining max_position_embeddings serves 4x that, as vLLM derives it too)."""
    rp = plain.get("rope_parameters")
    return current_context(plain.get("max_position_embeddings"), rp if isinstance(rp, dict) else {})


def original_of(plain: dict[str, Any], block: dict[str, Any]) -> int:
    """The context a checkpoint is extended from: the one its hf_posenc record states, else the one it serves."""
    L = block.get("original_max_position_embeddings") or context_of(plain)
    if not L:
        raise ValueError("the checkpoint states no context length (max_position_embeddings); pass --lengths")
    return int(L)
