"""Reading single tensors out of a saved checkpoint (local folder or Hub repo, safetensors, sharded or not):
for weights a patch adds to a model (a learned position table), which the base architecture does not load."""

from __future__ import annotations

import json
import os
from typing import Any

import torch

# keyword arguments of from_pretrained that say where a checkpoint's files come from
HUB_FILE_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "subfolder", "force_download", "proxies")


def _file(path_or_id: str, name: str, hub_kwargs: dict[str, Any]) -> str | None:
    if os.path.isdir(path_or_id):
        full = os.path.join(path_or_id, hub_kwargs.get("subfolder") or "", name)
        return full if os.path.isfile(full) else None
    from transformers.utils import cached_file

    return cached_file(path_or_id, name, _raise_exceptions_for_missing_entries=False,
                       **{k: v for k, v in hub_kwargs.items() if k in HUB_FILE_KWARGS})


def read_tensors(path_or_id: str, names: list[str], **hub_kwargs: Any) -> dict[str, torch.Tensor]:
    """The tensors ``names`` from the checkpoint's ``model.safetensors`` (or its shards); a ValueError
    naming what is missing."""
    from safetensors import safe_open

    index = _file(path_or_id, "model.safetensors.index.json", hub_kwargs)
    if index is not None:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = {n: weight_map.get(n) for n in names}
    else:
        files = {n: "model.safetensors" for n in names}
    out: dict[str, torch.Tensor] = {}
    for shard in sorted({f for f in files.values() if f}):
        local = _file(path_or_id, shard, hub_kwargs)
        if local is None:
            continue
        with safe_open(local, framework="pt") as f:
            keys = set(f.keys())
            for n, where in files.items():
                if where == shard and n in keys:
                    out[n] = f.get_tensor(n)
    missing = [n for n in names if n not in out]
    if missing:
        raise ValueError(f"{path_or_id} lacks the weights {missing} that its hf_posenc patch added (was it saved "
                         "with save_pretrained after patching, as safetensors?)")
    return out
