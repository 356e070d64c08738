"""What an evaluation run is told, typed: which model and how it loads (:class:`LoadSettings`), what is compared
(:class:`RunSettings`' methods, variants, factor), what computes it (:class:`EngineSettings`) and where the results
go (:class:`OutputSettings`). ``hf-posenc eval``'s shared flags build one (``hf_posenc.cli.eval_flags``); the Python
API's keywords (``run_perplexity(model=..., methods=..., output=...)``) build the same through
:meth:`RunSettings.of`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..engines.settings import EngineSettings  # what computes the variants (eval.engine_choice)


@dataclass(frozen=True)
class LoadSettings:
    """The model and how it loads: ``model`` (Hub id, folder, .gguf file or alias), ``dtype``, ``device``,
    ``attn_implementation`` (default: the model's), ``tokenizer`` (where it comes from when the model's folder has
    none), ``device_map`` / ``max_memory`` (accelerate's big-model placement)."""

    model: str
    dtype: str = "float32"
    device: str = "cpu"
    attn_implementation: str | None = None
    tokenizer: str | None = None
    device_map: str | None = None
    max_memory: dict | None = None


@dataclass(frozen=True)
class OutputSettings:
    """Where results go: ``output`` (a folder; its cells resume), ``overwrite`` (discard cells of another setup),
    ``progress`` (bars), ``plots`` (PNGs), ``command`` (the command line recorded in the report)."""

    output: str | None = None
    overwrite: bool = False
    progress: bool = True
    plots: bool = True
    command: str | None = None


@dataclass(frozen=True)
class RunSettings:
    """One evaluation run: ``load``, the ``methods`` compared (names, PosEncConfigs or Variants; with ``factor`` and
    ``method_params`` ``{method or "*": {knob: value}}``) and labelled ``variants`` (``LABEL=METHOD:K=V`` strings),
    ``seed``, ``original_context`` (the context L a run measures past and truncates to; None: the model's own, see
    :func:`checkpoints.context.original_context`), ``output``, ``engine``; ``loaded``: a (model, tokenizer, source)
    already in memory."""

    load: LoadSettings
    methods: list[Any] | None = None
    factor: float | None = None
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    variants: list[Any] | None = None
    seed: int = 0
    original_context: int | None = None  # the L a run measures past and truncates to (None: the model's own)
    output: OutputSettings = field(default_factory=OutputSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    loaded: tuple | None = None

    @classmethod
    def of(cls, **keywords: Any) -> "RunSettings":
        """The settings of the Python API's flat keywords (:data:`KEYWORDS`: ``model``, ``methods``, ``dtype``,
        ``output``, ``engine``, ``engine_python`` ...); an unknown one is refused by name."""
        unknown = sorted(set(keywords) - set(KEYWORDS))
        if unknown:
            raise ValueError(f"unknown keyword(s) {', '.join(unknown)}; a run takes {', '.join(KEYWORDS)}")
        if "model" not in keywords:
            raise ValueError("a run needs model= (Hub id, folder, .gguf file or alias)")
        unused = [k for k in LOADING if k in keywords] if keywords.get("loaded") is not None else []
        if unused:
            raise ValueError(f"a model already loaded is used as it is: drop {', '.join(unused)} (they say how a "
                             "model loads from its name)")
        parts: dict[str, dict[str, Any]] = {"load": {}, "output": {}, "engine": {}, "": {}}
        for key, value in keywords.items():
            part, name = KEYWORDS[key]
            parts[part][name] = value
        top = parts[""]
        if top.get("method_params") is None:
            top.pop("method_params", None)
        if parts["engine"].get("args") is None:
            parts["engine"].pop("args", None)
        return cls(load=LoadSettings(**parts["load"]), output=OutputSettings(**parts["output"]),
                   engine=EngineSettings(**parts["engine"]), **top)

    def replace(self, **changes: Any) -> "RunSettings":
        return dataclasses.replace(self, **changes)


def _keywords() -> dict[str, tuple[str, str]]:
    """Flat keyword -> (the part of RunSettings it sets, its field there)."""
    out = {f.name: ("load", f.name) for f in dataclasses.fields(LoadSettings)}
    out.update((f.name, ("output", f.name)) for f in dataclasses.fields(OutputSettings))
    out.update(engine=("engine", "name"), engine_python=("engine", "python"),
               tensor_parallel_size=("engine", "tensor_parallel_size"), engine_args=("engine", "args"))
    out.update((f.name, ("", f.name)) for f in dataclasses.fields(RunSettings)
               if f.name not in ("load", "output", "engine"))
    return out


KEYWORDS = _keywords()  # the Python API's run keywords (run_perplexity(model=..., output=..., engine=...))
LOADING = tuple(f.name for f in dataclasses.fields(LoadSettings) if f.name != "model")  # how a model loads
# the shared flags of `hf-posenc eval NAME` whose names are not run keywords (hf_posenc.cli.eval_flags; its test
# checks the two lists together): a task's parameter may not take one of these names either
FLAG_ONLY = ("variant", "method_param", "engine_arg", "data_parallel_size", "no_progress", "no_plots", "task",
             "command", "argv")
