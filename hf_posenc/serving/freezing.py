"""``--freeze-at N``: a length-dependent RoPE scaling turned into the static one that equals it at N tokens, for
engines that cannot recompute frequencies per length (vLLM refuses a saved dynamic method past L; llama.cpp has
no dynamic NTK and no dynamic YaRN).

- ``dynamic_ntk`` at N > L is plain RoPE with base * alpha^(d/(d-2)), alpha = s N / L - (s - 1)
  (``encodings.rope.dynamic_ntk_alpha``): static ``ntk`` with factor alpha, saved as a new ``rope_theta``.
- ``dynamic_yarn`` at N is YaRN with scale max(1, N / L) (``finetuned``: never below its factor) and temperature
  (0.1 ln scale + 1) * attn_factor (``encodings.rope.dynamic_yarn_scale``): static ``yarn``, saved as native yarn.
- ``longrope`` at N picks its long list (N > L) or its short one (N <= L): ``longrope`` with both lists that one.

The trade-off: the frozen model gives every input the frequencies of N. An input of exactly N tokens gets what
the dynamic method gives it; a shorter one gets N's frequencies instead of its own (for dynamic NTK/YaRN below L,
the unscaled ones), a longer one keeps N's where the dynamic method would scale further.
"""

from __future__ import annotations

from typing import Any

from ..config import PosEncConfig, as_config
from ..methods.rope import SCALINGS
from ..patching import get_config, patch, trying


def check_freeze(cfg: PosEncConfig, at: Any, original: int | None = None) -> None:
    """Refuse, before any load, a ``--freeze-at`` that means nothing: a method that does not follow the length, a
    length that is not a whole number > 0, or (when the original context L is known: ``original`` or the config's)
    a length at or below L where the dynamic method is the unchanged model."""
    freezable = [name for name, scaling in SCALINGS.items() if scaling.freeze]  # the records that say how
    if cfg.method not in freezable:
        raise ValueError(f"--freeze-at applies to the methods whose frequencies follow the length "
                         f"({', '.join(freezable)}); {cfg.method!r} is static already: drop --freeze-at.")
    if isinstance(at, bool) or not isinstance(at, int) or at <= 0:
        raise ValueError(f"--freeze-at must be a whole number of tokens > 0, got {at!r}.")
    L = cfg.original_max_position_embeddings or original
    if L is None:
        return
    unchanged = SCALINGS[cfg.method].unchanged_within_original
    if unchanged is not None and unchanged(cfg.params) and at <= L:
        raise ValueError(f"--freeze-at {at}: {cfg.method} changes nothing up to the original context ({L} tokens), "
                         f"so frozen there it is the unpatched model; give a length past {L} (the longest input to "
                         "serve).")


def freeze_config(cfg: Any, at: int, original: int | None = None) -> PosEncConfig:
    """The static :class:`PosEncConfig` equal to the length-dependent ``cfg`` at ``at`` tokens (module doc).
    ``original``: the context the model was trained for, when ``cfg`` does not give it; longrope needs its lists
    resolved (``hf_posenc.get_config`` of a model patched with it, or given)."""
    cfg = as_config(cfg)
    check_freeze(cfg, at, original)
    L = cfg.original_max_position_embeddings or original
    if L is None:
        raise ValueError("freezing needs the context the model was trained for: give original_max_position_embeddings "
                         "(or freeze a model: hf_posenc.serving.freezing.freeze).")
    p = cfg.params
    keep = {"layer_types": p["layer_types"]} if p.get("layer_types") is not None else {}
    scaling = SCALINGS[cfg.method]
    factor, params = scaling.freeze(cfg.factor, L, p, at)
    return PosEncConfig(scaling.freezes_to, factor, L, {**keep, **params})


def freeze(model, method: Any, at: int, **kwargs: Any):
    """Patch ``model`` with the static configuration that equals ``method`` (a length-dependent scaling, given as
    :func:`hf_posenc.patch` takes it) at ``at`` tokens; returns the model. ``hf_posenc.get_config(model)`` then
    gives the frozen configuration, which ``save_pretrained`` writes natively where transformers has it."""
    cfg = as_config(method, **kwargs)
    check_freeze(cfg, at)
    with trying(model, [cfg]):  # resolved against the model: its original context, its default lists
        resolved = get_config(model)
    return patch(model, freeze_config(resolved, at))
