"""The candidates ``hf-posenc tune`` measures: a grid derived from the model and the target length, or a file.

With L the original context, T the target length and F = T / L, the factors tried are F, 1.5 F and 2 F
(each rounded up to a multiple of 0.5). Per method:

============== =====================================================================================
pi, ntk,       factor
dynamic_ntk,
llama3
yarn           factor x attention_factor (YaRN's default 0.1 ln(factor) + 1, or 1.0) x beta_fast (32, 16)
dynamic_yarn   factor x beta_fast (32, 16)
self_extend    window (L/4, L/2, rounded to the group) x group_size (the least that reaches T, and twice
               that): grouped positions stay below L when (T - window) / group_size + window < L
dca            chunk_size (3L/4, L/2) x local_window (L/16, L/8)
string         shifted_offset (L/3, L/2, 2L/3, and the least that keeps T - offset + local_window < L)
               among those that reach T; local_window min(128, L/16)
rerope         window (L/4, L/2)
leaky_rerope   window (L/4, L/2) x leak (the least that reaches T, rounded up to an integer >= 2, and twice)
============== =====================================================================================

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
from ..methods import resolve_method

DEFAULT_METHODS = ("yarn", "dynamic_ntk", "dynamic_yarn", "self_extend", "dca", "string")


def _half_up(x: float) -> float:
    return max(1.0, math.ceil(x * 2 - 1e-9) / 2)


def factors(original: int, target: int) -> list[float]:
    f = target / original
    return sorted({_half_up(f), _half_up(1.5 * f), _half_up(2 * f)})


def _self_extend(L: int, T: int) -> list[dict[str, Any]]:
    out = []
    for share in (4, 2):
        for double in (1, 2):
            g = max(2, (T - L // share) // (L - L // share) + 1) * double
            w = max(g, (L // share) // g * g)
            if (T - w) / g + w < L:
                out.append({"window": w, "group_size": g})
    return out


def _string(L: int, T: int) -> list[dict[str, Any]]:
    lw = max(1, min(128, L // 16))
    least = T - L + lw + 1
    offsets = sorted({o for o in (L // 3, L // 2, 2 * L // 3, least) if least <= o < L and o > lw})
    return [{"shifted_offset": o, "local_window": lw} for o in offsets]


def _leaky(L: int, T: int) -> list[dict[str, Any]]:
    out = []
    for w in (L // 4, L // 2):
        least = max(2, math.ceil((T - w) / (L - w) + 1e-9))
        out += [{"window": w, "leak": float(least)}, {"window": w, "leak": float(2 * least)}]
    return out


GRIDDED = ("yarn", "dynamic_yarn", "self_extend", "dca", "string", "rerope", "leaky_rerope")


def check_methods(methods: list[str]) -> list[str]:
    """The canonical names of ``methods``; an error for one with no grid."""
    names = [resolve_method(m).name for m in methods]
    for name in names:
        spec = resolve_method(name)
        if name not in GRIDDED and not (spec.kind == "rope" and spec.uses_factor):
            raise ValueError(f"tune has no grid for method {name!r}; grids exist for {', '.join(GRIDDED)} and every "
                             "RoPE scaling that takes a factor (pi, ntk, dynamic_ntk, llama3, ...); or give --space FILE")
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
    L, T, fs = original, target, factors(original, target)
    grids: dict[str, list[dict[str, Any]]] = {
        "yarn": [{"factor": f, "attention_factor": a, "beta_fast": b} for f in fs for a in (None, 1.0)
                 for b in (32.0, 16.0)],
        "dynamic_yarn": [{"factor": f, "beta_fast": b} for f in fs for b in (32.0, 16.0)],
        "self_extend": _self_extend(L, T),
        "dca": [{"chunk_size": s, "local_window": w} for s in (3 * L // 4, L // 2) for w in (L // 16, L // 8)],
        "string": _string(L, T),
        "rerope": [{"window": w} for w in (L // 4, L // 2)],
        "leaky_rerope": _leaky(L, T),
    }
    check_methods([method])
    return grids[method] if method in grids else [{"factor": f} for f in fs]


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
