"""The RoPE scalings, one record each: knobs, defaults and checks (its :class:`MethodSpec`), and what the
adapter needs (:class:`RopeScaling`): the frequency function, whether and how it follows the length, its native
transformers ``rope_parameters`` (or None), knob defaults that depend on the model, and the new
``max_position_embeddings``. Adding a scaling: its math in ``encodings/rope.py``, one ``register_scaling`` call here, a
test.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

from ..encodings import rope as R
from .spec import (
    MAX_ATTENTION_FACTOR,
    MAX_FACTOR,
    MAX_KNOB,
    EngineSupport,
    MethodSpec,
    check_layer_types,
    factor_grid,
    on_unregister,
    positive_number,
    register_method,
)

_ROTATIONS = " (rotations of a frequency within the original context)"
_TEMPERATURE = " (it scales the rotary cos and sin, so every attention score by its square)"


def _check_yarn(factor: float, p: dict[str, Any]) -> None:
    positive_number("beta_fast", p["beta_fast"], most=MAX_KNOB, meaning=_ROTATIONS)
    positive_number("beta_slow", p["beta_slow"], most=MAX_KNOB, meaning=_ROTATIONS)
    if p["beta_fast"] <= p["beta_slow"]:
        raise ValueError(f"beta_fast must be greater than beta_slow, got beta_fast={p['beta_fast']}, "
                         f"beta_slow={p['beta_slow']}.")
    for key in ("attention_factor", "attn_factor"):
        if key in p:
            positive_number(key, p[key], allow_none=True, most=MAX_ATTENTION_FACTOR, meaning=_TEMPERATURE)
    for key in ("mscale", "mscale_all_dim"):
        if key in p:
            positive_number(key, p[key], allow_none=True, most=MAX_KNOB)
    if "truncate" in p and not isinstance(p["truncate"], bool):
        raise ValueError(f"truncate must be True or False, got {p['truncate']!r}.")
    if "finetuned" in p and not isinstance(p["finetuned"], bool):
        raise ValueError(f"finetuned must be True or False, got {p['finetuned']!r}.")


def _check_cache(p: dict[str, Any]) -> None:
    if p["cache"] not in CACHE_MODES:
        raise ValueError(f"cache must be one of {list(CACHE_MODES)} (what happens to the KV cache when the frequencies "
                         f"change while generating), got {p['cache']!r}.")


def _check_llama3(factor: float, p: dict[str, Any]) -> None:
    positive_number("low_freq_factor", p["low_freq_factor"], most=MAX_KNOB)
    positive_number("high_freq_factor", p["high_freq_factor"], most=MAX_KNOB)
    if p["high_freq_factor"] <= p["low_freq_factor"]:
        raise ValueError(
            f"high_freq_factor must be greater than low_freq_factor, got high_freq_factor={p['high_freq_factor']}, "
            f"low_freq_factor={p['low_freq_factor']}."
        )


def _check_longrope(factor: float, p: dict[str, Any]) -> None:
    for key in ("short_factor", "long_factor"):
        value = p[key]
        if value is None:
            continue
        if not isinstance(value, (list, tuple)) or not value:
            raise ValueError(f"{key} must be a non-empty list of numbers > 0 (one per rotary frequency), "
                             f"got {value!r}.")
        for x in value:
            positive_number(f"every entry of {key}", x, most=MAX_FACTOR)
    positive_number("attention_factor", p["attention_factor"], allow_none=True, most=MAX_ATTENTION_FACTOR,
                    meaning=_TEMPERATURE)


# Length-dependent scalings recompute their frequencies in the forward pass and take the knob ``cache``:
# "stale" (transformers' behaviour: cached keys keep the rotation they were stored with), "consistent" (cached
# keys are re-rotated when the frequencies change; several times closer to recomputing than stale, not equal,
# since deeper layers' cached keys and values stay those of shorter lengths) or "exact" (generate encodes the
# sequence again whenever the frequencies change: equal to recomputing, a forward over the sequence per step past
# the original context;
# a hand-written cached loop is re-rotated and warned once); hf_posenc.adapters.consistent_cache. In every mode
# each row's frequencies follow its own length, never the batch's padded length nor an earlier call.
CACHE_MODES = ("stale", "consistent", "exact")
DEFAULT_CACHE = "consistent"  # measured within 1.3x of "stale" per decoded token (BENCHMARKS.md)


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """What the RoPE adapter needs of one scaling.

    ``frequencies(geom, factor, params, seq_len, device) -> (inv_freq, attention_scaling)`` (``encodings.rope``);
    ``dynamic``: None (fixed), ``"grow"`` (each row's frequencies follow its own length past the
    original context, as transformers' dynamic types follow the batch's) or ``"switch"`` (a short and a long set,
    picked per row: LongRoPE);
    ``native(factor, original, params, geom) -> dict`` the transformers ``rope_parameters`` it equals (without
    ``rope_theta`` unless it rewrites it), None when transformers has no such type; ``defaults(params, half,
    factor) -> params`` fills knobs whose defaults depend on the model (``half`` = rotary dim / 2);
    ``keeps_max_position``: ``max_position_embeddings`` stays the original length (else factor x original);
    ``compose(own, context, factor, params) -> (inv_freq, attention)``: the method on top of a checkpoint's own
    scaled frequencies (``encodings.rope.compose_*``), None where it is not put on top of another scaling;
    ``per_dimension``: its knobs state each dimension's factor of the base frequencies outright, so over a scaled
    checkpoint's current context it restates that checkpoint's frequencies (a composed configuration, re-applied on
    load) rather than scaling them again;
    ``follows_length``: for a length-dependent scaling, how its positions depend on the length of the sequence seen
    (the reason it is refused under context parallelism, where each process sees a shard);
    ``freeze(factor, original, params, at) -> (factor, params)``: the static scaling ``freezes_to`` equal to it at
    ``at`` tokens (``hf-posenc patch --freeze-at``), None for a static one; ``unchanged_within_original(params)``:
    frozen at or below the original context it is the unpatched model;
    ``gguf(factor, original, params, geom) -> (metadata, rope_freqs)``: the RoPE metadata llama.cpp computes it
    from (short key names: type, factor, original, base, attn_factor) and the per-dimension frequency divisors of
    a ``rope_freqs`` tensor (float64, or None; ``gguf_freqs``: it writes one); None where a GGUF cannot hold it,
    ``gguf_refusal`` saying why (``{name}`` and ``{architectures}`` filled in);
    ``gguf_check(params, arch) -> reason | None``: knob values llama.cpp computes otherwise for ``arch``;
    ``gguf_any_check(params) -> reason | None``: knob values no GGUF holds, whatever its architecture."""

    frequencies: Callable[..., tuple[Any, float]]
    native: Callable[..., dict[str, Any]] | None = None
    dynamic: str | None = None
    defaults: Callable[[dict[str, Any], int, float], dict[str, Any]] | None = None
    keeps_max_position: bool = False
    compose: Callable[..., tuple[Any, float]] | None = None
    per_dimension: bool = False
    follows_length: str = ""
    freeze: Callable[[float, int, dict[str, Any], int], tuple[float, dict[str, Any]]] | None = None
    freezes_to: str = ""
    unchanged_within_original: Callable[[dict[str, Any]], bool] | None = None
    gguf: Callable[..., tuple[dict[str, Any], Any]] | None = None
    gguf_freqs: bool = False
    gguf_refusal: str = ""
    gguf_check: Callable[[dict[str, Any], str], str | None] | None = None
    gguf_any_check: Callable[[dict[str, Any]], str | None] | None = None

    def max_position(self, factor: float, original: int) -> int:
        return original if self.keeps_max_position else int(math.ceil(factor * original))

    def computed(self, geom: R.RopeGeometry, factor: float, params: dict[str, Any], seq_len: int | None = None,
                 device=None) -> tuple[Any, float]:
        """(inv_freq, attention_scaling) of this scaling on ``geom``: :attr:`frequencies`, with the pairs that a
        proportional RoPE keeps still (``geom.turning``) still."""
        inv_freq, attention = self.frequencies(geom, factor, params, seq_len=seq_len, device=device)
        return R.still_pairs(inv_freq, geom), attention


SCALINGS: dict[str, RopeScaling] = {}
# the names of the length-dependent scalings (cells of an evaluation start them from a fresh state)
DYNAMIC: set[str] = set()


def register_scaling(spec: MethodSpec, scaling: RopeScaling) -> MethodSpec:
    """Register a RoPE scaling: its record (knobs, checks, engines) and what the RoPE adapter needs of it; every
    scaling takes ``layer_types``, a length-dependent one ``cache``. Returns the registered record
    (:func:`hf_posenc.methods.unregister_method` removes it)."""
    if spec.kind == "rope":  # every scaling takes layer_types: which RoPE of a per-layer-type model it changes
        own, dynamic = spec.check, scaling.dynamic is not None

        def check(factor: float, p: dict[str, Any]) -> None:
            check_layer_types(p["layer_types"])
            if dynamic:
                _check_cache(p)
            if own is not None:
                own(factor, p)

        extra = {"layer_types": None, **({"cache": DEFAULT_CACHE} if dynamic else {})}
        spec = dataclasses.replace(spec, params={**spec.params, **extra}, check=check)
    register_method(spec)
    SCALINGS[spec.name] = scaling
    if scaling.dynamic:
        DYNAMIC.add(spec.name)
    return spec


def _forget(name: str) -> None:
    SCALINGS.pop(name, None)
    DYNAMIC.discard(name)


on_unregister(_forget)


def _floats(p: dict[str, Any], *keys: str) -> dict[str, float]:
    return {k: float(p[k]) for k in keys if p.get(k) is not None}


def _native_yarn(s: float, L: int, p: dict[str, Any], geom) -> dict[str, Any]:
    return {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L, "truncate": p["truncate"],
            **_floats(p, "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim")}


def _native_longrope(s: float, L: int, p: dict[str, Any], geom) -> dict[str, Any]:
    """transformers' longrope; an ``attention_factor`` other than the one vLLM derives from the advertised context
    (sqrt(1 + ln s / ln L)) is also written as ``short_mscale`` / ``long_mscale``, which vLLM reads instead."""
    out = {"rope_type": "longrope", "factor": s, "original_max_position_embeddings": L,
           "short_factor": [float(x) for x in p["short_factor"]], "long_factor": [float(x) for x in p["long_factor"]],
           **_floats(p, "attention_factor")}
    derived = R.longrope_attention_factor(math.ceil(s * L) / L, L)  # vLLM's, from max_position_embeddings / L
    if p.get("attention_factor") is not None and not math.isclose(float(p["attention_factor"]), derived,
                                                                 rel_tol=1e-9):
        out["short_mscale"] = out["long_mscale"] = float(p["attention_factor"])
    return out


def _longrope_defaults(params: dict[str, Any], half: int, factor: float) -> dict[str, Any]:
    """LongRoPE's lists default to PI-like uniform ones (short: 1, long: factor), one entry per frequency."""
    params = {**params, "short_factor": list(params["short_factor"] or [1.0] * half),
              "long_factor": list(params["long_factor"] or [factor] * half)}
    for key in ("short_factor", "long_factor"):
        if len(params[key]) != half:
            raise ValueError(f"{key} must have {half} entries (rotary dim / 2) for this model, got {len(params[key])}.")
    return params


# measured on this project's machine (scripts/bench_serving.py, BENCHMARKS.md): SmolLM2-135M checkpoints saved by
# `hf-posenc patch`, serve-check at 4,096 and 12,288 tokens, vLLM 0.32 (CPU build) vs hf_posenc.from_pretrained;
# ntk is plain RoPE with another rope_theta (rope_type default), which the none row measures
VLLM_SAME = {"vLLM": EngineSupport("same", "measured by hf-posenc serve-check on SmolLM2-135M at 4,096 and 12,288 "
                                           "tokens (none: 4,096; vLLM refuses past its 8,192), vLLM 0.32 (CPU): mean "
                                           "NLL within 6e-5 relative")}
# measured by scripts/bench_serving.py --engine llama.cpp (BENCHMARKS.md): SmolLM2-135M checkpoints saved by
# `hf-posenc patch`, converted by llama.cpp's convert_hf_to_gguf.py (f32), serve-check at 4,096 and 12,288 tokens,
# llama-cpp-python 0.3.36 (CPU); pi and yarn also by tests/test_llama_cpp.py (original context stated as 512)
LLAMA_CPP_SAME = {"llama.cpp": EngineSupport("same", "measured by hf-posenc serve-check on SmolLM2-135M at 4,096 and "
                                                     "12,288 tokens, converted by llama.cpp's convert_hf_to_gguf.py "
                                                     "(f32), llama-cpp-python 0.3.36 (CPU): mean NLL within 7e-5 "
                                                     "relative")}


# measured by hf-posenc serve-check: a tiny longrope with its own temperature (tests/test_vllm.py), and SmolLM2-135M
# given llama3 x2, then yarn x2 on top (scripts/bench_serve_composed.py), vLLM 0.32 (CPU build)
VLLM_LONGROPE = {"vLLM": EngineSupport(
    "differs",
    "measured by hf-posenc serve-check: vLLM picks longrope's short or long factors once, by --max-model-len, for "
    "every input (transformers switches per input), with the temperature of short_mscale / long_mscale, which "
    "hf_posenc writes: by default (its maximum length the switch L) the same as hf_posenc for every input it takes; "
    "with --max-model-len past L the same past L only (SmolLM2-135M given llama3 x2 then yarn x2: the same at 8,192 "
    "by default and at 24,576 with --max-model-len 24,577, which differs at 8,192), vLLM 0.32 (CPU); serve-config "
    "says which inputs a launch matches",
    caveat="vLLM picks longrope's short or long factors once by --max-model-len")}


def _yarn_grid(original: int, target: int, factors: list[float]) -> list[dict[str, Any]]:
    return [{"factor": f, "attention_factor": a, "beta_fast": b} for f in factors for a in (None, 1.0)
            for b in (32.0, 16.0)]


def _dynamic_yarn_grid(original: int, target: int, factors: list[float]) -> list[dict[str, Any]]:
    return [{"factor": f, "beta_fast": b} for f in factors for b in (32.0, 16.0)]


def _gguf_plain(s: float, L: int, p: dict[str, Any], geom) -> tuple[dict[str, Any], Any]:
    return {}, None


def _gguf_yarn(s: float, L: int, p: dict[str, Any], geom) -> tuple[dict[str, Any], Any]:
    out: dict[str, Any] = {"type": "yarn", "factor": s, "original": L}
    _, attention = R.rope_yarn(geom, s, p)
    ratio = float(attention) / R.yarn_mscale(s)  # llama.cpp's own temperature times this
    if abs(ratio - 1.0) > 1e-7:
        out["attn_factor"] = ratio
    return out, None


LLAMA_CPP_YARN_BETAS = (32.0, 1.0)  # llama.cpp's yarn_beta_fast / yarn_beta_slow when the architecture reads no key


def _gguf_check_yarn(p: dict[str, Any], arch: str) -> str | None:
    if (float(p["beta_fast"]), float(p["beta_slow"])) != LLAMA_CPP_YARN_BETAS:
        return (f"yarn with beta_fast={p['beta_fast']:g}, beta_slow={p['beta_slow']:g}: llama.cpp reads the "
                f"yarn_beta_* keys for a few other architectures only, and computes {arch} with 32 and 1")
    if not p.get("truncate", True):
        return "yarn with truncate=False: llama.cpp's ramp bounds are always floored and ceiled (truncate=True)"
    return None


def _gguf_llama3(s: float, L: int, p: dict[str, Any], geom) -> tuple[dict[str, Any], Any]:
    scaled, _ = R.rope_llama3(geom, s, p)
    return {}, R.default_inv_freq(geom.base, geom.dim).double() / scaled.double()


def _gguf_longrope(s: float, L: int, p: dict[str, Any], geom) -> tuple[dict[str, Any], Any]:
    """A longrope whose two lists are one (frozen): its factors divide the frequencies as ``rope_freqs`` does, and
    its temperature multiplies the rotary cos and sin as llama.cpp's ``attn_factor`` does outside YaRN."""
    if len(p["long_factor"]) != geom.dim // 2:
        raise ValueError(f"cannot write longrope into a GGUF: its factor lists have {len(p['long_factor'])} entries, "
                         f"and this model's rotary dimension {geom.dim} has {geom.dim // 2} frequencies")
    _, attention = R.rope_longrope(geom, s, p, seq_len=None)
    meta = {"attn_factor": float(attention)} if abs(float(attention) - 1.0) > 1e-7 else {}
    return meta, torch.tensor(p["long_factor"], dtype=torch.float64)


def _gguf_check_longrope(p: dict[str, Any]) -> str | None:
    short, long = p.get("short_factor"), p.get("long_factor")
    if short is None or long is None or list(short) != list(long):  # unset lists default to 1s and the factor
        return ("longrope switches from its short to its long factors by the length of each input, and a GGUF holds "
                "one set (rope_freqs): freeze it with --freeze-at N (the set of inputs of N tokens)")
    return None


_NO_DYNAMIC_GGUF = ("llama.cpp has no {name}: its frequencies follow the length of each input, and a GGUF holds "
                    "fixed ones; freeze it with --freeze-at N (the static configuration equal to it at N tokens)")


def _freeze_dynamic_ntk(s: float, L: int, p: dict[str, Any], at: int) -> tuple[float, dict[str, Any]]:
    return R.dynamic_ntk_alpha(s, at, L), {}


def _freeze_dynamic_yarn(s: float, L: int, p: dict[str, Any], at: int) -> tuple[float, dict[str, Any]]:
    scale = R.dynamic_yarn_scale(R.RopeGeometry(1.0, 2, L), s, p, at)
    attention = None if p["attn_factor"] == 1.0 else float(R.yarn_mscale(scale) * p["attn_factor"])
    return scale, {"beta_fast": p["beta_fast"], "beta_slow": p["beta_slow"], "attention_factor": attention,
                           "truncate": True}


def _freeze_longrope(s: float, L: int, p: dict[str, Any], at: int) -> tuple[float, dict[str, Any]]:
    """The list of inputs of ``at`` tokens for every length. Frozen at or below L (the short list, trained for inputs
    up to L), the factor becomes 1, so that the model advertises L, not s x L; its attention factor, which the factor
    derives when none is given, is then stated."""
    chosen = p["long_factor" if at > L else "short_factor"]
    if chosen is None:
        raise ValueError("freezing longrope needs its short_factor and long_factor lists; give them, or freeze a model "
                         "(hf_posenc.serving.freezing.freeze fills the default ones for it).")
    attention = p["attention_factor"]
    if at <= L:
        attention = R.longrope_attention_factor(s, L) if attention is None else attention
        s = 1.0
    return s, {"cache": p["cache"], "short_factor": list(chosen), "long_factor": list(chosen),
               "attention_factor": attention}


# "none" is its own kind: every adapter takes it (the unchanged model, as a baseline)
register_scaling(MethodSpec("none", "none", "No change: the checkpoint's own positions (a baseline).",
                uses_factor=False, engines={**VLLM_SAME, **LLAMA_CPP_SAME}),
     RopeScaling(R.rope_none, native=lambda s, L, p, g: {"rope_type": "default"}, gguf=_gguf_plain))
register_scaling(MethodSpec("pi", "rope", "Position interpolation: every frequency divided by factor "
                            "(Chen et al. 2023).",
                aliases=("linear",), tune_grid=factor_grid, engines={**VLLM_SAME, **LLAMA_CPP_SAME}),
     RopeScaling(R.rope_linear, native=lambda s, L, p, g: {"rope_type": "linear", "factor": s},
                 compose=R.compose_linear, gguf=lambda s, L, p, g: ({"type": "linear", "factor": s}, None)))
register_scaling(MethodSpec("ntk", "rope", "Static NTK-aware scaling: rope_theta' = rope_theta * factor^(d/(d-2)).",
                aliases=("ntk_aware", "static_ntk"), tune_grid=factor_grid, engines={**VLLM_SAME, **LLAMA_CPP_SAME}),
     RopeScaling(R.rope_ntk, compose=R.compose_ntk,
                 native=lambda s, L, p, g: {"rope_type": "default", "rope_theta": R.ntk_base(g.base, g.dim, s)},
                 gguf=lambda s, L, p, g: ({"base": R.ntk_base(g.base, g.dim, s)}, None)))
register_scaling(MethodSpec("dynamic_ntk", "rope", "Dynamic NTK: the base grows with the current length once it "
                            "exceeds the original context.",
                aliases=("dynamic",), tune_grid=factor_grid,
                engines={"vLLM": EngineSupport("within_original", "measured by hf-posenc serve-check on SmolLM2-135M "
                                               "x2, vLLM 0.32 (CPU): same at 4,096 tokens, NaN log-probabilities at "
                                               "12,288 (vLLM computes dynamic NTK once, for its maximum length, not "
                                               "per call: vLLM issue #5093)",
                                               caveat="vLLM computes dynamic NTK once, for its maximum length, not "
                                                      "per call (vLLM issue #5093)"),
                         "llama.cpp": EngineSupport("within_original", "llama.cpp has no dynamic NTK: its converter "
                                                    "(convert_hf_to_gguf.py) writes no scaling for rope_type dynamic, "
                                                    "so the GGUF is plain RoPE, the same up to the original context",
                                                    caveat="llama.cpp has no dynamic NTK (its converter writes plain "
                                                           "RoPE for rope_type dynamic): freeze it first "
                                                           "(hf-posenc patch --freeze-at N)")}),
     # transformers reads the original length of its dynamic type from max_position_embeddings: it stays
     RopeScaling(R.rope_dynamic_ntk, native=lambda s, L, p, g: {"rope_type": "dynamic", "factor": s}, dynamic="grow",
                 keeps_max_position=True, follows_length="its base grows with the length of the sequence seen",
                 freeze=_freeze_dynamic_ntk, freezes_to="ntk", unchanged_within_original=lambda p: True,
                 gguf_refusal=_NO_DYNAMIC_GGUF))
register_scaling(MethodSpec("yarn", "rope", "YaRN: NTK-by-parts interpolation plus attention temperature "
                            "(Peng et al. 2023).",
                params={"beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None, "mscale": None,
                        "mscale_all_dim": None, "truncate": True},
                check=_check_yarn, tune_grid=_yarn_grid, engines={**VLLM_SAME, **LLAMA_CPP_SAME}),
     RopeScaling(R.rope_yarn, native=_native_yarn, compose=R.compose_yarn, gguf=_gguf_yarn,
                 gguf_check=_gguf_check_yarn))
register_scaling(MethodSpec("dynamic_yarn", "rope", "Dynamic YaRN: YaRN with scale = current length / original "
                            "context (jquesnelle/yarn).",
                params={"beta_fast": 32.0, "beta_slow": 1.0, "attn_factor": 1.0, "finetuned": False},
                check=_check_yarn, tune_grid=_dynamic_yarn_grid),
     RopeScaling(R.rope_dynamic_yarn, dynamic="grow",
                 follows_length="its scale is the length of the sequence seen over the original context",
                 freeze=_freeze_dynamic_yarn, freezes_to="yarn",
                 unchanged_within_original=lambda p: not p.get("finetuned"),
                 gguf_refusal=_NO_DYNAMIC_GGUF))
register_scaling(MethodSpec("llama3", "rope", "Llama 3.1 wavelength-band smoothing of PI.",
                params={"low_freq_factor": 1.0, "high_freq_factor": 4.0}, check=_check_llama3,
                tune_grid=factor_grid, engines={**VLLM_SAME, **LLAMA_CPP_SAME}),
     RopeScaling(R.rope_llama3, native=lambda s, L, p, g: {"rope_type": "llama3", "factor": s,
                                                            "original_max_position_embeddings": L,
                                                            **_floats(p, "low_freq_factor", "high_freq_factor")},
                 compose=R.compose_llama3, gguf=_gguf_llama3, gguf_freqs=True))
register_scaling(MethodSpec("longrope", "rope", "LongRoPE per-dimension rescale factors (short/long lists; default: "
                            "PI-like uniform lists).",
                params={"short_factor": None, "long_factor": None, "attention_factor": None},
                check=_check_longrope, tune_grid=factor_grid, engines=VLLM_LONGROPE),
     RopeScaling(R.rope_longrope, native=_native_longrope, dynamic="switch", defaults=_longrope_defaults,
                 compose=R.compose_longrope, per_dimension=True,
                 follows_length="it picks its short or long factors by the length of the sequence seen",
                 freeze=_freeze_longrope, freezes_to="longrope",
                 gguf=_gguf_longrope, gguf_any_check=_gguf_check_longrope, gguf_freqs=True))
