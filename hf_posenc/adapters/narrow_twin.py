"""A model of a config's family and layer pattern with tiny widths: built from the config alone to run what the
config does not say. Which layers rotate is one such fact: EXAONE 4 and Cohere 2 leave their full-attention layers
without RoPE when the config names a sliding window, by their modeling code, not by a config field.

The twin keeps every field of the config (layer types, sliding window, RoPE parameters, partial rotary, the
family's own switches) except the widths in :data:`WIDTHS`, so that building it costs a fraction of a second
whatever the checkpoint's size."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

# the widths a twin narrows (where the config has the field): small and consistent with one another
WIDTHS = {
    "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_experts": 4,
    "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "n_group": 1, "topk_group": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "ffn_hidden_size": 64, "expert_ffn_hidden_size": 32, "lru_width": 64,  # Falcon, LongCat, RecurrentGemma
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,  # linear-attention layers
    "linear_num_value_heads": 2,                                                          # (Qwen3-Next, OLMo Hybrid)
    "rotary_dim": 8,  # GPT-J, CodeGen: the rotated part of a 16-wide head
    "vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 16,  # Gemma 3n / 4: per-layer embeddings
}


MAX_PARAMETERS = 20_000_000  # a twin with more (widths it cannot narrow) is not built: ~80 MB in fp32


def narrow_twin(config: Any) -> nn.Module | None:
    """A causal LM built from ``config`` with the widths of :data:`WIDTHS` (random weights, eval mode, on the CPU;
    the caller's random state kept), or None where transformers cannot build one of its family so, or only with
    more than :data:`MAX_PARAMETERS` parameters (counted on the meta device first)."""
    return twin_or_reason(config)[0]


def twin_or_reason(config: Any) -> tuple[nn.Module | None, str]:
    """:func:`narrow_twin`'s twin and "", or None and why there is none."""
    from transformers import AutoModelForCausalLM

    twin = narrowed_config(config)
    try:
        twin._attn_implementation = "eager"
        with torch.random.fork_rng(devices=[]):
            with torch.device("meta"):  # its size first: widths this does not narrow (sub-models, BLT's hash tables)
                size = sum(p.numel() for p in AutoModelForCausalLM.from_config(twin).parameters())
            if size > MAX_PARAMETERS:
                return None, f"{size:,} parameters narrowed, over {MAX_PARAMETERS:,}"
            return AutoModelForCausalLM.from_config(twin, dtype=torch.float32).eval(), ""
    except Exception as err:  # noqa: BLE001 (any family's own check: the twin is a best effort, its absence is an answer)
        return None, f"transformers does not build it narrowed ({type(err).__name__}: {str(err)[:160]})"


def spread_constant_weights(model: nn.Module) -> None:
    """Gives every weight the initialisation left constant (norms' ones, Dory's ``sqk``) a spread of 25% per
    channel (seeded), as training leaves them: a per-channel weight after RoPE then shows, a constant one
    commutes with the rotation."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.numel() > 1 and p.any() and bool((p == p.flatten()[0]).all()):
                p.mul_(1 + 0.25 * torch.randn(p.shape, generator=g).to(p.dtype))


def narrowed_config(config: Any) -> Any:
    """A copy of ``config`` with the widths of :data:`WIDTHS`, kept consistent and valid; a composite model's
    sub-configs (a VLM's text and vision configs) narrowed alike."""
    twin = copy.deepcopy(config)
    for name in getattr(twin, "sub_configs", None) or {}:
        sub = _read(twin, name)
        if sub is not None and hasattr(sub, "to_dict"):
            setattr(twin, name, narrowed_config(sub))
    wide = {key: _read(twin, key) for key in WIDTHS}
    for key, value in WIDTHS.items():
        _narrow(twin, key, value)
    for key, same_as in (("head_dim", "qk_rope_head_dim"),  # MLA: head_dim names the rotated part (DeepSeek-V3)
                         ("num_key_value_heads", "num_attention_heads")):  # full multi-head attention stays so
        if wide[key] is not None and wide[key] == wide[same_as]:
            _narrow(twin, key, _read(twin, same_as))
    _fill_unset(twin)
    _keep_valid(twin, wide)
    return twin


def _fill_unset(config: Any) -> None:
    """The fields a family's modeling code reads although its default config leaves them None (Ministral's and
    Hunyuan's ``head_dim``, Nemotron's ``num_key_value_heads``, DeepSeek-V2's ``num_experts_per_tok``): the head
    width of :data:`WIDTHS` (hidden size over heads there), as many kv heads as heads (multi-head attention, which
    None means in those families), the experts per token of :data:`WIDTHS` where there are routed experts."""
    if _unset(config, "head_dim") and _read(config, "hidden_size") == 64:
        _set(config, "head_dim", WIDTHS["head_dim"])
    if _unset(config, "num_key_value_heads"):
        _set(config, "num_key_value_heads", _read(config, "num_attention_heads"))
    if _unset(config, "num_experts_per_tok") and _read(config, "n_routed_experts"):  # (DeepSeek-V2's default)
        _set(config, "num_experts_per_tok", WIDTHS["num_experts_per_tok"])


def _unset(config: Any, key: str) -> bool:
    """Whether ``config`` has the field ``key`` and it is None (False where reading it raises: per layer)."""
    try:
        return key in dir(config) and getattr(config, key) is None
    except Exception:  # noqa: BLE001 (transformers' heterogeneous configs raise their own kind)
        return False


def _set(config: Any, key: str, value: Any) -> None:
    try:
        setattr(config, key, value)
    except Exception:  # noqa: BLE001 (a read-only or per-layer field stays as it is)
        pass


def _narrow(config: Any, key: str, value: int) -> None:
    """``config.key = value`` where the config has the field and takes the value (a list of one value per layer, as
    Gemma 3n's ``intermediate_size``: that many of it); left as it is where the field is derived (a read-only
    property: Falcon's ``head_dim``) or per layer (Gemma 4's: reading it raises)."""
    try:
        current = getattr(config, key, None)
        if current is not None:
            per_layer = isinstance(current, (list, tuple)) and not isinstance(value, (list, tuple))
            setattr(config, key, [value] * len(current) if per_layer else value)
    except Exception:  # noqa: BLE001 (config classes raise their own kinds here)
        pass


def _keep_valid(config: Any, wide: dict[str, Any]) -> None:
    """Where the narrowed config fails its class's own validation (ZAYA takes one expert per token only), each
    narrowed width is given back its value in turn, and kept so where that makes the config valid again: the twin
    is then a config transformers also loads from a saved folder."""
    if _valid(config):
        return
    for key, value in wide.items():
        narrowed = _read(config, key)
        if value is None or narrowed == value:
            continue
        _narrow(config, key, value)
        if _valid(config):
            return
        _narrow(config, key, narrowed)


def _read(config: Any, key: str) -> Any:
    """``config.key``, or None where it is absent or per layer (Gemma 4's head widths: reading it raises)."""
    try:
        return getattr(config, key, None)
    except Exception:  # noqa: BLE001 (transformers' heterogeneous configs raise their own kind)
        return None


def _valid(config: Any) -> bool:
    validate = getattr(config, "validate", None)
    try:
        if callable(validate):
            validate()
        return True
    except Exception:  # noqa: BLE001 (each config class raises its own kind)
        return False
