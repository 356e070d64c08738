"""llama.cpp: ``llama-server -m FILE.gguf --ctx-size N`` (``llama_cpp.Llama(model_path=..., n_ctx=N)``).

llama.cpp reads the RoPE from the GGUF's metadata (``{arch}.rope.scaling.*``, ``rope.freq_base``, a ``rope_freqs``
tensor): a folder is converted first by llama.cpp's own ``convert_hf_to_gguf.py``, which writes the scaling of
``config.json`` (linear, yarn, llama3's rope_freqs, a new rope_theta) and plain RoPE for a type it does not know;
a GGUF written by ``hf-posenc patch --gguf`` already holds it. The library computes any context it is given (past
the GGUF's trained context: a warning only), so it never refuses what it computes wrong; ``llama-server`` gives each
slot at most the GGUF's ``{arch}.context_length`` (``server-context.cpp``), so a longer context also needs
``--override-kv {arch}.context_length=int:N``. The same scaling can be given to an unpatched GGUF by flags
(:func:`flags`), except llama3 (a tensor, not a flag).
"""

from __future__ import annotations

import os

from ..llama_cpp_engine import RUNNER
from ..registry import Engine, register_engine
from .base import CANNOT, INT32_MAX, NOT_MEASURED, SAME, WITHIN, Launch, Most, Served, length_for, not_native

ENGINE = "llama.cpp"
CHECKED = ("launched with these keywords of llama_cpp.Llama by tests/test_serve_config.py (llama-cpp-python 0.3.36, "
           "the llama.cpp it vendors); llama-server, which takes them as the flags shown, not launched here")
MOST = Most(INT32_MAX, "llama-server reads --ctx-size as a C int into common_params.n_ctx, an int32_t; "
            "llama_cpp.Llama's n_ctx reaches the same field")
GGUF_BASIS = ("llama.cpp reads the method from the file's metadata, which 'hf-posenc patch --gguf' wrote: "
              "tests/test_gguf_patch.py checks the frequencies llama.cpp derives from it against hf_posenc's, and "
              "tests/test_llama_cpp.py serve-checks SmolLM2's Q4_1 GGUF patched with yarn x2 (same within the "
              "quantization's 5e-3); hf-posenc serve-check FILE --engine llama.cpp measures this file.")
SCALING_TYPES = {"none": 0, "linear": 1, "yarn": 2}  # llama.cpp's enum llama_rope_scaling_type


def flags(meta: dict) -> tuple[list[str], dict] | None:
    """The llama-server flags, and the ``llama_cpp.Llama`` keywords, that give an unpatched GGUF the RoPE of the
    metadata ``meta`` (short names, :class:`Served`); None when flags cannot (llama3's rope_freqs tensor, a
    temperature other than YaRN's own)."""
    if meta.get("freqs") or meta.get("attn_factor") is not None:
        return None
    cli, kw = [], {}
    scaling_type = meta.get("type", "none")
    if scaling_type != "none":
        cli += ["--rope-scaling", scaling_type, "--rope-scale", f"{meta['factor']:g}"]
        kw.update(rope_scaling_type=SCALING_TYPES[scaling_type], rope_freq_scale=1.0 / meta["factor"])
    if scaling_type == "yarn":
        cli += ["--yarn-orig-ctx", str(meta["original"])]
        kw["yarn_orig_ctx"] = int(meta["original"])
    if meta.get("base_changed"):
        cli += ["--rope-freq-base", f"{meta['base']:.10g}"]
        kw["rope_freq_base"] = float(meta["base"])
    return cli, kw


GGUF_ARCH = {"mistral": "llama"}  # model_type -> the GGUF architecture llama.cpp's converter writes (else the same)


def context_override(served: Served, n: int, context: int) -> tuple[list[str], dict]:
    """llama-server's flag and llama_cpp.Llama's keyword that let a slot hold ``n`` tokens of a GGUF whose
    ``context_length`` is ``context`` (none needed up to it)."""
    if n <= context:
        return [], {}
    key = context_key(served)
    return ["--override-kv", f"{key}=int:{n}"], {"kv_overrides": {key: n}}


def context_key(served: Served) -> str:
    """The GGUF metadata key of the context length llama.cpp's converter writes for ``served``."""
    return f"{GGUF_ARCH.get(served.model_type, served.model_type)}.context_length"


def gguf_of(served: Served) -> tuple[str, list[list[str]]]:
    """The GGUF llama.cpp is given, and the conversion to run first when the checkpoint is a folder."""
    if served.gguf:
        return served.path, []
    gguf = os.path.normpath(served.path) + "-f32.gguf"
    return gguf, [["python", "convert_hf_to_gguf.py", served.path, "--outfile", gguf, "--outtype", "f32"]]


def unjudged_reason(served: Served, engine: str = "llama.cpp") -> str:
    """Why hf_posenc cannot say whether llama.cpp computes the checkpoint ``served`` (its ``llama_cpp_unjudged``)."""
    why = (f"; read as a llama checkpoint it would not be computed ({served.llama_cpp_refusal})"
           if served.llama_cpp_refusal else "")
    return (f"{engine} may or may not compute this checkpoint: hf_posenc does not know {served.llama_cpp_unjudged}"
            f"{why}; not measured here (hf-posenc serve-check --engine llama.cpp measures it).")


def _unjudged(served: Served, length: int | None) -> Launch:
    gguf, steps = gguf_of(served)
    n = length_for(served, length, ENGINE, most=MOST)
    return Launch(ENGINE, NOT_MEASURED, unjudged_reason(served), steps=steps,
                  command=["llama-server", "-m", gguf, "--ctx-size", str(n)], python={"model_path": gguf, "n_ctx": n},
                  max_length=n, checked=CHECKED)


def launch(served: Served, length: int | None) -> Launch:
    if not served.native:
        return not_native(served, ENGINE, "converted, it is the unpatched model, and llama.cpp computes plain RoPE "
                                          "past the original context when given a longer one, with a warning only: "
                                          "served wrong there (measured: hf-posenc serve-check --engine llama.cpp "
                                          "--confirm-refusal)")
    support = served.support.get(ENGINE)
    if served.llama_cpp is None and served.llama_cpp_unjudged:
        return _unjudged(served, length)
    if served.llama_cpp is None and not (support is not None and support.computes == "within_original"):
        why = served.llama_cpp_refusal or ""
        if "beta_fast=" in why:
            why += (" -- a GGUF cannot carry them; llama-server's --yarn-beta-fast / --yarn-beta-slow flags set them "
                    "at launch (not measured here)")
        return Launch(ENGINE, CANNOT, f"llama.cpp cannot compute this checkpoint from a GGUF: {why}.")
    gguf, steps = gguf_of(served)
    notes = [] if served.gguf else ["convert_hf_to_gguf.py is llama.cpp's own converter (in its source tree); "
                                    "f32 is what was measured; a quantized type (llama-quantize) adds its rounding"]
    if support is not None and support.computes == "within_original":
        n = length_for(served, length if length is not None else served.original, ENGINE, served.original, most=MOST)
        return Launch(ENGINE, WITHIN, f"The same as hf_posenc up to the original context only: {support.caveat}.",
                      steps=steps, command=["llama-server", "-m", gguf, "--ctx-size", str(n)],
                      python={"model_path": gguf, "n_ctx": n}, max_length=n, checked=CHECKED, notes=notes)
    n = length_for(served, length, ENGINE, most=MOST)
    over_cli, over_kw = context_override(served, n, served.stated_context)  # the GGUF's context_length
    if n > served.context:
        notes.append(f"past the {served.context} tokens the checkpoint advertises: llama.cpp and hf_posenc compute "
                     "the same formula there, but the method was set for the advertised context")
    alternative = flags(served.llama_cpp)
    if alternative and not served.gguf and served.method != "none":
        orig_cli, orig_kw = context_override(served, n, served.original)  # the unpatched GGUF states L
        notes.append("or, on the unpatched model's GGUF: llama-server -m ORIGINAL.gguf "
                     + " ".join(alternative[0] + orig_cli) + f" --ctx-size {n} (Python: "
                     + ", ".join(f"{k}={v!r}" for k, v in {**alternative[1], **orig_kw}.items()) + ")")
    if served.frozen_at:
        notes.append(f"a dynamic method frozen at {served.frozen_at:,} tokens (patch --freeze-at): an input of that "
                     "length gets what the dynamic method gives it, a shorter or longer one the frequencies of "
                     f"{served.frozen_at:,}")
    computes = SAME if served.gguf or (support is not None and support.computes == "same") else NOT_MEASURED
    reason = (GGUF_BASIS if served.gguf and served.method != "none" else
              "llama.cpp computes the GGUF's own RoPE (no scaling): the model as it was trained." if served.gguf else
              f"llama.cpp reads the method from the GGUF's metadata: {support.basis}." if computes == SAME else
              f"llama.cpp reads the method from the GGUF's metadata; `{served.method}` on llama.cpp is not measured "
              "here (hf-posenc serve-check --engine llama.cpp measures it).")
    return Launch(ENGINE, computes, reason, steps=steps,
                  command=["llama-server", "-m", gguf, *over_cli, "--ctx-size", str(n)],
                  python={"model_path": gguf, "n_ctx": n, **over_kw}, max_length=n, checked=CHECKED, notes=notes)


register_engine(Engine("llama.cpp", ENGINE, launch=launch, runner=RUNNER))
