"""Evaluation tasks, one registered record each: ``hf-posenc eval NAME``, ``hf-posenc patch --eval NAME``, the model
card (its sections and ``model-index`` entries) and ``hf-posenc tune``'s objective iterate :func:`registered`.

A task is one module: its cells and their aggregation (a runner built on :class:`common.Run`, which gives
``Run.model_for`` the model or engine of each variant), its table and plots, and at its end one
``register_task(EvalTask(...))`` naming all of that with its CLI flags, default methods, model-index entries and
card title. The built-in ones are the ``run_*`` modules listed in ``BUILTIN``; a package adds its own through the
``hf_posenc.eval_tasks`` entry-point group (a module imported once, which registers), or by importing its module
before it builds the parser (README: "Adding an eval task").
"""

from __future__ import annotations

import argparse
import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from ..wording import first_names

BUILTIN = ("run_ppl", "run_passkey", "run_retrieval", "run_harness")
ENTRY_POINTS = "hf_posenc.eval_tasks"

# one number of the card's model-index: (its fields: task_type, task_name, dataset_type, dataset_name, metric_type;
# the metric's name; its value; its metric_config)
Entry = tuple[dict[str, Any], str, float, str]


@dataclass(frozen=True)
class PatchEval:
    """What ``hf-posenc patch --eval`` gives every task it runs: the lengths (the task's ``--<lengths_flag>-lengths``,
    else the original and extended context), the documents of ``--text-file`` (for tasks that read documents), the
    task's arguments (``harness:TASK`` -> ``["TASK"]``), and the other knobs of the patch command."""

    lengths: list[int]
    docs: list = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)
    depths: list[float] = field(default_factory=lambda: [0.5])
    trials: int = 2
    max_windows: int = 1
    limit: int | None = 50
    max_gen_tokens: int | None = None


@dataclass(frozen=True)
class Objective:
    """A number of ``hf-posenc tune``'s measurements this task ranks candidates by (``--rank-by NAME``)."""

    metric: str  # the key of tuning.objective.measure's result
    higher_is_better: bool


@dataclass(frozen=True)
class EvalTask:
    """One evaluation task. ``run(**keywords, **run)`` -> report, where ``run`` are :class:`common.Run`'s keywords;
    ``flags(parser)`` adds the task's own flags to ``eval NAME`` (``--lengths`` among them) and ``keywords(args)``
    reads them back into the runner's keywords; ``patch_keywords(PatchEval)`` gives them for ``patch --eval NAME``
    (None: not offered there); ``model_index(report, results_of_one_method)`` -> the card's :data:`Entry` list."""

    name: str
    report: str  # the "task" of the reports (and of the cells' fingerprint) its runner writes
    summary: str
    title: str
    run: Callable[..., dict[str, Any]]
    flags: Callable[[argparse.ArgumentParser], None]
    keywords: Callable[[argparse.Namespace], dict[str, Any]]
    default_methods: tuple[str, ...] = ("none", "yarn")
    engines: bool = False  # computed by --engine vllm too
    parser_defaults: dict[str, Any] = field(default_factory=dict)  # Run's flags it defaults otherwise (model, factor)
    model_index: Callable[[dict, dict], list[Entry]] | None = None
    patch_keywords: Callable[[PatchEval], dict[str, Any]] | None = None
    lengths_flag: str = "ppl"  # patch --eval takes this task's lengths from --<lengths_flag>-lengths
    reads_documents: bool = False  # patch --eval gives it the documents of --text-file
    check_arguments: Callable[[list[str]], list[str]] | None = None  # NAME:ARG taken (harness:TASK), checked early
    argument: tuple[str, str] = ("ARG", "")  # that ARG's name and what it is, for --help and errors
    check_lengths: Callable[[list[int], list[str]], None] | None = None  # given lengths (and arguments), checked early
    objective: Objective | None = None

    def __post_init__(self):
        if not self.name.replace("_", "").replace("-", "").isalnum() or not self.name[:1].isalpha():
            raise ValueError(f"an eval task's name is a word (letters, digits, - and _), got {self.name!r}")
        if not self.default_methods:
            raise ValueError(f"eval task {self.name!r}: default_methods is empty")
        for name in ("run", "flags", "keywords", *_OPTIONAL_CALLABLES):
            value = getattr(self, name)
            if not callable(value) and (value is not None or name not in _OPTIONAL_CALLABLES):
                raise ValueError(f"eval task {self.name!r}: {name} must be callable, got {value!r}")


_OPTIONAL_CALLABLES = ("model_index", "patch_keywords", "check_arguments", "check_lengths")


_TASKS: dict[str, EvalTask] = {}
_loaded = False


def register_task(task: EvalTask) -> EvalTask:
    """Add ``task`` (once: a second task of the same name or report is refused)."""
    for other in _TASKS.values():
        if other.name != task.name and other.report == task.report:
            raise ValueError(f"eval task {task.name!r} writes reports of task {task.report!r}, as {other.name!r} does")
    if task.name in _TASKS and _TASKS[task.name] != task:
        raise ValueError(f"an eval task named {task.name!r} is already registered")
    _TASKS[task.name] = task
    return task


def unregister_task(name: str) -> None:
    """Remove a task (a test's own task, after it)."""
    _TASKS.pop(name, None)


def registered() -> dict[str, EvalTask]:
    """Every eval task by name: the built-in ones, those of installed packages' entry points, and any registered."""
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BUILTIN:
            importlib.import_module(f"{__package__}.{module}")
        from importlib.metadata import entry_points

        for point in entry_points(group=ENTRY_POINTS):
            _load_plugin(point)

    def order(task: EvalTask) -> int:  # the built-in ones first, in BUILTIN's order, whoever imported them first
        module = task.run.__module__.rpartition(".")[2]
        return BUILTIN.index(module) if task.run.__module__.startswith(__package__) and module in BUILTIN else len(BUILTIN)

    return {t.name: t for t in sorted(_TASKS.values(), key=order)}


def _load_plugin(point) -> None:
    """Import one entry point of the eval-task group and check the tasks it registered; a plugin that fails (raises
    on import, registers a name taken, a malformed task or flags that do not build) is skipped, its tasks taken
    back, with a warning naming it and why: one broken package does not take the whole CLI down."""
    before = dict(_TASKS)
    try:
        point.load()
        for task in [t for name, t in _TASKS.items() if name not in before]:
            _try_flags(task)
    except Exception as err:  # whatever a third-party module raises
        _TASKS.clear()
        _TASKS.update(before)
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        warnings.warn(f"hf_posenc: skipping the eval-task plugin {point.name!r} ({point.value}) of the "
                      f"{ENTRY_POINTS!r} entry points: {reason}", UserWarning, stacklevel=2)


def _try_flags(task: EvalTask) -> None:
    """``task.flags`` on a parser with the flags ``eval NAME`` gives every task, as the CLI builds it."""
    from ..flags import eval_task_flags

    parser = argparse.ArgumentParser(prog=f"hf-posenc eval {task.name}", add_help=True, allow_abbrev=False)
    eval_task_flags(parser, task)
    try:
        task.flags(parser)
    except argparse.ArgumentError as err:
        raise ValueError(f"eval task {task.name!r}: its flags clash with the eval command's: {err}") from None


def get_task(name: str) -> EvalTask:
    tasks = registered()
    if name not in tasks:
        raise ValueError(f"unknown eval task {name!r}; the tasks are {', '.join(tasks)}")
    return tasks[name]


def task_of_report(report_task: str) -> EvalTask | None:
    """The task whose runner writes reports of ``report_task`` (None: a report of something else, e.g. tune)."""
    return next((t for t in registered().values() if t.report == report_task), None)


def patch_tasks() -> list[EvalTask]:
    """The tasks ``hf-posenc patch --eval`` offers (those with ``patch_keywords``)."""
    return [t for t in registered().values() if t.patch_keywords is not None]


def lengths_flags() -> list[str]:
    """The ``--<flag>-lengths`` of ``hf-posenc patch``: each task's ``lengths_flag``, once, in registration order."""
    return list(dict.fromkeys(t.lengths_flag for t in patch_tasks()))


def eval_names(tasks) -> str:
    """``ppl, passkey, retrieval, harness:TASK (TASK: an lm-eval task, ...)``: what ``patch --eval`` takes."""
    return ", ".join(f"{t.name}:{t.argument[0]} ({t.argument[0]}: {t.argument[1]})" if t.check_arguments else t.name
                     for t in tasks)


def parse_evals(evals: list[str] | None) -> list[tuple[EvalTask, list[str]]]:
    """``patch --eval`` names -> (task, its arguments) in the order first named: ``["ppl", "harness:vt",
    "harness:cwe"]`` -> [(ppl, []), (harness, ["vt", "cwe"])]; unknown names, a task not offered by ``patch``, an
    argument to a task that takes none, a missing one, are refused before anything loads."""
    tasks = {t.name: t for t in patch_tasks()}
    chosen: dict[str, list[str]] = {}
    for item in evals or []:
        name, colon, arg = item.partition(":")
        task = tasks.get(name.strip())
        if task is None or bool(colon) != bool(task.check_arguments) or (colon and not arg.strip()):
            raise ValueError(f"--eval takes {eval_names(tasks.values())}, got {item!r}")
        chosen.setdefault(task.name, [])
        if colon:
            chosen[task.name].append(arg.strip())
    out = []
    for name, args in chosen.items():
        task = tasks[name]
        out.append((task, task.check_arguments(args) if task.check_arguments else []))
    return out


def documents_label(docs: list[str]) -> str:
    """The model-index's dataset name of a report that read ``docs``."""
    if not docs:
        return "text"
    return first_names(docs, 3)


def per_length_entries(fields: dict[str, Any], name: str, value_of: Callable[[dict, str], float | None]):
    """A ``model_index`` of a task with one number per length: ``value_of(results, "4096")`` (None: no number),
    ``name`` a format of ``n`` ("perplexity @ {n} tokens"); the dataset named by the report's documents when
    ``fields`` names none."""
    def entries(report: dict[str, Any], res: dict[str, Any]) -> list[Entry]:
        labelled = {"dataset_name": documents_label(report["setup"].get("documents", [])), **fields}
        values = [(str(n), value_of(res, str(n))) for n in report["setup"]["lengths"]]
        return [(labelled, name.format(n=n), v, n) for n, v in values if v is not None]

    return entries
