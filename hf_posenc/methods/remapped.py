"""The attention-level methods: training-free extension by remapped relative positions (Self-Extend, ReRoPE,
leaky ReRoPE, STRING, Dual Chunk Attention). One record per method: its knobs and checks, its defaults from
the model's original context ``L``, and the position scheme it runs (``hf_posenc.encodings.remap``).

Adding one: a ``Scheme`` in ``encodings/remap.py`` (the formula, cited) and a ``_add(...)`` here; the attention
function, the patching, saving and loading are shared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ..encodings import remap as M
from .spec import (
    MAX_ATTENTION_FACTOR,
    MAX_FACTOR,
    MAX_KNOB,
    MIN_ORIGINAL_CONTEXT,
    MethodSpec,
    on_unregister,
    positive_number,
    register_method,
)

KIND = "attention"
UNBOUNDED_CONTEXT = 4  # max_position_embeddings advertised by methods without a length limit: this x L


@dataclass(frozen=True)
class RemappedMethod:
    """``defaults(params, L)`` fills the knobs that depend on the model and checks them against it;
    ``scheme(params, L)`` builds the positions it runs; ``any_rope``: it is proven beyond one plain RoPE on
    full-attention layers (the others are refused there); ``dual_chunk(params, advertised)``: the
    ``dual_chunk_attention_config`` of Qwen's 1M configs that SGLang's dual-chunk attention computes the method from,
    for a checkpoint advertising ``advertised`` tokens (None: no engine setting computes it)."""

    spec: MethodSpec
    defaults: Callable[[dict[str, Any], int], dict[str, Any]]
    scheme: Callable[[dict[str, Any], int], M.Scheme]
    any_rope: bool = False  # runs on scaled, per-layer-type, partial and MLA RoPE and on sliding/full hybrids
    dual_chunk: Callable[[dict[str, Any], int], dict[str, int]] | None = None

    def context(self, params: dict[str, Any], original: int) -> int:
        """The ``max_position_embeddings`` the patched model advertises: the longest input whose relative
        positions all stay below ``L``, or the ``max_position_embeddings`` knob / 4 x L where none is."""
        longest = self.scheme(params, original).longest(original)
        if longest is not None:
            return longest
        return params.get("max_position_embeddings") or UNBOUNDED_CONTEXT * original


REMAPPED: dict[str, RemappedMethod] = {}


def _forget(name: str) -> None:
    REMAPPED.pop(name, None)


on_unregister(_forget)  # unregister_method removes its scheme too


def _add(spec: MethodSpec, defaults, scheme, any_rope: bool = False, dual_chunk=None) -> None:
    register_method(spec)
    REMAPPED[spec.name] = RemappedMethod(spec, defaults, scheme, any_rope, dual_chunk)


def _integer(name: str, value: Any, low: int, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}{' or None (the default)' if allow_none else ''}, "
                         f"got {value!r}.")


def _filled(p: dict[str, Any], **defaults: Any) -> dict[str, Any]:
    """``p`` with each knob left at None set to its model-dependent default."""
    return {**p, **{k: v for k, v in defaults.items() if p[k] is None}}


def _advertised(p: dict[str, Any], original: int) -> None:
    """The ``max_position_embeddings`` knob (the context the patched model advertises): from the original
    context to ``MAX_FACTOR`` times it."""
    n = p.get("max_position_embeddings")
    if n is not None and not original <= n <= MAX_FACTOR * original:
        raise ValueError(f"max_position_embeddings={n} must lie between the original context ({original}) and "
                         f"{MAX_FACTOR:g} x it ({int(MAX_FACTOR * original)}): it is the context the patched model "
                         "advertises.")


def _below(name: str, value: int, original: int) -> None:
    if value >= original:
        raise ValueError(f"{name}={value} must be shorter than the original context ({original}).")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}.")


# -- Self-Extend (Jin et al. 2024) ---------------------------------------------------------------------------
def _check_self_extend(factor: float, p: dict[str, Any]) -> None:
    g, w = p["group_size"], p["window"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 2:
        raise ValueError(f"group_size must be an integer >= 2 (positions per group), got {g!r}.")
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
        raise ValueError(f"window must be a positive integer (the neighbour window, in tokens) or None, got {w!r}.")
    if w is not None and w % g:
        raise ValueError(f"window must be a multiple of group_size ({g}), got window={w}.")


def _self_extend_defaults(p, L):
    g = p["group_size"]
    p = _filled(p, window=max(g, (L // 4) // g * g))
    _below("window", p["window"], L)
    return p


def _self_extend_grid(L: int, T: int, factors: list[float]) -> list[dict[str, Any]]:
    """window L/4 and L/2 (rounded to the group) x group_size the least that reaches T and twice it: grouped
    positions stay below L when (T - window) / group_size + window < L."""
    out = []
    for share in (4, 2):
        for double in (1, 2):
            g = max(2, (T - L // share) // (L - L // share) + 1) * double
            w = max(g, (L // share) // g * g)
            if (T - w) / g + w < L:
                out.append({"window": w, "group_size": g})
    return out


_add(MethodSpec(
    "self_extend", KIND,
    "Self-Extend (Jin et al. 2024): exact RoPE within a neighbour window, grouped positions (floor(p / G)) beyond "
    "it, merged in one softmax; training-free, up to (L - window) * group_size + window tokens.",
    aliases=("selfextend", "grouped_attention"), uses_factor=False,
    params={"group_size": 8, "window": None}, check=_check_self_extend, tune_grid=_self_extend_grid),
    _self_extend_defaults, lambda p, L: M.SelfExtend(p["group_size"], p["window"]), any_rope=True)


# -- ReRoPE and leaky ReRoPE (Su 2023) -------------------------------------------------------------------------
def _check_rerope(factor: float, p: dict[str, Any]) -> None:
    _integer("window", p["window"], 1)
    _check_bool("logn_scaling", p["logn_scaling"])
    _integer("max_position_embeddings", p.get("max_position_embeddings"), MIN_ORIGINAL_CONTEXT)
    if "leak" in p:
        leak = p["leak"]
        if isinstance(leak, bool) or not isinstance(leak, (int, float)) or not math.isfinite(leak) \
                or not 1 < leak <= MAX_KNOB:
            raise ValueError(f"leak must be a number > 1 and <= {MAX_KNOB:g} (how many times slower positions grow "
                             f"past the window; a larger one is rerope), got {leak!r}.")


def _rerope_defaults(p, L):
    p = _filled(p, window=L // 2)
    _below("window", p["window"], L)
    _advertised(p, L)
    return p


def _leaky_grid(L: int, T: int, factors: list[float]) -> list[dict[str, Any]]:
    """window L/4 and L/2 x leak the least that reaches T (rounded up to an integer >= 2) and twice it."""
    out = []
    for w in (L // 4, L // 2):
        least = max(2, math.ceil((T - w) / (L - w) + 1e-9))
        out += [{"window": w, "leak": float(least)}, {"window": w, "leak": float(2 * least)}]
    return out


_add(MethodSpec(
    "rerope", KIND,
    "ReRoPE (Su 2023): relative positions capped at window (min(i - j, window)), queries scaled by "
    "max(1, ln(i + 1) / ln L); training-free, no length limit.",
    aliases=("re_rope",), uses_factor=False,
    params={"window": None, "logn_scaling": True, "max_position_embeddings": None}, check=_check_rerope,
    tune_grid=lambda L, T, factors: [{"window": w} for w in (L // 4, L // 2)]),
    _rerope_defaults, lambda p, L: M.ReRoPE(p["window"], L, p["logn_scaling"]), any_rope=True)
_add(MethodSpec(
    "leaky_rerope", KIND,
    "Leaky ReRoPE (Su 2023): relative positions exact within window, then growing leak times slower; queries "
    "scaled by max(1, ln(i + 1) / ln L).",
    uses_factor=False, params={"window": None, "leak": 4.0, "logn_scaling": True}, check=_check_rerope,
    tune_grid=_leaky_grid),
    _rerope_defaults, lambda p, L: M.ReRoPE(p["window"], L, p["logn_scaling"], leak=float(p["leak"])),
    any_rope=True)


# -- STRING (An et al. 2024) -----------------------------------------------------------------------------------
def _check_string(factor: float, p: dict[str, Any]) -> None:
    _integer("shifted_offset", p["shifted_offset"], 1)
    _integer("local_window", p["local_window"], 0)
    positive_number("attention_factor", p["attention_factor"], most=MAX_ATTENTION_FACTOR,
                    meaning=" (every attention score is scaled by its square)")
    if None not in (p["shifted_offset"], p["local_window"]) and p["local_window"] >= p["shifted_offset"]:
        raise ValueError(f"local_window ({p['local_window']}) must be smaller than shifted_offset "
                         f"({p['shifted_offset']}): the shift moves distant keys closer, never farther.")


def _string_grid(L: int, T: int, factors: list[float]) -> list[dict[str, Any]]:
    """shifted_offset L/3, L/2, 2L/3 and the least that keeps T - offset + local_window < L, among those that
    reach T; local_window min(128, L/16)."""
    lw = max(1, min(128, L // 16))
    least = T - L + lw + 1
    offsets = sorted({o for o in (L // 3, L // 2, 2 * L // 3, least) if least <= o < L and o > lw})
    return [{"shifted_offset": o, "local_window": lw} for o in offsets]


def _string_defaults(p, L):
    p = _filled(p, shifted_offset=L // 3)
    p = _filled(p, local_window=max(0, min(128, L // 16, p["shifted_offset"] - 1)))
    _check_string(1.0, p)
    _below("shifted_offset", p["shifted_offset"], L)
    return p


_add(MethodSpec(
    "string", KIND,
    "STRING (An et al. 2024): relative positions past shifted_offset (default L/3) moved back to local_window "
    "(default min(128, L/16, shifted_offset - 1)): i - j - shifted_offset + local_window, so the well-trained "
    "small positions replace the rarely trained large ones; scores scaled by attention_factor^2 as YaRN's.",
    aliases=("shifted_rope",), uses_factor=False,
    params={"shifted_offset": None, "local_window": None, "attention_factor": 0.1 * math.log(2) + 1},
    check=_check_string, tune_grid=_string_grid),
    _string_defaults, lambda p, L: M.String(p["shifted_offset"], p["local_window"], float(p["attention_factor"])),
    any_rope=True)


# -- Dual Chunk Attention (An et al. 2024) ---------------------------------------------------------------------
def _check_dca(factor: float, p: dict[str, Any]) -> None:
    _integer("chunk_size", p["chunk_size"], 2)
    _integer("local_window", p["local_window"], 1)
    _integer("max_position_embeddings", p.get("max_position_embeddings"), MIN_ORIGINAL_CONTEXT)
    s, w = p["chunk_size"], p["local_window"]
    if s is not None and w is not None and s <= 2 * w:
        raise ValueError(f"chunk_size ({s}) must be more than twice local_window ({w}): chunks hold "
                         f"chunk_size - local_window positions, and the local window must fit in one.")


def _dca_defaults(p, L):
    p = _filled(p, chunk_size=3 * L // 4, local_window=max(1, L // 16))
    _check_dca(1.0, p)
    if p["chunk_size"] > L:
        raise ValueError(f"chunk_size={p['chunk_size']} must not exceed the original context ({L}).")
    _advertised(p, L)
    return p


def _dca_block(p: dict[str, Any], advertised: int) -> dict[str, int]:
    """SGLang's dual-chunk attention is DCA: its chunk and local sizes; no temperature up to the context the
    checkpoint advertises (``serving.dual_chunk_config``)."""
    return {"chunk_size": int(p["chunk_size"]), "local_size": int(p["local_window"]),
            "original_max_position_embeddings": int(advertised)}


_add(MethodSpec(
    "dca", KIND,
    "Dual Chunk Attention (An et al. 2024, ChunkLlama; Qwen2.5-1M's dual_chunk_attention_config): intra-chunk, "
    "successive-chunk and inter-chunk positions, all below chunk_size; training-free, no length limit.",
    aliases=("dual_chunk", "dual_chunk_attention", "chunkllama"), uses_factor=False,
    params={"chunk_size": None, "local_window": None, "max_position_embeddings": None}, check=_check_dca,
    tune_grid=lambda L, T, factors: [{"chunk_size": s, "local_window": w} for s in (3 * L // 4, L // 2)
                                     for w in (L // 16, L // 8)]),
    _dca_defaults, lambda p, L: M.DualChunk(p["chunk_size"], p["local_window"]), any_rope=True,
    dual_chunk=_dca_block)
