"""The record of a method (:class:`MethodSpec`, what engines compute for it: :class:`EngineSupport`), the registry
the method modules add theirs to, and the checks of their knobs; :mod:`hf_posenc.methods` re-exports them."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

REQUIRED = object()  # marks a parameter without default


ENGINE_COMPUTES = ("same", "within_original", "differs")  # what a serving engine is known to compute for a method


@dataclass(frozen=True)
class EngineSupport:
    """What one serving engine computes for a checkpoint saved with a method, and how that is known.

    computes: ``same`` (the engine computes hf_posenc's numbers: measured), ``within_original`` (the same up to
    the model's original context, not past it) or ``differs`` (measured to compute something else: not served).
    basis: the measurement or the reason, as a card prints it.
    caveat: for ``within_original``, why it differs past the original context, in a phrase (an evaluation on that
    engine refuses the method with it).
    A method with no entry for an engine: not measured there (a native method's engine reads the fields
    transformers reads; a method that is not native has no implementation in any engine)."""

    computes: str
    basis: str
    caveat: str = ""

    def __post_init__(self) -> None:
        if self.computes not in ENGINE_COMPUTES:
            raise ValueError(f"EngineSupport.computes must be one of {ENGINE_COMPUTES}, got {self.computes!r}")


def factor_grid(original: int, target: int, factors: list[float]) -> list[dict[str, Any]]:
    """The tune grid of a method whose only knob that matters is its factor: each of ``factors``."""
    return [{"factor": f} for f in factors]


@dataclass(frozen=True)
class MethodSpec:
    """One method. ``params`` maps each knob the method takes to its default (or ``REQUIRED``);
    ``check`` validates the resolved params and raises ValueError; ``uses_factor`` says whether
    ``factor`` means something to the method. ``tune_grid(L, T, factors)``: the knob sets ``hf-posenc tune`` tries
    to reach target length T from the original context L (``factors``: the factors tried, derived from T / L;
    None: the method is not tuned). ``engines``: what the serving engines compute for it (:class:`EngineSupport`,
    by engine name as :data:`hf_posenc.serving.support.ENGINES` spells it)."""

    name: str
    kind: str  # which adapters may take it: "rope", "learned", "relative_bucket", ...
    summary: str
    aliases: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    uses_factor: bool = True
    check: Callable[[float, dict[str, Any]], None] | None = None
    default_factor: float | None = None  # the factor when none is given (None: a factor is required)
    tune_grid: Callable[[int, int, list[float]], list[dict[str, Any]]] | None = None
    engines: dict[str, EngineSupport] = field(default_factory=dict)
    positions_by_id: bool = False  # a swap whose positions come from each token's own position id alone
    own_attention: bool = False  # a swap that brings its own attention function (ALiBi's biases)


METHODS: dict[str, MethodSpec] = {}
_ALIASES: dict[str, str] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add ``spec`` to the registry under its name and aliases (a name another method holds is refused); a RoPE
    scaling registers through :func:`hf_posenc.methods.rope.register_scaling`, which calls this."""
    for key in (spec.name, *spec.aliases):
        owner = _ALIASES.get(key)
        if owner is not None and owner != spec.name:
            raise ValueError(f"method name {key!r} is already taken by {owner!r}")
        _ALIASES[key] = spec.name
    METHODS[spec.name] = spec
    return spec


_FORGET: list[Callable[[str], None]] = []  # what each kind's module removes of an unregistered method


def on_unregister(forget: Callable[[str], None]) -> None:
    """``forget(name)`` is called when a method is unregistered (a kind's own tables: the RoPE scalings')."""
    _FORGET.append(forget)


def unregister_method(name: str) -> None:
    """Remove a registered method, its aliases and every kind's table entry for it (a plugin's or a test's)."""
    spec = resolve_method(name)
    METHODS.pop(spec.name, None)
    for key in [k for k, owner in _ALIASES.items() if owner == spec.name]:
        del _ALIASES[key]
    for forget in _FORGET:
        forget(spec.name)


def resolve_method(name: str) -> MethodSpec:
    """The spec for ``name`` or an alias of it; a ValueError with a did-you-mean otherwise."""
    if not isinstance(name, str):
        raise ValueError(f"method must be a string, got {name!r} ({type(name).__name__})")
    key = name.strip().lower().replace("-", "_")
    if key in _ALIASES:
        return METHODS[_ALIASES[key]]
    close = difflib.get_close_matches(key, list(_ALIASES), n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown method {name!r}.{hint} Known methods: {', '.join(sorted(METHODS))}.")


MIN_ORIGINAL_CONTEXT = 16  # a trained context below this is a typo (1 divides by log 1 in longrope, yarn)
MAX_FACTOR = 1024.0  # 4k x 1024 = 4M tokens; beyond it the frequencies underflow and lengths overflow
DEFAULT_FACTOR = 2.0  # the commands' --factor when not given, for a method that takes one (the Python API asks)


def check_factor(method: str, factor: Any, uses_factor: bool) -> float:
    if not uses_factor:
        if factor not in (None, 1, 1.0):
            raise ValueError(f"method {method!r} takes no factor (got factor={factor!r}); leave it unset.")
        return 1.0
    if factor is None:
        raise ValueError(f"method {method!r} needs a factor (a finite number >= 1, e.g. factor=2.0).")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise ValueError(f"factor must be a number >= 1, got {factor!r} ({type(factor).__name__}).")
    if not math.isfinite(factor) or not 1 <= factor <= MAX_FACTOR:
        raise ValueError(f"factor must be a number from 1 to {MAX_FACTOR:g}, got {factor!r}.")
    return float(factor)


def resolve_params(spec: MethodSpec, factor: float, params: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults, reject unknown and missing knobs, then run the method's own checks."""
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        allowed = ", ".join(sorted(spec.params)) or "none"
        raise ValueError(f"method {spec.name!r} does not take parameter(s) {unknown}; it takes: {allowed}.")
    out = {}
    for key, default in spec.params.items():
        value = params.get(key, default)
        if value is REQUIRED:
            raise ValueError(f"method {spec.name!r} needs parameter {key!r}.")
        out[key] = value
    if spec.check is not None:
        spec.check(factor, out)
    return out


def check_layer_types(value: Any) -> None:
    """``layer_types`` (RoPE scalings, ``nope``): None, or the layer types of a per-layer-type RoPE model."""
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"layer_types must be a non-empty list of layer-type names (e.g. ['full_attention']), got "
                         f"{value!r}.")


def positive_number(name: str, value: Any, allow_none: bool = False, most: float | None = None,
                    meaning: str = "") -> None:
    """A finite number > 0 (and <= ``most`` when given: past it the knob means nothing and the arithmetic
    overflows); ``meaning`` says what the knob does, in the error."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0{meaning}, got {value!r}.")
    if most is not None and value > most:
        raise ValueError(f"{name} must be a number from 0 (excluded) to {most:g}{meaning}, got {value!r}.")


MAX_ATTENTION_FACTOR = 10.0  # a temperature that multiplies every attention score by up to 100
MAX_KNOB = 1e6  # rotations (YaRN's betas), frequency-band factors, leaks: far past any meaningful value
