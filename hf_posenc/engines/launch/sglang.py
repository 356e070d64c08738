"""SGLang: ``python -m sglang.launch_server --model-path FOLDER --context-length N`` (not launched here).

Read from SGLang's source: ``get_context_length`` (``python/sglang/srt/utils/hf_transformers_utils.py``) derives
the context from ``max_position_embeddings`` times ``rope_scaling["factor"]``, except when the scaling holds
``original_max_position_embeddings`` (yarn) or is llama3; ``ModelConfig._derive_context_length`` refuses a longer
``--context-length`` unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``; ``get_rope``
(``python/sglang/srt/layers/rotary_embedding/factory.py``) computes default, linear, yarn, llama3 and longrope, and
its ``dynamic`` is one base fixed for ``max_position_embeddings x factor``, not hf_posenc's per-length dynamic NTK.
Its newer model files read transformers 5's ``rope_parameters``; an SGLang on transformers 4 reads ``rope_scaling``
only (``--json-model-override-args`` sets it).
"""

from __future__ import annotations

import json

from ...serving.dual_chunk_config import FAMILIES, writes_block
from ..registry import Engine, register_engine
from .base import CANNOT, INT32_MAX, NOT_MEASURED, Launch, Most, Served, length_for, not_native

ENGINE = "SGLang"
CHECKED = ("not launched here: read from SGLang's get_context_length (python/sglang/srt/utils/"
           "hf_transformers_utils.py), ModelConfig._derive_context_length and get_rope (python/sglang/srt/layers/"
           "rotary_embedding/factory.py)")
MOST = Most(INT32_MAX, "SGLang's req_to_token table holds each token's KV-cache slot as int32")
COMPUTED = ("default", "linear", "yarn", "llama3", "longrope")


def derived_context(served: Served) -> int:
    """The context SGLang derives from config.json (``get_context_length``: from its max_position_embeddings)."""
    rope, n = served.rope, served.stated_context
    if rope.get("rope_type", "default") == "llama3" or "original_max_position_embeddings" in rope:
        return n
    return int(n * float(rope.get("factor", 1.0) or 1.0))


def _legacy(rope: dict) -> str:
    """config.json's rope_parameters in transformers 4's spelling, for --json-model-override-args."""
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    out = {"rope_theta": rope.get("rope_theta")} if "rope_theta" in rope else {}
    if scaling.get("rope_type", "default") != "default":
        out["rope_scaling"] = scaling
    return json.dumps(out, separators=(",", ":"))


def _dual_chunk(served: Served, length: int | None) -> Launch:
    """A DCA checkpoint saved with Qwen's dual_chunk_attention_config (``patch --dual-chunk-config``)."""
    if served.model_type not in FAMILIES:
        return Launch(ENGINE, CANNOT, f"SGLang reads dual_chunk_attention_config for {', '.join(FAMILIES)} models, "
                                      f"not {served.model_type!r}.", checked=CHECKED)
    limit = int(served.dual_chunk.get("original_max_position_embeddings") or served.restored or served.context)
    n = length_for(served, length if length is not None else limit, ENGINE, limit, most=MOST)
    override = json.dumps({"max_position_embeddings": n}, separators=(",", ":"))
    command = ["python", "-m", "sglang.launch_server", "--model-path", served.path, "--context-length", str(n),
               "--json-model-override-args", override]
    return Launch(ENGINE, NOT_MEASURED, "SGLang builds its DualChunkRotaryEmbedding from config.json's "
                                        "dual_chunk_attention_config: the positions of hf_posenc's DCA; not measured "
                                        "here.", command=command, max_length=n, checked=CHECKED,
                  notes=["the override raises max_position_embeddings (config.json states L for the other engines): "
                         "SGLang's dual-chunk rotary tables hold that many key positions",
                         f"up to {limit:,} tokens (the block's original_max_position_embeddings) SGLang applies no "
                         "attention temperature, as hf_posenc's DCA; past it, it would scale the keys",
                         "SGLang chooses the dual_chunk_flash_attn attention backend for it (CUDA) and refuses "
                         "another one; the block carries no sparse_attention_config: dense DCA"])


def launch(served: Served, length: int | None) -> Launch:
    if served.gguf:
        return Launch(ENGINE, CANNOT, "SGLang is checked here on HF folders only: serve the folder 'hf-posenc patch "
                                      "--output' writes.", checked=CHECKED)
    if served.dual_chunk and writes_block(served.method):  # SGLang's dual-chunk attention computes the method
        return _dual_chunk(served, length)
    if not served.native:
        return not_native(served, ENGINE, f"SGLang loads the folder as the unpatched model (config.json states the "
                                          f"original context, {served.original}) and refuses a longer "
                                          "--context-length")
    rope_type = served.rope.get("rope_type", "default")
    if rope_type not in COMPUTED:
        why = ("its dynamic scaling is one base fixed for max_position_embeddings x factor, at every length, not "
               "hf_posenc's base that follows each input's length; freeze it (hf-posenc patch --freeze-at N)"
               if rope_type == "dynamic" else f"get_rope has no rope_type {rope_type!r}")
        return Launch(ENGINE, CANNOT, f"SGLang does not compute `{served.method}` as hf_posenc does: {why}.",
                      checked=CHECKED)
    n = length_for(served, length, ENGINE, None if rope_type == "default" else served.context, most=MOST)
    env = {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"} if n > derived_context(served) else {}
    command = ["python", "-m", "sglang.launch_server", "--model-path", served.path, "--context-length", str(n)]
    if served.rope_layer_types:  # (no one-RoPE override to offer for transformers 4)
        notes = [f"config.json holds one RoPE per layer type ({', '.join(served.rope_layer_types)}; rope_type "
                 f"{rope_type!r} is the changed layers'): that SGLang's {served.model_type} reads each type's is not "
                 "checked here (vLLM's Gemma 3 does)"]
    else:
        notes = [f"an SGLang on transformers 4 does not read config.json's rope_parameters: add "
                 f"--json-model-override-args '{_legacy(served.rope)}'"]
    if "mscale_all_dim" in served.rope and rope_type == "longrope":
        notes.append("this longrope carries mscale_all_dim (an MLA checkpoint's own softmax scale, which transformers "
                     "derives from it): that SGLang's model applies it to a longrope is not checked here (vLLM 0.32's "
                     "DeepSeek relabels any scaled rope_type as its own YaRN)")
    return Launch(ENGINE, NOT_MEASURED, f"SGLang reads rope_type {rope_type!r} from config.json as transformers does; "
                                        "not measured here.", command=command, env=env, max_length=n,
                  checked=CHECKED, notes=notes)


register_engine(Engine("sglang", ENGINE, launch=launch))
