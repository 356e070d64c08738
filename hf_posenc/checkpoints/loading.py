"""hf_posenc.from_pretrained: load a checkpoint and apply (or re-apply) a positional-encoding patch."""

from __future__ import annotations

import logging
import os
import pickle
import re
import warnings
import zipfile
from contextlib import contextmanager
from typing import Any

import torch

from ..adapters import ADAPTERS
from ..adapters.rope_compose import UNDER_KEY, composed_over_config, kept_scaling
from ..config import CONFIG_KEY, PosEncConfig, SavedBlock, as_config
from ..patching import adopt, keep_as_checkpoint, patch, reapply
from ..serving.gguf_file import stored_patch
from .models import drop_gguf_quantizer, read_config, resolve_source
from .weights import HUB_FILE_KWARGS, read_tensors

logger = logging.getLogger(__name__)

# keyword arguments of from_pretrained that also matter when reading the config alone
_CONFIG_KWARGS = (*HUB_FILE_KWARGS, "trust_remote_code", "gguf_file")
BASE_FOLDER = "base"  # where lora.save_lora(merged=False) puts the patched base model, inside its folder


@contextmanager
def quiet_peft():
    """peft asks transformers' deprecated ``is_gradient_checkpointing`` (a FutureWarning a user can do nothing about):
    that warning, and no other, is dropped while peft wraps or loads."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def require_peft():
    try:
        import peft
    except ImportError:
        raise ImportError("LoRA needs peft: pip install 'hf_posenc[lora]' (or pip install 'peft>=0.18')") from None
    return peft


def from_pretrained(path_or_id: str, posenc: Any = None, *, auto_class: Any = None, **hf_kwargs: Any):
    """Load a model and apply a positional-encoding change.

    Args:
        path_or_id: Hub id, local directory, ``.gguf`` file or alias (``smollm2-135m``, ``qwen2.5-coder-0.5b``,
            ``all-minilm-l6-v2``); a folder of a LoRA adapter saved by ``hf-posenc finetune --lora-r``
            (``lora.save_lora(merged=False)``) loads as a peft model (:func:`load_lora`; needs peft).
        posenc: a PosEncConfig, a dict (``{"method": "yarn", "factor": 4}``) or a method name; when None,
            the ``hf_posenc`` block stored in the checkpoint's ``config.json`` (by ``save_pretrained`` of a
            patched model) is applied again. A given ``posenc`` replaces a stored one, except a stored RoPE scaling
            of fixed frequencies saved natively (pi, ntk, yarn, llama3, longrope: :func:`rope_compose.kept_scaling`),
            which is what the checkpoint is (a fine-tuned YaRN x2 model): ``posenc`` goes on top of it, as on the
            same folder loaded by plain transformers (a RoPE scaling extends from its current context; give
            ``original_max_position_embeddings`` to replace it), and ``unpatch`` returns to it.
        auto_class: the transformers class to load with (default: the class named in the config's
            ``architectures``, else ``AutoModelForCausalLM``).
        **hf_kwargs: passed to ``auto_class.from_pretrained`` (dtype, device_map, revision, ...).

    Returns:
        The loaded model, patched (or a peft model for an adapter folder).
    """
    if is_lora_folder(str(path_or_id)):  # save_lora(merged=False): the patched base, then the adapter
        return load_lora(str(path_or_id), posenc, auto_class=auto_class, **hf_kwargs)
    requested = as_config(posenc) if posenc is not None else None
    source = resolve_source(path_or_id)
    kwargs = {**source.kwargs, **hf_kwargs}
    hf_config = kwargs.pop("config", None)
    if hf_config is None:
        hf_config = read_config(source, **{k: kwargs[k] for k in _CONFIG_KWARGS if k in kwargs})
    auto_class = auto_class or model_class_for(hf_config)
    block = getattr(hf_config, CONFIG_KEY, None)
    stored = adapter = under = None
    if block is not None:
        saved = SavedBlock.from_dict(block, str(path_or_id))
        stored = saved.config
        adapter = next(a for a in ADAPTERS if a.name == saved.family)  # SavedBlock.from_dict refused any other family
        hf_config = adapter.prepare_load_config(hf_config, block)
        under = composed_over_config(hf_config, block)  # (the model without the patch: what a later one starts from)
        delattr(hf_config, CONFIG_KEY)
        if requested is not None:
            logger.info("%s the stored patch %s", "on top of" if kept_scaling(block) else "replacing", stored.method)
    written = None  # a GGUF written by ``patch --gguf``: the original values back in the config, its patch applied
    if block is None and kwargs.get("gguf_file"):
        written = stored_patch(os.path.join(source.path, kwargs["gguf_file"]), hf_config)
    # a checkpoint whose weights hold the patch (a resized table) is adopted, not re-derived
    adopted = stored is not None and not adapter.restores(block)
    if adopted and requested is not None and requested != stored:
        raise ValueError(
            f"{path_or_id} holds weights changed by {stored.method!r} (its original position table is not saved), so "
            f"{requested.method!r} cannot be applied from the original; load the base model for that.")
    with _ReportOwnKeysQuietly(block is not None and requested is None):
        model = _load_weights(auto_class, source.path, hf_config, kwargs)
    drop_gguf_quantizer(model)
    if under is not None:  # the context under the saved composition, which the config no longer records
        model.__dict__[UNDER_KEY] = under
    if adapter is not None and not adapter.matches(model):
        raise ValueError(f"{path_or_id}: its config.json's hf_posenc block names the family {adapter.name!r}, which "
                         f"does not fit this model ({type(model).__name__}); the file was edited or corrupted.")
    if adopted:
        return adopt(model, stored, block, reapply=adapter.reapplies(block))
    own = kept_scaling(block)  # a static scaling saved natively: what the checkpoint is
    if own is not None:
        keep_as_checkpoint(reapply(model, own))  # a requested patch goes on top of it
    spec = requested or (stored if own is None else None) or written or shipped_dca(hf_config, path_or_id)
    if spec is not None and spec != own:
        (patch if spec is requested else reapply)(model, spec)
        extra = adapter.extra_weights(model) if adapter is not None and requested is None else []
        if extra:  # weights the patch added (a learned table): the saved, possibly trained, values
            saved = read_tensors(source.path, extra, **kwargs)
            state = model.state_dict()
            with torch.no_grad():
                for name, tensor in saved.items():
                    state[name].copy_(tensor.to(state[name].dtype))
    return model


OWN_WEIGHTS = "hf_posenc_"  # the prefix of the weights a patch adds (the learned table: ``hf_posenc_positions``)


class _ReportOwnKeysQuietly(logging.Filter):
    """While loading a checkpoint whose weights include those a patch added (loaded into the re-patched model
    below), transformers' load report would call them UNEXPECTED ("not ok if you expect identical arch"): that
    report is dropped when they are all it lists; any other key keeps it whole. Scoped to the call, on the
    logger's instance (no class is changed)."""

    _row = re.compile(r"^(\S+)\s+\|\s+([A-Z_]+)\s+\|", re.M)

    def __init__(self, active: bool):
        super().__init__()
        self.active = active
        self.logger = logging.getLogger("transformers.modeling_utils")

    def __enter__(self):
        if self.active:
            self.logger.addFilter(self)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "LOAD REPORT" not in message:
            return True
        rows = [(key, status) for key, status in self._row.findall(message) if key != "Key"]
        return not rows or not all(OWN_WEIGHTS in key and status == "UNEXPECTED" for key, status in rows)


def _load_weights(auto_class, path: str, hf_config, kwargs: dict):
    """``auto_class.from_pretrained``; a weight file that cannot be read (truncated, not a weight file) is an error
    naming it."""
    from safetensors import SafetensorError

    try:
        return auto_class.from_pretrained(path, config=hf_config, **kwargs)
    except (SafetensorError, pickle.UnpicklingError) as err:
        raise _corrupt_weights(path, err) from None
    except RuntimeError as err:
        if "ignore_mismatched_sizes" in str(err):  # transformers' report of the shapes is logged above
            raise ValueError(f"the weights of {path} do not have the shapes its config.json gives (transformers "
                             "listed them above); the config.json was edited or belongs to another model") from None
        if "PytorchStreamReader" not in str(err):  # torch's reader of a .bin that is not a whole zip archive
            raise
        raise _corrupt_weights(path, err) from None


def _unreadable(path: str) -> bool:
    from safetensors import safe_open

    if path.endswith(".bin"):
        return not zipfile.is_zipfile(path)
    try:
        with safe_open(path, framework="pt"):
            return False
    except Exception:  # noqa: BLE001 -- whatever the reader says, the file is not readable
        return True


def _corrupt_weights(path: str, err: Exception) -> ValueError:
    """The weight files (.safetensors, .bin) of the folder ``path`` that cannot be read, named in one error."""
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    files = [os.path.join(path, n) for n in names if n.endswith((".safetensors", ".bin"))]
    bad = ", ".join(f for f in files if _unreadable(f)) or f"a weight file of {path}"
    return ValueError(f"{bad} is truncated or corrupt ({' '.join(str(err).split())[:200]}); copy, save or "
                      "download it again")


def shipped_dca(hf_config: Any, name: str) -> PosEncConfig | None:
    """``dca`` with the values of a config's ``dual_chunk_attention_config`` (Qwen2.5-1M ships one; transformers
    ignores it), or None."""
    dca = getattr(hf_config, "dual_chunk_attention_config", None)
    if not dca:
        return None
    if not isinstance(dca, dict) or not {"chunk_size", "local_size"} <= set(dca):
        raise ValueError(f"{name}: config.json's dual_chunk_attention_config must hold chunk_size and local_size, "
                         f"got {dca!r}.")
    original = dca.get("original_max_position_embeddings")
    cfg = PosEncConfig("dca", None, original, {"chunk_size": dca["chunk_size"], "local_window": dca["local_size"]})
    logger.warning("%s ships dual_chunk_attention_config (chunk_size=%s, local_size=%s): applying hf_posenc's dca with "
                   "these values (pass posenc='none' to load it without).", name, dca["chunk_size"], dca["local_size"])
    return cfg


def model_class_for(hf_config: Any):
    """The class named first in ``hf_config.architectures`` when transformers has it (BertModel,
    T5ForConditionalGeneration, ...), else ``AutoModelForCausalLM``."""
    import transformers

    names = getattr(hf_config, "architectures", None) or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"the model's config.json has architectures={names!r}; expected a list of model class names "
                         "(e.g. [\"LlamaForCausalLM\"])")
    for name in names:
        cls = getattr(transformers, name, None)
        if cls is None:
            continue
        if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
            raise ValueError(f"the model's config.json names architectures={names!r}, but transformers' {name!r} is "
                             "not a model class; the file was edited or corrupted (e.g. [\"LlamaForCausalLM\"])")
        return cls
    return transformers.AutoModelForCausalLM


def is_lora_folder(path: str) -> bool:
    """Whether ``path`` is a local folder of a peft adapter (``adapter_config.json``) and no full model."""
    return (os.path.isdir(path) and os.path.isfile(os.path.join(path, "adapter_config.json"))
            and not os.path.isfile(os.path.join(path, "config.json")))


def merge_line(folder: str, merged: str = "merged") -> str:
    """The one Python statement that merges the LoRA adapter folder ``folder`` (``save_lora(merged=False)``) into one
    checkpoint at ``merged`` (``import hf_posenc.training.lora`` and ``from transformers import AutoTokenizer`` before
    it)."""
    base = os.path.join(folder, BASE_FOLDER)
    return (f"hf_posenc.training.lora.save_lora(hf_posenc.from_pretrained({folder!r}), {merged!r}, merged=True, "
            f"tokenizer=AutoTokenizer.from_pretrained({base!r}))")


def refuse_lora_folder(path: str, reader: str, name: str | None = None) -> None:
    """A LoRA adapter folder (:func:`is_lora_folder`) where ``reader`` (the command) reads a whole model: an error
    naming the folder (``name``, as the user gave it; default ``path``), the command and the line that merges it."""
    if not is_lora_folder(path):
        return
    shown = path if name is None else name
    raise ValueError(f"model folder {shown!r} holds a LoRA adapter (hf-posenc finetune --lora-r without --lora-merge), "
                     f"not the whole model required by {reader}: merge it once, e.g. {merge_line(shown)}, then pass "
                     "that folder")


def load_lora(folder: str, posenc: Any = None, *, is_trainable: bool = False, **hf_kwargs: Any):
    """Load what ``lora.save_lora(..., merged=False)`` saved (``hf_posenc.from_pretrained(folder)`` calls this for
    such a folder): the patched base (``hf_posenc.from_pretrained`` of ``folder/base``, with ``posenc`` -- None: the
    stored patch -- and ``hf_kwargs``: dtype, device_map, auto_class, ...), then the adapter with its trained
    embedding and norms (``peft.PeftModel.from_pretrained``). Returns the peft model (in eval mode unless
    ``is_trainable``); ``hf_posenc.get_config`` of it names the patch."""
    base_folder = os.path.join(folder, BASE_FOLDER)
    if not os.path.isfile(os.path.join(folder, "adapter_config.json")):
        raise ValueError(f"{folder} is not a LoRA folder saved by save_lora(merged=False): it has no "
                         "adapter_config.json")
    if not os.path.isdir(base_folder):
        raise ValueError(f"{folder} holds a peft adapter but no patched base model in {base_folder} (save_lora("
                         "merged=False) writes both): load the model it adapts with hf_posenc.from_pretrained, patched "
                         "as it was trained, then peft.PeftModel.from_pretrained(model, folder)")
    peft = require_peft()
    base = from_pretrained(base_folder, posenc, **hf_kwargs)
    with quiet_peft():
        return peft.PeftModel.from_pretrained(base, folder, is_trainable=is_trainable)
