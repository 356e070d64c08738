"""``hf-posenc serve-check``: does a serving engine compute a saved checkpoint as hf_posenc does?

The checkpoint is loaded twice -- with :func:`hf_posenc.from_pretrained` (the reference) and in the engine as a
deployment would load it (vLLM, its maximum length derived from ``config.json``; llama.cpp, from the GGUF its own
converter makes of the folder, with the context asked for) -- and both score the same tokens, the first ``n`` of the
text for each length ``n``. Per length: the mean NLL each way, the largest per-token difference and a verdict: ``same``
(mean NLL within ``rtol`` relative, 1e-3 by default), ``differs`` (the numbers say by how much), or ``refused`` (the
engine would not take that many tokens; its own words: a prompt also needs room for the one token the engine generates
after it, so vLLM takes at most its maximum model length less one). A
checkpoint whose method no engine implements (``native: false`` in its block: the attention-level methods,
dynamic YaRN, the family swaps), or one that ``hf-posenc serve-config`` says this engine cannot compute (a longrope
with two factor lists on llama.cpp, a temperature vLLM derives otherwise), is reported ``not computable`` with that
reason, without starting the engine; with ``confirm_refusal`` the engine is started anyway (for a method no engine
implements: to show that it refuses the lengths past the original context; a length it accepts there is ``served
wrong``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..checkpoints import loading
from ..checkpoints.runtime import load_tokenizer, torch_dtype
from ..engines.launch.base import unserved
from ..engines.registry import display_name, runnable
from ..engines.registry import engine as engine_record
from ..engines.scorer import EngineRefused
from ..engines.settings import EngineSettings
from ..eval.scoring import token_nll
from ..io.documents import corpus_stream, gather_documents
from ..io.files import check_output_folder
from ..io.provenance import environment, recorded_command
from ..io.reports import finish_report, markdown_table
from ..methods import resolve_method
from .checkpoint_facts import context_of, original_of, read_block
from .gguf_file import is_gguf
from .launch_settings import engine_launch, served_of

DEFAULT_ENGINE = "vllm"  # serve-check's engine when none is named
LONGEST_DEFAULT = 32768  # the default lengths stop here: the reference forward of a long text costs minutes on CPU
NOT_COMPUTABLE, SAME, DIFFERS, REFUSED, SERVED_WRONG = "not computable", "same", "differs", "refused", "served wrong"
RTOL = 1e-3  # same: the mean NLL within this, relative (float32 weights both ways)
# A quantized GGUF: llama.cpp multiplies the quantized weights with activations it rounds to 8-bit integers, hf_posenc
# the de-quantized weights in float32. Measured on SmolLM2-135M's Q4_1 GGUF: 1.0e-3 to 2.4e-3 relative at 256 to
# 12,288 tokens, unpatched and patched with yarn x2 (max per-token 0.4-0.9 nats; scripts/bench_serving.py --engine
# llama.cpp, tests/test_llama_cpp.py). The tolerance leaves twice the largest: a position encoding that moves the
# mean NLL by 0.5% or more is resolved (yarn x2 vs the unpatched file: 0.6-0.7% at 256 and 1,000 tokens over a
# stated L of 512, 1% at 4,096 and 5.7% at 12,288 over SmolLM2's 8,192; the yarn record served as pi: 16-19%).
QUANTIZED_RTOL = 5e-3
QUANTIZED_BASIS = ("quantized weights: llama.cpp multiplies them with activations rounded to 8 bits, hf_posenc "
                   "de-quantizes them to float32; SmolLM2's Q4_1 GGUF is 1.0e-3 to 2.4e-3 apart, so a difference "
                   "under 0.5% is not resolved")


def check_engine_flags(engine: str, engine_python: str | None = None, allow_long: bool = False,
                       tensor_parallel_size: int = 1, engine_args: dict[str, Any] | None = None) -> None:
    """An engine serve-check starts, and only the flags that set it up (vLLM's are refused with an engine that does
    not take them); :func:`check_engine_settings` for the flags as one :class:`EngineSettings`."""
    check_engine_settings(EngineSettings(engine, engine_python, tensor_parallel_size, dict(engine_args or {}),
                                         allow_long))


def check_engine_settings(e: EngineSettings) -> None:
    if e.name not in runnable():
        raise ValueError(f"--engine must be one of {list(runnable())}, got {e.name!r}")
    runner = engine_record(e.name).runner
    vllm_only = e.given()
    if vllm_only and not runner.takes_vllm_flags:
        raise ValueError(f"{', '.join(vllm_only)} set up vLLM; --engine {e.name} takes none of them "
                         f"({runner.no_flags_reason})")


def engine_ready(engine: str, engine_python: str | None = None) -> str:
    """The engine's version, once it is known to be installed (a clear error otherwise): asked before the slow work
    of a check, and by ``hf-posenc patch --serve-check`` before its own."""
    return engine_record(engine).runner.ready(EngineSettings(engine, engine_python))


def default_lengths(original: int, advertised: int) -> list[int]:
    """Half the original context (inside it) and the context the checkpoint advertises (past it, when it
    advertises more) less one token, at most :data:`LONGEST_DEFAULT` tokens. Less one: an engine scores a prompt
    by generating one token after it, so a prompt of as many tokens as its maximum model length is refused."""
    return sorted({max(2, original // 2), min(max(advertised, original) - 1, LONGEST_DEFAULT)})


def check_lengths(lengths: list[int] | None) -> None:
    if lengths is not None and (not lengths or any(not isinstance(n, int) or n < 2 for n in lengths)):
        raise ValueError(f"--lengths must be token counts >= 2, got {lengths}")


def reference_nll(folder: str, tokens: list[int], lengths: list[int], dtype: str, device: str, chunk_size: int,
                  progress: bool) -> tuple[dict[int, torch.Tensor], Any]:
    """Per length, the NLL of tokens 1 .. n-1 of the first ``n`` tokens, computed by hf_posenc's own load."""
    from tqdm.auto import tqdm


    lm = loading.from_pretrained(folder, dtype=torch_dtype(dtype)).to(device).eval()
    out = {n: token_nll(lm, torch.tensor([tokens[:n]], device=device), chunk_size=chunk_size)[0].double()
           for n in tqdm(lengths, desc="hf_posenc", disable=not progress, leave=False)}
    return out, lm


def compare(ref: torch.Tensor, got: torch.Tensor, rtol: float) -> dict[str, Any]:
    a, b = ref.mean().item(), got.mean().item()
    rel = abs(b - a) / max(abs(a), 1e-12)
    out = {"verdict": SAME if rel <= rtol else DIFFERS, "hf_posenc_nll": a, "engine_nll": b, "relative_diff": rel,
           "max_token_diff": (got - ref).abs().max().item(), "tokens": ref.numel()}
    bad = int((~torch.isfinite(got)).sum())
    if bad:
        out["reason"] = f"the engine's log-probability of {bad} of the {got.numel()} tokens is not a finite number"
    return out


def engine_results(served, tokens: list[int], lengths: list[int], ref: dict[int, torch.Tensor] | None,
                   original: int, rtol: float) -> dict[str, dict[str, Any]]:
    """Per length: the NLL the engine (``served``, a :class:`engines.scorer.Scorer`) computes, compared with ``ref``
    (None: a non-computable checkpoint, where only a refusal past the original context is right)."""
    out = {}
    for n in lengths:
        try:  # vLLM's log-probabilities are fp32 values: the float32 tensor holds them exactly
            got = served.token_nll(torch.tensor([tokens[:n]]))[0].double()
        except EngineRefused as why:
            out[str(n)] = {"verdict": REFUSED, "reason": str(why)}
            continue
        if ref is not None:
            out[str(n)] = compare(ref[n], got, rtol)
        elif n > original:
            out[str(n)] = {"verdict": SERVED_WRONG, "engine_nll": got.mean().item(),
                           "reason": f"the engine computed {n} tokens of a checkpoint it cannot compute, past the "
                                     f"original context {original}"}
        else:
            out[str(n)] = {"verdict": NOT_COMPUTABLE, "engine_nll": got.mean().item(),
                           "reason": "the engine computes the unpatched model here, not the method"}
    return out


@dataclass(frozen=True)
class CheckSettings:
    """What a check scores and how: ``lengths`` (default: :func:`default_lengths`), ``rtol`` (default :data:`RTOL`, or
    :data:`QUANTIZED_RTOL` for a quantized GGUF), ``confirm_refusal`` (start the engine for a checkpoint no engine
    computes, to see it refuse past L), the hf_posenc side's ``dtype``, ``device`` and LM-head ``chunk_size``."""

    lengths: list[int] | None = None
    rtol: float | None = None
    confirm_refusal: bool = False
    dtype: str = "float32"
    device: str = "cpu"
    chunk_size: int = 1024

    def __post_init__(self) -> None:
        if self.rtol is not None and not 0 < self.rtol < 1:
            raise ValueError(f"--rtol must be between 0 and 1, got {self.rtol}")
        check_lengths(self.lengths)


def serve_check(folder: str, engine: str | EngineSettings = "vllm", check: CheckSettings | None = None, *,
                docs: list | None = None, tokenizer: str | None = None, output: str | None = None,
                progress: bool = True, command: str | None = None) -> dict[str, Any]:
    """Check that ``engine`` (a name, or :class:`EngineSettings`) computes the checkpoint ``folder`` as hf_posenc does
    (module docstring), with ``check`` (:class:`CheckSettings`); returns the report ``{task, setup, results, table}``
    (results keyed by length), written to ``output`` as ``serve_check.json`` / ``.md`` when given. ``folder`` may be
    a GGUF file (llama.cpp): llama.cpp scores it as it is (quantized weights stay quantized) and hf_posenc its
    de-quantized weights."""
    e = engine if isinstance(engine, EngineSettings) else EngineSettings(engine)
    e = e if e.name else dataclasses.replace(e, name=DEFAULT_ENGINE)
    check_engine_settings(e)
    c = check or CheckSettings()
    engine, engine_python = e.name, e.python
    runner = engine_record(engine).runner
    lengths, rtol, confirm_refusal, dtype, device, chunk_size = (c.lengths, c.rtol, c.confirm_refusal, c.dtype,
                                                                 c.device, c.chunk_size)
    gguf = is_gguf(folder)
    if gguf and not runner.scores_gguf:
        takes = [k for k in runnable() if engine_record(k).runner.scores_gguf]
        raise ValueError(f"{folder} is a GGUF file: serve-check scores a GGUF with --engine {' or '.join(takes)} "
                         f"({display_name(engine)} is checked on the HF folder 'hf-posenc patch --output' writes)")
    if output:
        check_output_folder(output)
    started = time.time()
    plain, block = read_block(folder)
    method, native = block.get("method", "none"), bool(block.get("native", True)) if block else True
    original = original_of(plain, block)
    quantized = plain.get("quantized") if gguf else None
    rtol, basis = ((rtol, "as asked") if rtol is not None else (QUANTIZED_RTOL, QUANTIZED_BASIS) if quantized
                   else (RTOL, "float32 weights both ways"))
    setup: dict[str, Any] = {"folder": os.path.abspath(folder), "method": method, "native": native, "engine": engine,
                             "original_context": original, "rtol": rtol, "rtol_basis": basis, "dtype": dtype,
                             "command": recorded_command(command), "environment": environment()}
    reason = (None if confirm_refusal else _engine_cannot(folder, engine, plain, block) if native else
              f"{unserved(method)} (the checkpoint's block says native: false)")
    if reason:
        lengths = lengths or default_lengths(original, 2 * original if not native else
                                             int(context_of(plain) or original))
        results = {str(n): {"verdict": NOT_COMPUTABLE, "reason": reason} for n in lengths}
        setup.update(lengths=lengths, engine_started=False, seconds=round(time.time() - started, 1))
        return finish_report("serve_check", setup, results, serve_table, output)
    setup["engine_version"] = engine_ready(engine, engine_python)  # before the slow work: a missing engine is said
    tokens, setup["text"] = check_text(folder, tokenizer, docs, lengths, original, plain)
    lengths = lengths or default_lengths(original, int(context_of(plain) or original))
    if len(tokens) < max(lengths):
        raise ValueError(f"the text has {len(tokens)} tokens, fewer than the longest length {max(lengths)}: give more "
                         "text (--text-file, --text-dir, --dataset) or shorter --lengths")
    ref, lm = (reference_nll(folder, tokens, lengths, dtype, device, chunk_size, progress) if native
               else (None, None))
    del lm  # the reference model's memory goes before the engine takes its own
    limited = _past_what_the_engine_computes(engine, method, lengths, original)
    scored = [n for n in lengths if str(n) not in limited]
    results = _engine_results(folder, e, tokens, scored, ref, (original, rtol, dtype), setup, quantized)
    results = {str(n): limited.get(str(n)) or results[str(n)] for n in lengths}
    setup.update(lengths=lengths, seconds=round(time.time() - started, 1))
    return finish_report("serve_check", setup, results, serve_table, output)


def _engine_cannot(folder: str, engine: str, plain: dict[str, Any], block: dict[str, Any]) -> str | None:
    """Why ``engine`` computes the natively patched checkpoint at ``folder`` (its config ``plain`` and hf_posenc
    record ``block``) at no length: ``hf-posenc serve-config``'s ``cannot`` for this engine where it is grounded (a
    longrope with two lists on a llama-architecture GGUF, a temperature vLLM derives otherwise); None when it computes
    it somewhere, where serve-config cannot judge the checkpoint (it says ``not measured``: an architecture whose GGUF
    reading hf_posenc does not write out, a config without its attention geometry) or cannot read its config: the
    engine measures it."""
    try:
        served = served_of(plain, block, os.path.abspath(folder), gguf=is_gguf(folder))
        launch = engine_launch(engine, served, None)
    except (ValueError, TypeError, KeyError):  # a config serve-config does not read: left to the measurement
        return None
    if launch.computes != "cannot":
        return None
    return f"{launch.reason} (hf-posenc serve-config: cannot; serve-check --confirm-refusal scores it anyway)"


def _past_what_the_engine_computes(engine: str, method: str, lengths: list[int],
                                   original: int) -> dict[str, dict[str, Any]]:
    """The lengths past the original context of a method whose record says this engine computes it the same only
    up to there (llama.cpp's converter writes no scaling for dynamic NTK, say): ``not computable``, not scored."""
    support = resolve_method(method).engines.get(display_name(engine))
    if support is None or support.computes != "within_original" or engine_record(engine).runner.scores_past_limits:
        return {}
    return {str(n): {"verdict": NOT_COMPUTABLE, "reason": support.caveat or support.basis}
            for n in lengths if n > original}


def _engine_results(folder: str, e: EngineSettings, tokens: list[int], lengths: list[int], ref,
                    scoring: tuple[int, float, str], setup: dict[str, Any],
                    quantized: dict[str, int] | None) -> dict[str, dict[str, Any]]:
    """The engine's record opens its scorer on ``folder`` for the longest of ``lengths`` (none: not started) and
    each length is compared with ``ref``; ``scoring``: (original context, rtol, dtype); ``quantized``: a GGUF's
    weight types (None for a folder)."""
    if not lengths:
        setup.update(engine_started=False)
        return {}
    original, rtol, dtype = scoring
    with engine_record(e.name).runner.open(folder, e, dtype, max(lengths), setup) as served:
        if quantized is not None:
            setup["weight_types"] = quantized
        return engine_results(served, tokens, lengths, ref, original, rtol)


def check_text(folder: str, tokenizer: str | None, docs: list | None, lengths: list[int] | None, original: int,
               plain: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """The token ids every length scores a prefix of (the documents joined), and what they are."""
    tok = load_tokenizer(folder, tokenizer)
    docs = docs or gather_documents()
    longest = max(lengths or [min(max(int(plain.get("max_position_embeddings") or 0), original), LONGEST_DEFAULT)])
    tokens = corpus_stream(tok, docs, max_tokens=longest)
    digest = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]
    return tokens, {"documents": [d.name for d in docs], "tokens": len(tokens), "digest": digest}


def failed(report: dict[str, Any]) -> list[str]:
    """The lengths whose verdict is a failure: ``differs`` or ``served wrong``."""
    return [n for n, r in report["results"].items() if r["verdict"] in (DIFFERS, SERVED_WRONG)]


def _types(types: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in types.items()) + " tensors quantized" if types else "not quantized"


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def serve_table(report: dict[str, Any]) -> str:
    s = report["setup"]
    version = f" {s['engine_version']}" if s.get("engine_version") else ""
    note = (f"Serve check of {s['folder']} (method `{s['method']}`, original context {s['original_context']}): "
            f"mean NLL of the same tokens by hf_posenc.from_pretrained and by {s['engine']}{version}"
            + (f" (the folder converted to GGUF f32 by llama.cpp's converter; context {s['engine_context']}, as asked: "
               "llama.cpp computes past the GGUF's trained context with a warning only)" if s.get("converted")
               else f" (the GGUF as it is: {_types(s['weight_types'])}; context {s['engine_context']})"
               if s.get("engine_context")
               else " (engine not started)" if not s.get("engine_max_model_len") else
               f" (maximum model length {s['engine_max_model_len']}, forced past config.json by "
               "VLLM_ALLOW_LONG_MAX_MODEL_LEN)" if s.get("allow_long") else
               f" (maximum model length {s['engine_max_model_len']}, as --engine-arg max_model_len gave it)"
               if s.get("max_model_len_given") else
               f" (maximum model length {s['engine_max_model_len']}, derived from config.json)")
            + f"; same = within {s['rtol']:g} relative ({s.get('rtol_basis', 'float32 weights both ways')}).")
    rows = [[n, r["verdict"], _num(r.get("hf_posenc_nll"), ".6f"), _num(r.get("engine_nll"), ".6f"),
             _num(r.get("relative_diff"), ".2e"), _num(r.get("max_token_diff"), ".2e"), r.get("reason", "")]
            for n, r in report["results"].items()]
    return note + "\n\n" + markdown_table(["tokens", "verdict", "hf_posenc NLL", f"{s['engine']} NLL",
                                           "relative diff", "max per-token diff", "reason"], rows)
