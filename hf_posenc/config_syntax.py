"""The one written form of a method configuration: ``METHOD[:KEY=VALUE,...]``, e.g. ``yarn:factor=4,beta_fast=16``.

Every flag, variant, evaluator and file that names a configuration is read by :meth:`hf_posenc.PosEncConfig.parse`
(``--variant LABEL=`` + it, ``--evaluator-method``, the strings of a ``--space`` file) or by the pieces below it
(``--method-param [METHOD.]KEY=VALUE`` types its value and checks its key here; ``--config FILE`` and the objects of a
``--space`` file are checked as this text), and a bad one is refused with one text, :func:`config_error`.

A value is read as JSON (``16`` an int, ``16.0`` a float, ``true``, ``null``, ``[1.0,1.5]``), else kept as text
(``consistent``); ``factor`` and ``original_max_position_embeddings`` are keys beside the method's own knobs. The
inverse, :func:`spec_text` (``str(config)``), writes a configuration back in this form.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .methods import REQUIRED, MethodSpec, resolve_method

FORM = "METHOD[:KEY=VALUE,...]"
EXAMPLE = "yarn:factor=4,beta_fast=16"
FIELDS = ("factor", "original_max_position_embeddings")  # set on the config itself, not among the method's knobs
_KNOB_START = re.compile(r",(?=\s*[A-Za-z_][A-Za-z0-9_]*\s*=)")  # a comma that starts the next KEY=
_PLAIN = re.compile(r"[A-Za-z0-9_.+/-]+")  # a text value written without quotes


def value_of(raw: str) -> Any:
    """``raw`` read as JSON, else kept as it is."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def keys_of(spec: MethodSpec) -> list[str]:
    """The keys a configuration of ``spec`` is written with: ``factor`` (when it takes one), the original context,
    then its own knobs."""
    return (["factor"] if spec.uses_factor else []) + ["original_max_position_embeddings", *spec.params]


def _known(method: Any) -> MethodSpec | None:
    try:
        return resolve_method(method)
    except ValueError:
        return None


def config_error(text: str, reason: Any, method: Any = None) -> ValueError:
    """The one error of a bad method configuration: the text, why, the form, and the keys the method takes."""
    reason = str(reason).strip()
    if not reason.endswith((".", "?", "!")):
        reason += "."
    spec = _known(method) if method is not None else None
    keys = f"; {spec.name} takes: {', '.join(keys_of(spec))}" if spec else ""
    return ValueError(f"bad method configuration {text!r}: {reason} Write {FORM}, e.g. {EXAMPLE}{keys}.")


def split_spec(text: str) -> tuple[str, dict[str, Any]]:
    """``"yarn:factor=4,beta_fast=16"`` -> ``("yarn", {"factor": 4, "beta_fast": 16})``: the method as written and
    its keys with typed values (a comma starts the next key only when ``KEY=`` follows it, so lists keep theirs)."""
    if not isinstance(text, str):
        raise config_error(str(text), f"expected a text, got a {type(text).__name__}")
    method, _, knobs_text = text.partition(":")
    knobs: dict[str, Any] = {}
    for item in _KNOB_START.split(knobs_text) if knobs_text.strip() else []:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise config_error(text, f"expected KEY=VALUE, got {item!r}", method)
        if key.strip() in knobs:
            raise config_error(text, f"{key.strip()} given twice", method)
        knobs[key.strip()] = value_of(raw.strip())
    return method.strip(), knobs


def check_keys(text: str, method: str, keys: list[str]) -> MethodSpec:
    """The spec of ``method``, its name and ``keys`` checked as :meth:`PosEncConfig.parse` checks them."""
    try:
        spec = resolve_method(method)
    except ValueError as err:
        raise config_error(text, err) from None
    unknown = sorted(set(keys) - set(FIELDS) - set(spec.params))
    if unknown:
        raise config_error(text, f"method {spec.name!r} does not take parameter(s) {unknown}", spec.name)
    return spec


def value_text(value: Any) -> str:
    """``value`` as :func:`value_of` reads it back: plain text unquoted, anything else as compact JSON (a comma that
    would start a next ``KEY=`` can only be inside a JSON string there, and is written ``\\u002c``)."""
    if isinstance(value, str) and _PLAIN.fullmatch(value) and value_of(value) == value:
        return value
    return _KNOB_START.sub(lambda _: "\\u002c", json.dumps(value, separators=(",", ":")))


def spec_text(method: Any, knobs: dict[str, Any]) -> str:
    """``("yarn", {"factor": 4, "beta_fast": 16})`` -> ``"yarn:factor=4,beta_fast=16"`` (no checks)."""
    items = ",".join(f"{key}={value_text(value)}" for key, value in knobs.items())
    return f"{method}:{items}" if items else str(method)


def config_text(method: str, factor: float, original: int | None, params: dict[str, Any]) -> str:
    """A validated configuration's text: its factor (when the method takes one), its original context (when
    fixed), and the knobs that differ from their defaults (written exactly, so 16 and 16.0 stay apart)."""
    spec = resolve_method(method)
    knobs: dict[str, Any] = {}
    if spec.uses_factor:
        knobs["factor"] = int(factor) if float(factor).is_integer() else factor
    if original is not None:
        knobs["original_max_position_embeddings"] = original
    for key, default in spec.params.items():
        value = params[key]
        if default is REQUIRED or json.dumps(value) != json.dumps(default):
            knobs[key] = value
    return spec_text(spec.name, knobs)


def fields_text(data: dict[str, Any]) -> str:
    """The fields of a config dict (``method``, ``factor``, ``original_max_position_embeddings``, ``params``) in the
    text form, as written (unchecked): what an error about them names."""
    knobs = {k: data[k] for k in FIELDS if data.get(k) is not None}
    params = data.get("params")
    knobs.update(params if isinstance(params, dict) else {})
    return spec_text(data.get("method"), knobs)


def parse_method_params(items: list[str] | None) -> dict[str, dict[str, Any]]:
    """``--method-param [METHOD.]KEY=VALUE``: ``["beta_fast=16", "yarn.beta_slow=2"]`` -> {"*": {"beta_fast": 16},
    "yarn": {"beta_slow": 2}}; values typed by :func:`value_of`, a method's key checked by :func:`check_keys` (a
    key of no method is refused by the run, which knows its methods)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--method-param takes KEY=VALUE or METHOD.KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        method, _, key = key.rpartition(".")
        if method:
            try:
                method = check_keys(f"{method}:{key}={raw}", method, [key]).name
            except ValueError as err:
                raise ValueError(f"--method-param {item}: {err}") from None
        out.setdefault(method or "*", {})[key] = value_of(raw)
    return out
