"""The serving engines, one :class:`Engine` record each: how it is named, how serve-config launches it and, where
hf_posenc can run it here, how serve-check and evaluations start it (:class:`Runner`). Each engine's module under
:mod:`hf_posenc.engines.launch` registers its record (:func:`register_engine`); adding an engine is that module and
a test."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

from .settings import EngineSettings


@dataclass(frozen=True)
class Runner:
    """How hf_posenc runs an engine in this environment.

    Args:
        ready: ``ready(settings) -> version``: the engine's version once it is known to be installed (a clear error
            otherwise), asked before any slow work.
        open: ``open(path, settings, dtype, context, setup)``: a context manager yielding a scorer
            (:class:`hf_posenc.engines.scorer.Scorer`) of inputs up to ``context`` tokens; ``setup`` (the report's)
            gets what was started.
        takes_vllm_flags: it is set up by ``EngineSettings``' python, tensor_parallel_size, args and allow_long.
        no_flags_reason: why it takes none of them, when it does not.
        scores_gguf: it scores a GGUF file as it is (else a checkpoint folder only).
        scores_past_limits: lengths past the original context are scored even where the method's record says the
            engine computes it the same only up to there (vLLM: measured each time).
    """

    ready: Callable[[EngineSettings], str]
    open: Callable[..., ContextManager[Any]]
    takes_vllm_flags: bool = False
    no_flags_reason: str = ""
    scores_gguf: bool = False
    scores_past_limits: bool = False


@dataclass(frozen=True)
class Engine:
    """One serving engine.

    Args:
        key: its ``--engine`` value (``vllm``, ``llama.cpp``, ...).
        name: as method records (``MethodSpec.engines``) and model cards name it (``vLLM``, ...).
        launch: ``launch(served, length) -> Launch``: serve-config's settings for a checkpoint.
        runner: how hf_posenc runs it here (None: not run here, its settings only written).
        support_row: the card's table of what engines compute has a row for it.
        runs_on: the registered engine (its name) whose computation this one runs (Ollama: llama.cpp's
            ``llama-server``); its row in the card's table is that engine's, with ``runs_on_why`` saying so.
        runs_on_why: how it runs the other engine, as the row's basis begins.
    """

    key: str
    name: str
    launch: Callable[..., Any] | None = None
    runner: Runner | None = None
    support_row: bool = True
    runs_on: str | None = None
    runs_on_why: str = ""


ENGINES: dict[str, Engine] = {}  # by key, in the order they registered


def register_engine(engine: Engine) -> Engine:
    """Add ``engine`` (a key or name another engine holds is refused)."""
    for other in ENGINES.values():
        if engine.key in (other.key, other.name) or engine.name in (other.key, other.name):
            raise ValueError(f"engine {engine.key!r} ({engine.name}) clashes with the registered {other.key!r}")
    ENGINES[engine.key] = engine
    return engine


def unregister_engine(key: str) -> None:
    """Remove a registered engine (a plugin's or a test's)."""
    ENGINES.pop(key, None)


def engine(key: str) -> Engine:
    """The record of ``key``; a ValueError naming the registered ones otherwise."""
    if key not in ENGINES:
        raise ValueError(f"unknown engine {key!r}; the engines: {', '.join(ENGINES)}")
    return ENGINES[key]


def runnable() -> tuple[str, ...]:
    """The keys of the engines hf_posenc runs here (serve-check's ``--engine`` values)."""
    return tuple(k for k, e in ENGINES.items() if e.runner is not None)


def support_names() -> tuple[str, ...]:
    """The engines of the card's table of known support, as records name them."""
    return tuple(e.name for e in ENGINES.values() if e.support_row)


def followers() -> dict[str, Engine]:
    """The engines of the card's table that run another one's computation (:attr:`Engine.runs_on`), by name."""
    return {e.name: e for e in ENGINES.values() if e.support_row and e.runs_on}


class _Launchers(Mapping):
    """The launchers of the registered engines by key, in registration order (a view of :data:`ENGINES`)."""

    def __getitem__(self, key: str) -> Callable[..., Any]:
        launch = ENGINES[key].launch
        if launch is None:
            raise KeyError(key)
        return launch

    def __iter__(self) -> Iterator[str]:
        return (k for k, e in ENGINES.items() if e.launch is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


LAUNCHERS: Mapping[str, Callable[..., Any]] = _Launchers()  # serve-config's engines


def display_name(key: str) -> str:
    """How records and cards name the engine of ``key`` (the key itself for one not registered)."""
    return ENGINES[key].name if key in ENGINES else key
