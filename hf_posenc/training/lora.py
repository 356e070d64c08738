"""LoRA fine-tuning of a patched model through ``peft`` (the ``lora`` extra: ``pip install 'hf_posenc[lora]'``).

    settings = LoraSettings(r=8)                   # alpha 2r, the attention projections, LongLoRA's extras
    lora = apply_lora(hf_posenc.patch(model, "yarn", factor=4), settings)
    ...train lora...
    save_lora(lora, "out", merged=True)            # one checkpoint: hf_posenc.from_pretrained("out")
    save_lora(lora, "out", merged=False)           # the adapter, the patched base in out/base: the same call

The patch stays on the model that peft wraps: its hooks sit on the rotary embedding, the decoder body and the
attention modules (none of which peft replaces), and its record stays on the wrapped model
(``lora.get_base_model()``), so ``hf_posenc.get_config`` of that model still names it.

LongLoRA (Chen et al. 2023, arXiv 2309.12307) trains the input embedding and the normalisation layers beside the
LoRA weights when extending the context; ``train_embeddings_and_norms`` does so through peft's
``modules_to_save``: the input embedding (``model.get_input_embeddings()``) and every normalisation layer with
weights (a module whose class name ends in ``RMSNorm``/``LayerNorm``, or a torch ``LayerNorm``/``RMSNorm``/
``GroupNorm``) are wrapped in a trainable copy that peft saves with the adapter and loads back with it. A tied
output head (``tie_word_embeddings``) stays tied to the trained embedding (peft's ``ensure_weight_tying``).

Saved layout of ``save_lora(..., merged=False)``::

    folder/adapter_config.json, adapter_model.safetensors, README.md   peft's adapter (LoRA weights and the
                                                                       trained embedding and norms)
    folder/base/                                                       the patched base model, untrained, as
                                                                       hf_posenc.save_pretrained saves it

:func:`load_lora` loads it back (``hf_posenc.from_pretrained(folder/base)``, then ``PeftModel.from_pretrained``);
``hf_posenc.from_pretrained(folder)`` does the same for such a folder. The adapter's ``base_model_name_or_path``
is the absolute path of ``folder/base`` (where it ends up, ``base_path``): peft's ``AutoPeftModelForCausalLM`` and
plain transformers put the adapter on the patched base there (with the change when the method is native), and fail
on a moved copy instead of fetching the unpatched model; the model it came from is the card's ``base_model``. The
card (README.md) says how the folder loads, and the engine launch lines it prints are those of the merged
checkpoint, after the merge it gives (:func:`hf_posenc.checkpoints.loading.merge_line`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..checkpoints.loading import (
    BASE_FOLDER,
    load_lora,  # noqa: F401 (this module's API too: hf_posenc.training.lora.load_lora)
    model_class_for,
    quiet_peft,
    require_peft,
)
from ..checkpoints.models import read_config, resolve_source
from ..io.files import atomic_write_text, follow_umask
from ..io.wording import first_names
from ..patching import OWN_WEIGHTS, held_modules
from ..publishing.hub import save_pretrained, write_model_card

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
NORM_SUFFIXES = ("RMSNorm", "LayerNorm")


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA adapter to train.

    r: the rank (>= 1). alpha: the scale numerator (LoRA's update is ``alpha / r * B A``); default ``2 * r``.
    targets: the names of the linear layers that get an adapter (a module matches when its name is the target
        or ends in ``.target``); default: the attention projections q_proj, k_proj, v_proj, o_proj.
    dropout: dropout on the adapter's input, in [0, 1).
    train_embeddings_and_norms: LongLoRA's extras -- the input embedding and every normalisation layer trained
        in full beside the adapter (peft's ``modules_to_save``).
    merge: how a fine-tuning run saves it: merged into the weights (one checkpoint) instead of the adapter beside
        the patched base (:func:`save_lora`).
    """

    r: int
    alpha: float | None = None
    targets: tuple[str, ...] = ATTENTION_PROJECTIONS
    dropout: float = 0.0
    train_embeddings_and_norms: bool = True
    merge: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"LoRA rank r must be an integer >= 1, got r={self.r!r}")
        alpha = 2 * self.r if self.alpha is None else self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
            raise ValueError(f"LoRA alpha must be a number > 0 (default 2 * r), got alpha={self.alpha!r}")
        object.__setattr__(self, "alpha", float(alpha))
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"LoRA dropout must be a number in [0, 1), got dropout={self.dropout!r}")
        targets = (self.targets,) if isinstance(self.targets, str) else self.targets
        try:
            targets = tuple(targets)
        except TypeError:
            raise ValueError(f"LoRA targets must be module names (e.g. {ATTENTION_PROJECTIONS}), got "
                             f"targets={self.targets!r}") from None
        if not targets or not all(isinstance(t, str) and t.strip(".") for t in targets):
            raise ValueError(f"LoRA targets must be a non-empty list of module names (e.g. {ATTENTION_PROJECTIONS}), "
                             f"got targets={self.targets!r}")
        object.__setattr__(self, "targets", targets)
        for name in ("train_embeddings_and_norms", "merge"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def linear_names(model: nn.Module) -> list[str]:
    """The distinct last names of the model's ``nn.Linear`` layers (what ``targets`` can name)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear) and name})


def trained_in_full(model: nn.Module) -> list[str]:
    """The module names that ``train_embeddings_and_norms`` trains in full: the input embedding and every
    normalisation layer with weights, found structurally."""
    embedding = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else None
    norm_types = tuple(t for t in (nn.LayerNorm, getattr(nn, "RMSNorm", None), nn.GroupNorm) if t is not None)
    names = []
    for name, m in model.named_modules():
        if not name:
            continue
        is_norm = isinstance(m, norm_types) or type(m).__name__.endswith(NORM_SUFFIXES)
        if (m is embedding or is_norm) and any(True for _ in m.parameters(recurse=False)):
            names.append(name)
    if embedding is not None and not any(m is embedding for n, m in model.named_modules() if n in names):
        raise ValueError(f"{type(model).__name__}'s input embedding is not one of its named modules; pass "
                         "train_embeddings_and_norms=False")
    return names


def check_targets(model: nn.Module, settings: LoraSettings) -> None:
    """Each target names a module of ``model``, else refused with the names of its linear layers."""
    named = [n for n, _ in model.named_modules() if n]
    missing = [t for t in settings.targets if not any(_matches(n, t) for n in named)]
    if missing:
        raise ValueError(f"LoRA targets {missing} match no module of {type(model).__name__}; its linear layers are "
                         f"named {linear_names(model)}")


def check_targets_before_load(model: str, settings: LoraSettings) -> None:
    """:func:`check_targets` on ``model`` (a path, Hub id or alias) built from its config alone on the meta device:
    no weight read, seconds instead of the load. Skipped when its config cannot be read or built here (the check
    after the load says it then); a patch adds no linear layer, so the unpatched model's names are the ones."""
    try:
        import torch

        hf_config = read_config(resolve_source(model))
        cls = model_class_for(hf_config)  # an auto class builds by from_config, a model class by itself
        with torch.device("meta"):
            skeleton = cls.from_config(hf_config) if hasattr(cls, "from_config") else cls(hf_config)
    except Exception:  # noqa: BLE001 -- only a pre-check: the load that follows reports what is wrong
        return
    check_targets(skeleton, settings)


def lora_config(model: nn.Module, settings: LoraSettings):
    """The ``peft.LoraConfig`` for ``settings`` on ``model``, after checking, before anything changes, that each
    target names a module and that peft replaces no module the hf_posenc patch holds."""
    peft = require_peft()
    if not isinstance(settings, LoraSettings):
        raise ValueError(f"settings must be a LoraSettings, got {type(settings).__name__}")
    if isinstance(model, peft.PeftModel):
        raise ValueError("the model is already a peft model; apply_lora takes the (patched) transformers model")
    check_targets(model, settings)
    named = dict(model.named_modules())
    replaced = {n for n in named if n and any(_matches(n, t) for t in settings.targets)}
    not_linear = sorted(n for n in replaced if not isinstance(named[n], nn.Linear))
    if not_linear:
        raise ValueError(f"LoRA targets {list(settings.targets)} name modules that are not linear layers "
                         f"({first_names(not_linear)}); the linear layers of {type(model).__name__} are named "
                         f"{linear_names(model)}")
    added = sorted(n for n, p in model.named_parameters() if OWN_WEIGHTS in n)
    if added:
        raise ValueError(f"the hf_posenc patch added weights ({first_names(added)}) that LoRA would leave frozen: "
                         "train this method in full (without --lora-r)")
    full = trained_in_full(model) if settings.train_embeddings_and_norms else []
    tied = bool(full) and bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    if tied and any(named[n] is head for n in replaced):
        raise ValueError("the LM head is tied to the input embedding, which LongLoRA's recipe trains in full: it "
                         "cannot also be a LoRA target. Drop it from the targets (--lora-targets), or train only the "
                         "adapters (--lora-frozen-embeddings-and-norms; train_embeddings_and_norms=False)")
    held = held_modules(model)
    for name in sorted(replaced | set(full)):
        if id(named[name]) in held:
            why = "LoRA target" if name in replaced else "embedding or norm that train_embeddings_and_norms trains"
            raise ValueError(f"{name} ({why}) is held by the hf_posenc patch ({held[id(named[name])]}); peft would "
                             "replace it and the patch would go on using the frozen original. "
                             + ("Pass --lora-frozen-embeddings-and-norms (train_embeddings_and_norms=False)."
                                if name in full and name not in replaced
                                else "Choose other targets."))
    causal = type(model).__name__.endswith("ForCausalLM")
    return peft.LoraConfig(
        r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout, target_modules=list(settings.targets),
        modules_to_save=full or None, ensure_weight_tying=tied, init_lora_weights=True, bias="none",
        task_type="CAUSAL_LM" if causal else None)


def apply_lora(model: nn.Module, settings: LoraSettings):
    """Wrap the (patched) ``model`` in a peft LoRA model per ``settings`` and return it; only the adapter (and, with
    ``train_embeddings_and_norms``, the embedding and norms) is trainable. LoRA's B starts at zero, so the wrapped
    model computes what ``model`` did. Refused before any change: a target that matches no module (the message
    lists the linear layers), a module peft would replace that the hf_posenc patch holds."""
    peft = require_peft()
    config = lora_config(model, settings)
    with quiet_peft():
        wrapped = peft.get_peft_model(model, config)
    if config.modules_to_save:  # peft matches by name suffix: exactly the modules asked, each wrapped
        got = {n.removeprefix("base_model.model.") for n, m in wrapped.named_modules()
               if isinstance(m, peft.utils.other.ModulesToSaveWrapper)}
        if not set(config.modules_to_save) <= got:
            raise RuntimeError(f"peft wrapped {sorted(got)} to train in full, not all of {config.modules_to_save}")
    return wrapped


def _base_state_dict(peft_model) -> dict[str, Any]:
    """The wrapped model's weights as the base model had them, under the base model's own names: the LoRA weights
    and the trained copies of ``modules_to_save`` left out, ``base_layer``/``original_module`` unwrapped."""
    out = {}
    for key, tensor in peft_model.get_base_model().state_dict().items():
        parts = key.split(".")
        if "modules_to_save" in parts or any(p.startswith("lora_") for p in parts):
            continue
        clean = ".".join(p for p in parts if p not in ("base_layer", "original_module"))
        if clean in out:
            raise RuntimeError(f"two weights of the peft model map to {clean!r} in the base model")
        out[clean] = tensor
    return out


def save_lora(peft_model, folder: str, merged: bool, tokenizer=None, *, base_path: str | None = None,
              **card_kwargs: Any) -> str:
    """Save a (trained) LoRA model from :func:`apply_lora` (or ``peft.get_peft_model``) of a patched model.

    merged=True: the adapter merged into the weights (``merge_and_unload``, in place: ``peft_model`` then computes
    with the merged weights and has no adapter left), saved by ``hf_posenc.save_pretrained`` with the patch block:
    ``hf_posenc.from_pretrained(folder)`` loads it, and plain transformers too when the method is native.
    merged=False: the adapter (peft's files) in ``folder``, the untrained patched base in ``folder/base``
    (``hf_posenc.save_pretrained``); :func:`load_lora` loads it. ``peft_model`` is left as it was. ``base_path``:
    where ``folder/base`` will be found, written as the adapter's ``base_model_name_or_path`` (a folder staged before
    it is moved into place gives its final path); default: ``folder/base``, made absolute.
    tokenizer, card_kwargs: for ``hf_posenc.save_pretrained`` (eval_results, base_model, command, trained, ...).
    Returns ``folder``."""
    peft = require_peft()

    if not isinstance(peft_model, peft.PeftModel):
        raise ValueError(f"save_lora needs a peft model (apply_lora's result), got {type(peft_model).__name__}; "
                         "save a plain model with hf_posenc.save_pretrained")
    if merged:
        model = peft_model.merge_and_unload()
        return save_pretrained(model, folder, tokenizer, **card_kwargs)
    if len(peft_model.peft_config) != 1:
        raise ValueError(f"save_lora(merged=False) saves one adapter; this model has {sorted(peft_model.peft_config)}")
    base = {k: v for k, v in card_kwargs.items() if k not in ("eval_results", "trained")}  # the untrained base
    save_pretrained(peft_model.get_base_model(), os.path.join(folder, BASE_FOLDER), tokenizer,
                    state_dict=_base_state_dict(peft_model), **base)
    peft_model.save_pretrained(folder, save_embedding_layers=False)  # the base is saved beside: no Hub look-up
    _point_at_base(folder, base_path or os.path.abspath(os.path.join(folder, BASE_FOLDER)))
    # the card of what was trained, in place of peft's blank template: how the folder loads, how to merge it
    write_model_card(peft_model.get_base_model(), folder, adapter=True, **card_kwargs)
    follow_umask(folder)  # peft writes its weights as private temporary files (0600)
    return folder


def _point_at_base(folder: str, base_path: str) -> None:
    """``adapter_config.json``'s ``base_model_name_or_path`` set to ``base_path`` (the patched base), not the model it
    came from, which peft and transformers would load unpatched."""
    path = os.path.join(folder, "adapter_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["base_model_name_or_path"] = base_path
    atomic_write_text(path, json.dumps(config, indent=2, sort_keys=True) + "\n")
