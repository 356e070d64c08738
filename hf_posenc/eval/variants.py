"""Variants: the configurations an evaluation compares, each under a label of its own.

``--variant y2=yarn:factor=2`` and ``--variant y4=yarn:factor=4,beta_fast=16`` compare two configurations
of one method in one run; reports, tables, plots and model cards are keyed by the label. ``--methods
none,yarn`` keeps working: each method becomes a variant labelled with its name, with the run's
``--factor`` and ``--method-param`` knobs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..adapters.base import text_config
from ..adapters.rope_compose import own_scaling
from ..checkpoints.context import context_length
from ..config import CONFIG_KEY, PosEncConfig
from ..config_syntax import FORM
from ..methods import resolve_method
from ..patching import get_config, trying

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


@dataclass(frozen=True)
class Variant:
    label: str
    config: PosEncConfig

    @property
    def method(self) -> str:
        return self.config.method

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, **self.config.to_dict()}


def parse_variant(text: str) -> Variant:
    """``LABEL=METHOD[:KEY=VALUE,...]``: a label, ``=``, then the one configuration text of
    :meth:`PosEncConfig.parse` -> a validated :class:`Variant`."""
    label, eq, rest = text.partition("=")
    label = label.strip()
    if not eq or not LABEL.fullmatch(label):
        raise ValueError(f"--variant takes LABEL={FORM} with a label of letters, digits and "
                         f"_.+- (e.g. y2=yarn:factor=2), got {text!r}")
    try:
        config = PosEncConfig.parse(rest)
    except ValueError as err:
        raise ValueError(f"--variant {label}: {err}") from None
    return Variant(label, config)


def method_variants(methods: list[Any], factor: float | None, params: dict[str, dict[str, Any]]) -> list[Variant]:
    """One variant per entry of ``methods``: a method name (labelled with its canonical name, given the
    run's ``factor`` and the knobs of ``params``: ``"*"`` for every method that takes them, or per method
    name), a :class:`PosEncConfig` (labelled with its method) or a :class:`Variant` (kept)."""
    specs = [resolve_method(m) for m in methods if isinstance(m, str)]
    takes = {k for spec in specs for k in spec.params}
    unused = sorted(set(params.get("*", {})) - takes)
    if unused:
        raise ValueError(f"--method-param {', '.join(unused)}: no method of this run takes it (methods "
                         f"{[s.name for s in specs]} take: {', '.join(sorted(takes)) or 'none'}).")
    out = []
    for entry in methods:
        if isinstance(entry, Variant):
            out.append(entry)
        elif isinstance(entry, PosEncConfig):
            out.append(Variant(entry.method, entry))
        else:
            spec = resolve_method(entry)
            knobs = {k: v for k, v in params.get("*", {}).items() if k in spec.params}
            knobs.update(params.get(spec.name, {}))
            out.append(Variant(spec.name, PosEncConfig(spec.name, factor if spec.uses_factor else None,
                                                       params=knobs)))
    return check_labels(out)


def check_labels(variants: list[Variant]) -> list[Variant]:
    if not variants:
        raise ValueError("nothing to evaluate: give --methods or at least one --variant")
    seen: set[str] = set()
    for v in variants:
        if v.label in seen:
            raise ValueError(f"the label {v.label!r} names two variants; give each --variant (and --methods entry) "
                             "a label of its own")
        seen.add(v.label)
    return variants


def build_variants(methods: list[Any] | None, factor: float | None, params: dict[str, dict[str, Any]],
                   variants: list[str] | None = None) -> list[Variant]:
    """The variants of a run: ``methods`` (see :func:`method_variants`) followed by the parsed ``variants``."""
    listed = method_variants(methods, factor, params) if methods else []
    return check_labels(listed + [parse_variant(v) if isinstance(v, str) else v for v in variants or []])


def grouped_by_config(variants: list[Variant]) -> list[Variant]:
    """``variants`` with those of one configuration next to each other (groups in order of first appearance): the
    order to compute cells in when each configuration costs an engine start."""
    keys = [json.dumps(v.config.to_dict(), sort_keys=True) for v in variants]
    first = {k: keys.index(k) for k in keys}
    return [v for _, _, v in sorted(zip((first[k] for k in keys), range(len(keys)), variants))]


def applied(model, variants: list[Variant]) -> dict[str, dict[str, Any]]:
    """What each variant is on ``model`` (see :func:`applied_now`), by label; ``model`` is left as it was."""
    out = {}
    with trying(model, []) as apply:
        for v in variants:
            apply(v.config)
            out[v.label] = applied_now(model)
    return out


def applied_now(model) -> dict[str, Any]:
    """The patch on ``model`` as it was applied: its ``config`` resolved against the checkpoint (a RoPE scaling on
    a checkpoint already scaled: the composed longrope that extends it), the ``context`` the model advertises, and
    ``own_scaling``: the checkpoint's own scaling and whether the patch replaced or extended it (None: its RoPE was
    not scaled; see :func:`rope_compose.own_scaling`)."""
    cfg = get_config(model)
    _, prefix = text_config(model.config)
    block = getattr(model.config, CONFIG_KEY, None) or {}
    return {"config": cfg.to_dict(), "context": context_length(model),
            "own_scaling": own_scaling(block, prefix, getattr(text_config(model.config)[0], "rope_parameters", None))}
