"""Loading a model to run it: the dtype and the device are checked by name before anything loads, then the
model (patched again if its checkpoint says so) and its tokenizer come from a Hub id, a folder, a ``.gguf``
file or an alias. Used by the evaluations, ``patch`` and ``finetune``."""

from __future__ import annotations

import difflib
import json
import os
import random
from typing import Any

import torch

from ..io.provenance import scrub
from ..io.wording import first_names
from . import loading
from .models import ALIASES, resolve_source

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def _count(kind: str) -> int:
    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "mps":
        return int(torch.backends.mps.is_available())
    if kind == "xpu":
        return torch.xpu.device_count() if hasattr(torch, "xpu") and torch.xpu.is_available() else 0
    return 1  # cpu and the rest: torch reports their own errors clearly


def default_device(device: str | None) -> str:
    """``device``, else cuda where this machine has one, else cpu (the default of every command's --device)."""
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def check_device(device: str) -> str:
    """``device`` if this machine has it; else a clear error naming it and what the machine has."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a torch device; e.g. cpu, cuda, cuda:1, mps") from None
    count = _count(parsed.type)
    if count == 0:
        raise ValueError(f"device {device!r}: this machine has no {parsed.type} device (use --device cpu)")
    if parsed.index is not None and parsed.index >= count:
        raise ValueError(f"device {device!r}: this machine has {count} {parsed.type} device(s), "
                         f"{parsed.type}:0 to {parsed.type}:{count - 1}")
    return device


def _reason(err: Exception) -> str:
    """A loader's error on one short line, without secrets."""
    return " ".join(scrub(str(err)).split())[:300]


def _unloadable(model: str, err: Exception) -> ValueError:
    """A load failure as one line: what ``model`` was taken for, and the closest alias when it looks like one."""
    reason = _reason(err)
    if os.path.isdir(model):
        return ValueError(f"cannot load the model folder {model!r}: {reason}")
    if os.path.isfile(model):
        return ValueError(f"model {model!r} is a file; --model takes the folder that holds config.json and the "
                          f"weights, a .gguf file, a Hub id or an alias ({', '.join(sorted(ALIASES))})")
    guess = difflib.get_close_matches(model.lower(), list(ALIASES), n=1, cutoff=0.6)
    hint = f" Did you mean the alias {guess[0]!r}?" if guess else f" Aliases: {', '.join(sorted(ALIASES))}."
    return ValueError(f"cannot load model {model!r}: it is not a local folder, a .gguf file or an alias, and the Hub "
                      f"did not give it ({reason}).{hint}")


def _holds(folder: str) -> str:
    """What ``folder`` holds, in words: ``it holds a, b, c`` (at most 8 names) or ``it is empty``."""
    names = sorted(os.listdir(folder))
    return f"it holds {first_names(names, 8)}" if names else "it is empty"


# how the files a tokenizer is read from are named (one is enough: tokenizer.json, tokenizer_config.json, vocab.json
# + merges.txt, spiece.model, spm.model, tekken.json, *.tiktoken, bpe.codes, ...); a weights-only folder holds none
TOKENIZER_PREFIXES = ("tokenizer", "vocab", "merges", "special_tokens_map", "spiece", "spm", "sentencepiece", "tekken",
                      "bpe")
TOKENIZER_SUFFIXES = (".model", ".tiktoken")


def _tokenizer_files(folder: str) -> list[str]:
    return [name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name))
            and (name.startswith(TOKENIZER_PREFIXES) or name.endswith(TOKENIZER_SUFFIXES))]


def check_model_folder(path: str, model: str) -> None:
    """A local model folder has a config.json that is a JSON object; else an error naming what is wrong."""
    if not os.path.isdir(path):
        return
    config = os.path.join(path, "config.json")
    loading.refuse_lora_folder(path, "hf-posenc eval, patch, tune and finetune", model)
    if not os.path.isfile(config):
        raise ValueError(f"model folder {model!r} has no config.json ({_holds(path)}); a model folder is one "
                         "written by save_pretrained, or a Hub id, .gguf file or alias")
    try:
        with open(config, encoding="utf-8") as f:
            data = json.load(f)
    except ValueError as err:  # JSON and UTF-8 errors alike
        raise ValueError(f"{config} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{config} is not a JSON object (it holds a {type(data).__name__})")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 -- transformers' and huggingface_hub's validation errors alike
        raise ValueError(f"{config} is not a configuration transformers can read: {_reason(err)}") from None


def load_tokenizer(model: str, tokenizer: str | None = None, required: bool = True):
    """The tokenizer of ``model`` (or of ``tokenizer``, a Hub id, folder or alias); None when the checkpoint has
    none and ``required`` is False."""
    from transformers import AutoTokenizer

    src = resolve_source(tokenizer or model)
    try:
        if os.path.isdir(src.path) and "gguf_file" not in src.kwargs and not _tokenizer_files(src.path):
            raise OSError("the folder holds no tokenizer file (tokenizer.json, tokenizer_config.json, a vocabulary "
                          "or a sentencepiece model)")  # (transformers 5 would build an empty one from model_type)
        return AutoTokenizer.from_pretrained(src.path, **src.kwargs)
    except (OSError, ValueError, TypeError) as err:
        if tokenizer is None:
            if not (os.path.isdir(src.path) or "gguf_file" in src.kwargs):  # most likely the model itself is unknown
                raise _unloadable(model, err) from None
            if not required:
                return None
        where = f"--tokenizer {tokenizer!r}" if tokenizer else f"the model folder {model!r}"
        holds = f"; {_holds(src.path)}" if os.path.isdir(src.path) else ""
        raise ValueError(f"no tokenizer could be loaded from {where} ({_reason(err)}{holds}); "
                         "pass one with --tokenizer (a Hub id, folder or alias)") from None


def load_model_and_tokenizer(model: str, dtype: str = "float32", device: str = "cpu",
                             attn_implementation: str | None = None, tokenizer: str | None = None,
                             need_tokenizer: bool = True, device_map: str | dict | None = None,
                             max_memory: dict | None = None):
    """Load a model and its tokenizer (Hub id, folder, .gguf file or alias); the tokenizer first, so that a
    missing one is found before the slow part. A checkpoint saved patched by hf_posenc comes back patched
    (``hf_posenc.from_pretrained``). Returns (model, tokenizer, source); the tokenizer is None only when
    ``need_tokenizer`` is False and the checkpoint has none. ``device_map`` (e.g. ``"auto"``, with
    ``max_memory`` such as ``{0: "20GiB", "cpu": "64GiB"}``) spreads a model too big for one device over
    several through accelerate's big-model inference; ``device`` is then not used."""

    kwargs: dict[str, Any] = {"dtype": torch_dtype(dtype)}
    if device_map is None:
        check_device(device)
    else:
        kwargs.update(device_map=device_map, **({"max_memory": max_memory} if max_memory else {}))
    if max_memory and device_map is None:
        raise ValueError("--max-memory sets how much of each device --device-map may use; add --device-map auto")
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    src = resolve_source(model)
    if not src.kwargs:  # a folder as given (a .gguf file's folder has no config.json)
        check_model_folder(src.path, model)
    tok = load_tokenizer(model, tokenizer, required=need_tokenizer)
    try:
        lm = loading.from_pretrained(model, **kwargs)
    except OSError as err:
        raise _unloadable(model, err) from None
    return (lm if device_map is not None else lm.to(device)).eval(), tok, src
