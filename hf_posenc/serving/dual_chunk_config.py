"""``hf-posenc patch --method dca --dual-chunk-config``: a DCA checkpoint of a Qwen2-family model saved with the
``dual_chunk_attention_config`` block of Qwen's own 1M configs (Qwen2.5-7B-Instruct-1M: ``{"chunk_size": 262144,
"local_size": 8192, "original_max_position_embeddings": 262144}``), which SGLang reads (``get_rope`` builds its
``DualChunkRotaryEmbedding`` from it, Qwen2/Qwen3 models, attention backend ``dual_chunk_flash_attn``).

SGLang's dual-chunk attention also multiplies the keys by 0.1 ln(n / original_max_position_embeddings) + 1 for an
input of n tokens past that field (Qwen2.5-1M's temperature), which hf_posenc's DCA (ChunkLlama's) does not; and
its rotary tables hold ``max_position_embeddings`` key positions. So the block states the context the checkpoint
advertises as ``original_max_position_embeddings`` (no temperature up to it), and serve-config launches SGLang
with ``max_position_embeddings`` raised to that context by ``--json-model-override-args``.

Their positions are hf_posenc's DCA (An et al. 2024, ChunkLlama): with c = chunk_size - local_size, keys at
j mod c; queries at i mod c in their chunk, c + min(i mod c, local_size) against the previous chunk, chunk_size
against the earlier ones (vLLM's ``dual_chunk_rope.py`` spells the same three query tables). Opt-in: the plain
fields keep the original context, so every engine that does not read the block still refuses longer inputs;
``hf-posenc serve-config`` prints the settings that take them.
"""

from __future__ import annotations

from ..methods.remapped import REMAPPED
from ..patching import get_config

KEY = "dual_chunk_attention_config"
FAMILIES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")  # the model types whose SGLang/vLLM files read the block


def writes_block(method: str) -> bool:
    """Whether ``method``'s record says how a dual_chunk_attention_config computes it (DCA's)."""
    return method in REMAPPED and REMAPPED[method].dual_chunk is not None


def check_dual_chunk_config(method: str, model_type: str | None = None) -> None:
    """Refuse ``--dual-chunk-config`` for another method, or (once the model is known) another family."""
    if not writes_block(method):
        takes = ", ".join(name for name in REMAPPED if writes_block(name))
        raise ValueError(f"--dual-chunk-config writes a method's settings in Qwen's dual_chunk_attention_config, "
                         f"which only {takes} has; the method is {method!r}: use it with --method "
                         f"{takes.split(', ')[0]}, or drop it")
    if model_type is not None and model_type not in FAMILIES:
        raise ValueError(f"--dual-chunk-config: engines read dual_chunk_attention_config for {', '.join(FAMILIES)} "
                         f"models only, and this model is {model_type!r}; drop the flag (the checkpoint still "
                         "loads with DCA in hf_posenc.from_pretrained)")


def dual_chunk_block(model) -> dict[str, int]:
    """The block of a model patched with DCA (its resolved configuration); refused for another method or family."""
    cfg = get_config(model)
    check_dual_chunk_config(cfg.method if cfg else "none", getattr(model.config, "model_type", None))
    method = REMAPPED[cfg.method]
    return method.dual_chunk(cfg.params, method.context(cfg.params, cfg.original_max_position_embeddings))


class written_with_block:
    """``with written_with_block(model):`` the model's config carries the block while it is saved (config.json and
    the card both see it), and not after."""

    def __init__(self, model):
        self.config, self.block = model.config, dual_chunk_block(model)

    def __enter__(self):
        setattr(self.config, KEY, self.block)
        return self.block

    def __exit__(self, *exc):
        if hasattr(self.config, KEY):
            delattr(self.config, KEY)
