"""vLLM: ``vllm serve FOLDER --max-model-len N`` (``vllm.LLM(model=FOLDER, max_model_len=N)``).

vLLM reads the RoPE of ``config.json`` (``rope_parameters``) as transformers does and derives its maximum model
length from it (the context it advertises) -- except longrope, whose short or long factors it picks once, by
``--max-model-len``, with the temperature of ``short_mscale`` / ``long_mscale`` (else its own derivation). Its
rotary table (``cos_sin_cache``) holds that many positions, plain RoPE included, so a longer ``--max-model-len``
(allowed only with ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``) reads past the table: NaN or garbage, vLLM's own warning
says so. The launch never goes past the advertised context. A GGUF is not served here: vLLM takes a GGUF's
configuration from transformers' GGUF reader, which reads no RoPE scaling.
"""

from __future__ import annotations

import math

from ...encodings.rope import longrope_attention_factor
from ..registry import Engine, register_engine
from ..vllm_engine import RUNNER
from .base import CANNOT, INT32_MAX, NOT_MEASURED, PAST, SAME, WITHIN, Launch, Most, Served, length_for, not_native

ENGINE = "vLLM"
MOST = Most(INT32_MAX, "vLLM's model runner holds each sequence's length as int32: gpu_model_runner's seq_lens")
CHECKED = "launched with these settings by tests/test_serve_config.py (vLLM 0.32, CPU build)"
# model types vLLM 0.32 builds with deepseek_v2.py, which turns any scaled rope_type into its own YaRN variants
DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2")
# measured by tests/test_vllm.py::test_serve_check_of_a_longrope_with_its_own_temperature (vLLM 0.32, CPU build)
CHECKED_LONGROPE = ("measured by hf-posenc serve-check on a tiny longrope with its own attention_factor: the same at "
                    "L / 2 with --max-model-len L and past L with --max-model-len 2 L, vLLM 0.32 (CPU)")


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
    if served.rope.get("rope_type") == "longrope":
        return _longrope(served, length)
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


def _temperatures(served: Served) -> tuple[float, float, float]:
    """vLLM's short and long attention temperatures of the longrope in config.json, and transformers': vLLM takes
    short_mscale / long_mscale, each else sqrt(1 + ln(max_position_embeddings / L) / ln L); transformers its
    attention_factor, else the same formula of its factor."""
    rope, L = served.rope, int(served.rope["original_max_position_embeddings"])
    derived = longrope_attention_factor(served.context / L, L)
    ours = rope.get("attention_factor") or longrope_attention_factor(float(rope.get("factor") or served.context / L), L)
    return float(rope.get("short_mscale") or derived), float(rope.get("long_mscale") or derived), float(ours)


def _longrope(served: Served, length: int | None) -> Launch:
    """longrope (a searched one, a composition on a scaled checkpoint): vLLM takes the short factors for every input
    when --max-model-len is at most L, the long ones for every input past it (transformers switches per input)."""
    rope, L = served.rope, int(served.rope["original_max_position_embeddings"])
    if "mscale_all_dim" in rope or served.model_type in DEEPSEEK_TYPES:
        return Launch(ENGINE, CANNOT, f"vLLM 0.32's DeepSeek model ({served.model_type}) relabels any scaled rope_type "
                                      "as its deepseek_yarn (or deepseek_llama_scaling) and computes YaRN "
                                      "frequencies, not these longrope lists.", checked=CHECKED)
    short, long, ours = _temperatures(served)
    if not (math.isclose(short, ours, rel_tol=1e-6) and math.isclose(long, ours, rel_tol=1e-6)):
        theirs = long if not math.isclose(long, ours, rel_tol=1e-6) else short
        return Launch(ENGINE, CANNOT, f"vLLM's longrope applies the attention temperature {theirs:.6g} (from "
                                      f"short_mscale / long_mscale, else derived from the context ratio), transformers "
                                      f"{ours:.6g} (attention_factor): re-save the model with hf_posenc, which writes "
                                      "short_mscale / long_mscale equal to attention_factor.", checked=CHECKED)
    n = length_for(served, length, ENGINE, served.context, most=MOST)
    command = ["vllm", "serve", served.path, "--max-model-len", str(n)]
    python = {"model": served.path, "max_model_len": n}
    if n <= L or rope["short_factor"] == rope["long_factor"]:
        return Launch(ENGINE, SAME, f"vLLM reads longrope from config.json; with --max-model-len {n} "
                                    f"{'(at most its switch, ' + str(L) + ')' if n <= L else '(one factor list)'} "
                                    f"it takes the factors transformers takes for every input: {CHECKED_LONGROPE}.",
                      command=command, python=python, max_length=n, checked=CHECKED)
    return Launch(ENGINE, PAST, f"vLLM reads longrope from config.json but, with --max-model-len {n} past its switch "
                                f"({L}), takes the long factors for every input: the same as hf_posenc for inputs "
                                f"longer than {L} tokens; shorter ones get the long factors too (transformers: the "
                                f"short ones; hf-posenc tune reports that cost). Serve with --max-model-len {L} for "
                                f"short inputs exactly: {CHECKED_LONGROPE}.",
                  command=command, python=python, max_length=n, checked=CHECKED)


register_engine(Engine("vllm", ENGINE, launch=launch, runner=RUNNER))
