"""vLLM: ``vllm serve FOLDER --max-model-len N`` (``vllm.LLM(model=FOLDER, max_model_len=N)``).

vLLM reads the RoPE of ``config.json`` (``rope_parameters``) as transformers does and derives its maximum model
length from it (the context it advertises); its rotary table (``cos_sin_cache``) holds that many positions, plain
RoPE included, so a longer ``--max-model-len`` (allowed only with ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``) reads past
the table: NaN or garbage, vLLM's own warning says so. The launch never goes past the advertised context. A GGUF is
not served here: vLLM takes a GGUF's configuration from transformers' GGUF reader, which reads no RoPE scaling.
"""

from __future__ import annotations

from ..registry import Engine, register_engine
from ..vllm_engine import RUNNER
from .base import CANNOT, INT32_MAX, NOT_MEASURED, SAME, WITHIN, Launch, Most, Served, length_for, not_native

ENGINE = "vLLM"
MOST = Most(INT32_MAX, "vLLM's model runner holds each sequence's length as int32: gpu_model_runner's seq_lens")
CHECKED = "launched with these settings by tests/test_serve_config.py (vLLM 0.32, CPU build)"


def launch(served: Served, length: int | None) -> Launch:
    if served.gguf:
        return Launch(ENGINE, CANNOT, "vLLM takes a GGUF's configuration from transformers' GGUF reader, which reads "
                                      "no RoPE scaling: it would serve this file as the unpatched model. Serve the "
                                      "folder 'hf-posenc patch --output' writes instead.")
    if not served.native and served.dual_chunk:
        return Launch(ENGINE, CANNOT, "vLLM 0.32 (installed here) reads dual_chunk_attention_config into its "
                                      "dual-chunk rotary embedding, but none of its attention backends implements "
                                      "dual-chunk attention: not computable; SGLang reads it (see SGLang).")
    if not served.native:
        return not_native(served, ENGINE, f"vLLM loads the folder as the unpatched model (config.json states the "
                                          f"original context, {served.original}) and refuses longer inputs")
    support = served.support.get(ENGINE)
    if support is not None and support.computes == "differs":
        return Launch(ENGINE, CANNOT, f"vLLM computes `{served.method}` otherwise: {support.basis}.")
    if support is not None and support.computes == "within_original":
        n = length_for(served, length if length is not None else served.original, ENGINE, served.original, most=MOST)
        return Launch(ENGINE, WITHIN, f"The same as hf_posenc up to the original context only: {support.caveat}. "
                                      "For longer inputs, freeze the method at the length you serve "
                                      "(hf-posenc patch --freeze-at N) and serve that folder.",
                      command=["vllm", "serve", served.path, "--max-model-len", str(n)],
                      python={"model": served.path, "max_model_len": n}, max_length=n, checked=CHECKED)
    # vLLM's rotary table ends at the advertised context, plain RoPE included
    n = length_for(served, length, ENGINE, served.context, most=MOST)
    computes = SAME if support is not None else NOT_MEASURED
    reason = (f"vLLM reads the method from config.json: {support.basis}." if support is not None else
              f"vLLM reads config.json's rope_parameters as transformers does; `{served.method}` on vLLM is not "
              "measured here (hf-posenc serve-check --engine vllm measures this folder).")
    return Launch(ENGINE, computes, reason, command=["vllm", "serve", served.path, "--max-model-len", str(n)],
                  python={"model": served.path, "max_model_len": n}, max_length=n, checked=CHECKED)


register_engine(Engine("vllm", ENGINE, launch=launch, runner=RUNNER))
