"""What serving engines compute for a saved checkpoint, as far as it is known without running them.

A checkpoint whose change is native (``rope_parameters`` transformers reads) is read by engines from the same
fields; one whose change is not (the attention-level methods, dynamic YaRN, the family swaps) is, for every
plain loader, the unpatched model: its ``config.json`` states the original context
(``adapters.base.SavedAsOriginal``), so an engine refuses longer inputs rather than computing them with plain
RoPE. Each row says whether it was measured (and where) or is only known from the method and the engine's
documentation; ``hf-posenc patch --serve-check`` replaces the rows of the engines it measured.
"""

from __future__ import annotations

import math
from typing import Any

from ..adapters.base import text_config
from ..adapters.layout import default_layer_types, per_layer_type, scaled_by
from ..engines.launch.base import CANNOT, unserved
from ..engines.registry import display_name, followers, support_names
from ..methods import resolve_method
from ..methods.rope import SCALINGS

STATUS = {"same": "same as hf_posenc", "within_original": "same up to the original context; differs past it",
          "differs": "computes it otherwise (measured)"}


def known_status(block: dict[str, Any], dual_chunk: dict[str, Any] | None = None,
                 rope: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """``[{engine, status, basis}]`` for the checkpoint whose ``hf_posenc`` block is ``block``; ``dual_chunk``: its
    config's ``dual_chunk_attention_config`` (``patch --dual-chunk-config``), which SGLang reads; ``rope``: its
    language model's ``rope_parameters`` (a scaled proportional RoPE in them: no engine computes it). An engine
    that runs another's computation (Ollama: llama.cpp's) has that engine's row (:func:`followed`)."""
    return followed(_own_status(block, dual_chunk, rope))


def followed(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """``rows`` with the row of each engine that runs another's computation (``Engine.runs_on``) set to that
    engine's status, its basis saying so."""
    by_name = {r["engine"]: r for r in rows}
    out = []
    for row in rows:
        engine = followers().get(row["engine"])
        base = by_name.get(engine.runs_on) if engine else None
        out.append(row if base is None else {"engine": row["engine"], "status": base["status"],
                                             "basis": f"{engine.runs_on_why}; {base['engine']}'s: {base['basis']}"})
    return out


def _own_status(block: dict[str, Any], dual_chunk: dict[str, Any] | None,
                rope: dict[str, Any] | None) -> list[dict[str, str]]:
    """:func:`known_status` before an engine that runs another's takes that one's row."""
    method, native = block.get("method"), bool(block.get("native"))
    engines = support_names()  # the rows, as the method records' ``engines`` name them
    ropes = list(rope.values()) if per_layer_type(rope) else [rope or {}]
    if any(scaled_proportional(r) for r in ropes):
        return [{"engine": e, "status": "cannot", "basis": PROPORTIONAL} for e in engines]
    if not native:
        basis = f"not computable: {unserved(method)}"
        if resolve_method(method).kind == "swap":
            status = f"the original positional encoding around weights meant for `{method}`: not this model"
            return [{"engine": e, "status": status, "basis": basis} for e in engines]
        rows = [{"engine": e, "status": "the unpatched model, up to the original context; longer inputs refused",
                 "basis": basis + "; config.json states the original context"} for e in engines]
        # llama.cpp takes whatever context it is given (past the GGUF's trained one it logs a warning only)
        rows[engines.index("llama.cpp")] = {
            "engine": "llama.cpp", "status": "the unpatched model: past the original context it still computes plain "
                                             "RoPE when given a longer context (a warning only): wrong there",
            "basis": basis + "; measured: a DCA checkpoint forced into llama.cpp is served wrong past L "
                             "(hf-posenc serve-check --engine llama.cpp --confirm-refusal)"}
        if dual_chunk:
            rows[engines.index("SGLang")] = {
                "engine": "SGLang",
                "status": "DCA's positions, from dual_chunk_attention_config (launch settings below)",
                "basis": "not measured: read from SGLang's DualChunkRotaryEmbedding"}
        return rows
    if block.get("family") != "rope_decoder":
        return [{"engine": e, "status": "reads the config fields and weights transformers reads",
                 "basis": "not measured"} for e in engines]
    rows = []
    known = resolve_method(method).engines  # what the method's record says of each engine
    for engine in engines:
        if engine in known:
            rows.append({"engine": engine, "status": STATUS[known[engine].computes], "basis": known[engine].basis})
        else:
            rows.append({"engine": engine, "status": "reads the `rope_parameters` transformers reads",
                         "basis": "not measured"})
    return rows


def with_launches(rows: list[dict[str, str]], block: dict[str, Any],
                  launches: list[dict[str, Any]]) -> list[dict[str, str]]:
    """``rows`` (:func:`known_status`, of what the method's record says) of a checkpoint saved natively, each engine
    whose launch settings for this very checkpoint (``launches``: ``launch_settings.card_launches``) say it cannot
    compute it given that verdict and its reason, so that the card's two sections agree (a composed longrope of two
    lists: llama.cpp's GGUF holds one set of factors)."""
    if not block.get("native"):
        return rows
    cannot = {launch["engine"]: launch["reason"] for launch in launches if launch["computes"] == CANNOT}
    return [{"engine": r["engine"], "status": "cannot compute it", "basis": cannot[r["engine"]]}
            if r["engine"] in cannot else r for r in followed(rows)]


def vllm_refusal(method: str) -> str | None:
    """Why an evaluation cannot run ``method`` on vLLM and get hf_posenc's numbers (None: vLLM computes it the
    same way, measured: the method record's ``engines``)."""
    spec = resolve_method(method)
    known = spec.engines.get("vLLM")
    if known is not None and known.computes == "same":
        return None
    if known is not None:
        return known.caveat or known.basis
    if spec.kind in ("attention", "swap") or (spec.name in SCALINGS and SCALINGS[spec.name].native is None):
        return f"no vLLM implementation of `{spec.name}`"
    return f"`{spec.name}` in vLLM is not measured against hf_posenc (hf-posenc serve-check measures a checkpoint)"


PROPORTIONAL = ("transformers' proportional RoPE (Gemma 4's and LFM3's full-attention layers) scaled: vLLM 0.32 "
                "builds that RoPE (Gemma4RotaryEmbedding) from rope_theta and partial_rotary_factor alone, without a "
                "factor, and no other engine is known to compute a scaled one; serve it with transformers")


def scaled_proportional(rope: dict[str, Any]) -> bool:
    """Whether ``rope`` (one RoPE's ``rope_parameters``) is a proportional RoPE with a factor other than 1, which
    engines read as the unscaled one (:data:`PROPORTIONAL`)."""
    return scaled_by(rope) == "proportional"


def proportional_refusal(config: Any, method: str, layer_types: list[str] | None = None) -> str | None:
    """Why vLLM would not compute the RoPE scaling ``method`` on a model of ``config`` as hf_posenc does: it would
    change a proportional RoPE (:data:`PROPORTIONAL`; on per-layer-type RoPE, of ``layer_types``, by default those a
    scaling changes); None elsewhere."""
    rope = getattr(text_config(config)[0], "rope_parameters", None) or {}
    if method not in SCALINGS:
        return None
    if per_layer_type(rope):
        rope = [rope[t] for t in layer_types or default_layer_types(list(rope)) if t in rope]
    changed = rope if isinstance(rope, list) else [rope]
    return PROPORTIONAL if any(r.get("rope_type") == "proportional" for r in changed) else None


def measured_rows(rows: list[dict[str, str]], check: dict[str, Any] | None) -> list[dict[str, str]]:
    """``rows`` (:func:`known_status`) with the checked engine's row replaced by what a serve-check report measured."""
    if check is None:
        return rows
    s, results = check["setup"], check["results"]
    verdicts = {n: r["verdict"] for n, r in results.items()}
    worst = max((r.get("relative_diff") or 0.0 for r in results.values()), default=0.0)
    if set(verdicts.values()) == {"same"}:
        status = f"same as hf_posenc at {', '.join(verdicts)} tokens"
    else:
        status = "; ".join(f"{n}: {v}" for n, v in verdicts.items())
    basis = (f"measured by hf-posenc serve-check: {s['engine']} {s.get('engine_version', '')}, mean NLL within "
             f"{worst:.1e} relative (same = within {s['rtol']:g})" if s.get("engine_started")
             else "hf-posenc serve-check: " + next(iter(results.values())).get("reason", ""))

    name = display_name(s["engine"])
    return followed([{"engine": r["engine"], "status": status, "basis": basis} if r["engine"] == name else r
                     for r in rows])


def vllm_positions(config) -> int | None:
    """How many positions vLLM's rotary table holds for a model of this (transformers) ``config``, as vLLM builds it
    from the saved ``config.json``; a position past it reads outside the table (NaN or garbage, no error, when
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` lets the engine take it). None: plain RoPE (``rope_type: default``), whose
    table follows ``max_position_embeddings``, which its math does not depend on -- an evaluation may raise it
    (:class:`engines.vllm_engine.EnginePool`). YaRN's holds its factor times its original context, whatever
    ``max_position_embeddings`` says (a Qwen-style YaRN x4 left at 32,768 holds 131,072: vLLM's
    ``YaRNScalingRotaryEmbedding``); other scaled types (linear, llama3) hold the context they advertise. On
    per-layer-type RoPE (Gemma 3) each layer type has its table: the fewest positions of the scaled ones."""
    lm = text_config(config)[0]
    rope = getattr(lm, "rope_parameters", None) or {}
    ropes = list(rope.values()) if per_layer_type(rope) else [rope]
    tables = [t for t in (_vllm_table(rp, getattr(lm, "max_position_embeddings", None)) for rp in ropes)
              if t is not None]
    return min(tables) if tables else None


def _vllm_table(rope: dict[str, Any], max_position: int | None) -> int | None:
    """The positions vLLM's rotary table of one RoPE holds (:func:`vllm_positions`); None: an unscaled RoPE's
    (plain, or Gemma 4's proportional one without a factor), which follows max_position_embeddings."""
    if scaled_by(rope) is None:
        return None
    factor, original = rope.get("factor"), rope.get("original_max_position_embeddings")
    if rope.get("rope_type") == "yarn" and factor and original:  # torch.arange(original x factor) positions
        return math.ceil(int(original) * float(factor))
    return max_position
