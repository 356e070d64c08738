"""The candidates ``hf-posenc tune`` measures: a grid derived from the model and the target length, or a file.

With L the original context, T the target length and F = T / L, the factors tried are F, 1.5 F and 2 F
(each rounded up to a multiple of 0.5). Each method's grid is its record's ``tune_grid(L, T, factors)``
(:class:`hf_posenc.methods.MethodSpec`, written beside its knobs in ``methods/rope.py`` and ``methods/remapped.py``):
the factors alone for pi, ntk, dynamic_ntk, llama3 and longrope; factor x attention_factor (default, 1.0) x beta_fast
(32, 16) for yarn; self_extend's window (L/4, L/2) x the least group size that reaches T and twice it; and so on.
A method whose record has no grid is not tuned (``--space FILE`` can still give its candidates).

``--method-param`` knobs are fixed for every candidate of a method that takes them (the grid does not vary
them). ``--space FILE`` replaces the grid: a JSON list of variants (``"LABEL=METHOD:K=V,..."`` strings or
``{"label", "method", "factor", "params"}`` objects), or an object ``{METHOD: {KNOB: [values, ...]}}`` whose
products are the candidates (``factor`` among the knobs).
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

from ..config import PosEncConfig, checked
from ..config_syntax import fields_text
from ..eval.variants import LABEL, Variant, check_labels, parse_variant
from ..methods import METHODS, resolve_method

DEFAULT_METHODS = ("yarn", "dynamic_ntk", "dynamic_yarn", "self_extend", "dca", "string")


BASELINE = Variant("none", PosEncConfig("none"))  # the unpatched model every search measures beside its candidates


def yarn_reference(factor: float, pinned: int | None) -> Variant:
    """YaRN with its default knobs at ``factor`` (``pinned``: the original context every candidate is given): what a
    search's winner is confirmed beside."""
    config = PosEncConfig("yarn", factor, pinned)
    return Variant(f"reference-yarn-factor_{config.factor:g}", config)


def _half_up(x: float) -> float:
    return max(1.0, math.ceil(x * 2 - 1e-9) / 2)


def factors(original: int, target: int) -> list[float]:
    f = target / original
    return sorted({_half_up(f), _half_up(1.5 * f), _half_up(2 * f)})


def check_methods(methods: list[str]) -> list[str]:
    """The canonical names of ``methods``; an error for one with no grid."""
    names = [resolve_method(m).name for m in methods]
    for name in names:
        if resolve_method(name).tune_grid is None:
            gridded = ", ".join(sorted(n for n, spec in METHODS.items() if spec.tune_grid is not None))
            raise ValueError(f"tune has no grid for method {name!r}; grids exist for {gridded}; or give --space FILE")
    return names


def check_pinned(methods: list[str], fixed: dict[str, dict[str, Any]]) -> None:
    """Each method's fixed knobs (``{"*"|METHOD: {knob: value}}``) checked as a config of it checks them, before
    any model is loaded (the defaults that depend on the model are checked once it is)."""
    for name in check_methods(methods):
        spec = resolve_method(name)
        knobs = {**{k: v for k, v in fixed.get("*", {}).items() if k in spec.params}, **fixed.get(name, {})}
        factor = knobs.pop("factor", None)
        try:
            PosEncConfig(name, factor if factor is not None else (2.0 if spec.uses_factor else None), params=knobs)
        except ValueError as err:
            raise ValueError(f"--method-param for {name}: {err}") from None


def method_grid(method: str, original: int, target: int) -> list[dict[str, Any]]:
    """The knob sets (``factor`` among them for methods that take one) tried for ``method``."""
    check_methods([method])
    return resolve_method(method).tune_grid(original, target, factors(original, target))


def _fmt(value: Any) -> str:
    return "default" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _variant(method: str, knobs: dict[str, Any], fixed: dict[str, Any]) -> Variant:
    spec = resolve_method(method)
    knobs = {**knobs, **{k: v for k, v in fixed.items() if k in spec.params}}
    factor = knobs.pop("factor", None)
    varied = ([("factor", factor)] if factor else []) + sorted((k, v) for k, v in knobs.items() if k not in fixed)
    label = "-".join([spec.name, *(f"{k}_{_fmt(v)}" for k, v in varied)])
    params = {k: v for k, v in knobs.items() if v is not None}
    return Variant(label, PosEncConfig(spec.name, factor if spec.uses_factor else None, params=params))


def grid_candidates(methods: list[str], original: int, target: int,
                    fixed: dict[str, dict[str, Any]] | None = None) -> list[Variant]:
    """Every candidate of the documented grid for ``methods`` (``fixed``: ``{"*"|METHOD: {knob: value}}``)."""
    if target <= original:
        raise ValueError(f"--target-length {target} is within the model's original context ({original}): there is "
                         "nothing to extend; give a target beyond it")
    fixed = fixed or {}
    out: dict[str, Variant] = {}
    for method in methods:
        name = resolve_method(method).name
        pinned = {**fixed.get("*", {}), **fixed.get(name, {})}
        for knobs in method_grid(name, original, target):
            v = _variant(name, knobs, pinned)
            out.setdefault(v.label, v)  # a pinned knob collapses the grid along it
    return check_labels(list(out.values()))


def _from_object(item: Any, where: str) -> Variant:
    if isinstance(item, str):
        return parse_variant(item)
    if isinstance(item, dict) and {"label", "method"} <= set(item):
        unknown = sorted(set(item) - {"label", "method", "factor", "original_max_position_embeddings", "params"})
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; a candidate has label, method, factor, params")
        if not isinstance(item["label"], str) or not LABEL.fullmatch(item["label"]):
            raise ValueError(f"{where}: a label is letters, digits and _.+-, got {item['label']!r}")
        if not isinstance(item.get("params") or {}, dict):
            raise ValueError(f"{where} ({item['label']}): params must be an object of the method's knobs "
                             f"(e.g. {{\"beta_fast\": 16}}), got {item['params']!r}")
        try:
            config = checked(fields_text(item), item["method"], item.get("factor"),
                             item.get("original_max_position_embeddings"), dict(item.get("params") or {}))
        except ValueError as err:
            raise ValueError(f"{where} ({item['label']}): {err}") from None
        return Variant(item["label"], config)
    raise ValueError(f"{where}: a candidate is 'LABEL=METHOD:K=V,...' or {{\"label\", \"method\", \"factor\", "
                     f"\"params\"}}, got {item!r}")


def load_space(path: str) -> list[Variant]:
    """The candidates of a ``--space`` JSON file (see the module docstring)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as err:
        raise ValueError(f"--space {path}: cannot read it ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--space {path}: not JSON ({err.msg} at line {err.lineno})") from None
    if isinstance(data, list):
        return check_labels([_from_object(item, f"--space {path}, item {i}") for i, item in enumerate(data)])
    if isinstance(data, dict):
        out = []
        for method, knobs in data.items():
            if not isinstance(knobs, dict) or not all(isinstance(v, list) and v for v in knobs.values()):
                raise ValueError(f"--space {path}: {method!r} must map each knob to a non-empty list of values, "
                                 f"got {knobs!r}")
            for values in itertools.product(*knobs.values()):
                out.append(_variant(method, dict(zip(knobs, values)), {}))
        return check_labels(out)
    raise ValueError(f"--space {path}: expected a JSON list of candidates or an object METHOD -> knob lists")
