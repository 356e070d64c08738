"""What the evaluations share: the methods to compare, running each in turn, the recorded setup."""

from __future__ import annotations

import json
import time
from typing import Any

from ..config import PosEncConfig
from ..patching import get_config, patch, unpatch
from ..methods import resolve_method
from ..context import original_context
from ..provenance import environment, recorded_command


def parse_method_params(items: list[str] | None) -> dict[str, dict[str, Any]]:
    """``["beta_fast=16", "yarn.beta_slow=2"]`` -> {"*": {"beta_fast": 16}, "yarn": {"beta_slow": 2}}."""
    out: dict[str, dict[str, Any]] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--method-param takes KEY=VALUE or METHOD.KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        method, _, key = key.rpartition(".")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(resolve_method(method).name if method else "*", {})[key] = value
    return out


def method_configs(methods: list[str | PosEncConfig], factor: float | None,
                   params: dict[str, dict[str, Any]]) -> list[PosEncConfig]:
    """One validated PosEncConfig per method; shared knobs (``KEY=VALUE``) go to the methods that take them.
    A PosEncConfig in ``methods`` is taken as it is."""
    specs = [resolve_method(m) for m in methods if not isinstance(m, PosEncConfig)]
    unused = sorted(set(params.get("*", {})) - {k for spec in specs for k in spec.params})
    if unused:
        taken = sorted({k for spec in specs for k in spec.params}) or ["none"]
        raise ValueError(f"--method-param {', '.join(unused)}: no method of this run takes it (methods "
                         f"{[s.name for s in specs]} take: {', '.join(taken)}).")
    configs = []
    for name in methods:
        if isinstance(name, PosEncConfig):
            configs.append(name)
            continue
        spec = resolve_method(name)
        knobs = {k: v for k, v in params.get("*", {}).items() if k in spec.params}
        knobs.update(params.get(spec.name, {}))
        configs.append(PosEncConfig(spec.name, factor if spec.uses_factor else None, params=knobs))
    return configs


def for_each_method(model, configs: list[PosEncConfig], evaluate) -> dict[str, Any]:
    """Patch ``model`` with each config in turn, run ``evaluate(config)``, and restore the model after each
    (to the patch it had before, if any)."""
    before = get_config(model)
    results = {}
    try:
        for cfg in configs:  # each method is fitted to the model once before any is evaluated: a method that
            patch(model, cfg)  # does not fit is refused before the others spend their compute
        for cfg in configs:
            patch(model, cfg)
            results[cfg.method] = evaluate(cfg)
    finally:
        unpatch(model)
        if before is not None:
            patch(model, before)
    return results


def shared_setup(model: str, src, lm, configs: list[PosEncConfig], seed: int, dtype: str, device: str,
                 attn_implementation: str | None, command: str | None, started: float) -> dict[str, Any]:
    """The part of a report's setup that every evaluation records (what ran, where, and how to rerun it)."""
    return {
        "model": model, "model_source": src.label or src.path, "original_context": original_context(lm),
        "methods": {c.method: c.to_dict() for c in configs}, "seed": seed, "dtype": dtype, "device": device,
        "attn_implementation": attn_implementation or lm.config._attn_implementation,
        "command": recorded_command(command), "environment": environment(),
        "seconds": round(time.time() - started, 1),
    }
