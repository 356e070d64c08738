"""Evaluation tasks, one registered record each: ``hf-posenc eval NAME``, ``hf-posenc patch --eval NAME``, the model
card (its sections and ``model-index`` entries) and ``hf-posenc tune``'s objective iterate :func:`registered`.

A task is one module: a frozen ``Params`` dataclass (its fields are the task's keywords, and its flags: see
:mod:`eval.params`), a ``run(settings, params)`` built on :class:`common.Run` (which gives ``Run.model_for`` the
model or engine of each variant), its table and plots, and at its end one ``register_task(EvalTask(...))``. The
built-in ones are the ``run_*`` modules listed in ``BUILTIN``; a package adds its own through the
``hf_posenc.eval_tasks`` entry-point group (a module imported once, which registers), or by importing its module
before it builds the parser (docs/contributing.md: "Adding an eval task").
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from ..io.documents import DocumentSource
from ..io.wording import first_names
from .params import build, documents_field
from .settings import FLAG_ONLY, KEYWORDS, RunSettings

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
class PatchUse:
    """How ``hf-posenc patch --eval NAME`` runs a task: ``params_of(PatchEval)`` -> its Params; its lengths from
    ``--<lengths_flag>-lengths``; ``argument``: (ARG, what it is) of a task named ``NAME:ARG`` (``harness:TASK``),
    ``check_arguments`` reading those, ``check_lengths(lengths, arguments)``: both checked before anything loads."""

    params_of: Callable[[PatchEval], Any]
    lengths_flag: str = "ppl"
    argument: tuple[str, str] | None = None
    check_arguments: Callable[[list[str]], list[str]] | None = None
    check_lengths: Callable[[list[int], list[str]], None] | None = None

    def __post_init__(self):
        if (self.argument is None) != (self.check_arguments is None):
            raise ValueError("PatchUse: argument and check_arguments go together (a task named NAME:ARG reads ARG)")


@dataclass(frozen=True)
class Defaults:
    """What ``hf-posenc eval NAME`` compares and loads when not told: ``methods``, ``model`` and ``factor`` (None:
    the command's)."""

    methods: tuple[str, ...] = ("none", "yarn")
    model: str | None = None
    factor: float | None = None


@dataclass(frozen=True)
class Objective:
    """A number of ``hf-posenc tune``'s measurements this task ranks candidates by (``--rank-by NAME``)."""

    metric: str  # the key of tuning.objective.measure's result
    higher_is_better: bool


@dataclass(frozen=True)
class EvalTask:
    """One evaluation task. ``run(settings, params)`` -> report (``settings``: a :class:`settings.RunSettings`,
    ``params``: an instance of ``params``, the task's frozen dataclass whose fields are its keywords and flags);
    ``report``: the "task" of the reports (and of the cells' fingerprint) it writes; ``title``: its section of the
    model card, ``model_index(report, results_of_one_method)`` its :data:`Entry` list there; ``engines``: computed by
    ``--engine vllm`` too; ``patch``: how ``patch --eval`` runs it (None: not offered there)."""

    name: str
    report: str
    summary: str
    title: str
    params: type
    run: Callable[[RunSettings, Any], dict[str, Any]]
    defaults: Defaults = Defaults()
    engines: bool = False
    model_index: Callable[[dict, dict], list[Entry]] | None = None
    patch: PatchUse | None = None
    objective: Objective | None = None

    def __post_init__(self):
        if not self.name.replace("_", "").replace("-", "").isalnum() or not self.name[:1].isalpha():
            raise ValueError(f"an eval task's name is a word (letters, digits, - and _), got {self.name!r}")
        if not self.defaults.methods:
            raise ValueError(f"eval task {self.name!r}: its default methods are empty")
        if not (isinstance(self.params, type) and dataclasses.is_dataclass(self.params)):
            raise ValueError(f"eval task {self.name!r}: params must be a dataclass, got {self.params!r}")
        for name in ("run", "model_index"):
            value = getattr(self, name)
            if not callable(value) and (value is not None or name == "run"):
                raise ValueError(f"eval task {self.name!r}: {name} must be callable, got {value!r}")
        names = {f.name for f in dataclasses.fields(self.params)}
        shared = sorted(names & (set(KEYWORDS) | set(FLAG_ONLY)))
        if shared:
            raise ValueError(f"eval task {self.name!r}: its parameter(s) {shared} are the run's own (model, methods, "
                             "output, ...): name them otherwise")
        data = sorted(names & {f.name for f in dataclasses.fields(DocumentSource)}) if self.reads_documents else []
        if data:
            raise ValueError(f"eval task {self.name!r}: its parameter(s) {data} are flags of its documents "
                             "(--text-file, --corpus, --limit, ...): name them otherwise")

    @property
    def reads_documents(self) -> bool:
        """Whether its params hold documents (``patch --eval`` then gives it those of ``--text-file``)."""
        return documents_field(self.params) is not None

    def make_params(self, **keywords: Any) -> Any:
        """Its params of ``keywords``, an unknown one refused by name."""
        return build(self.params, keywords, f"eval task {self.name!r}", also=list(KEYWORDS))

    def __call__(self, **keywords: Any) -> dict[str, Any]:
        """The Python API: ``task(lengths=[...], model=..., methods=[...], output=...)``: the task's own keywords and
        the run's (:data:`settings.KEYWORDS`), both refused by name when unknown, before anything loads."""
        own = {k: v for k, v in keywords.items() if k not in KEYWORDS}
        run = {k: v for k, v in keywords.items() if k in KEYWORDS}
        params = self.make_params(**own)  # an unknown keyword is said first, with every keyword taken
        return self.run(RunSettings.of(**run), params)


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
        for point in importlib.metadata.entry_points(group=ENTRY_POINTS):
            _load_plugin(point)

    def order(task: EvalTask) -> int:  # the built-in ones first, in BUILTIN's order, whoever imported them first
        module = task.run.__module__.rpartition(".")[2]
        return BUILTIN.index(module) if task.run.__module__.startswith(__package__) and module in BUILTIN \
            else len(BUILTIN)

    return {t.name: t for t in sorted(_TASKS.values(), key=order)}


def _load_plugin(point) -> None:
    """Import one entry point of the eval-task group; a plugin that fails (raises on import, registers a name taken
    or a malformed task) is skipped, its tasks taken back, with a warning naming it and why: one broken package does
    not take the whole CLI down."""
    before = dict(_TASKS)
    try:
        point.load()
    except Exception as err:  # whatever a third-party module raises
        _TASKS.clear()
        _TASKS.update(before)
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        warnings.warn(f"hf_posenc: skipping the eval-task plugin {point.name!r} ({point.value}) of the "
                      f"{ENTRY_POINTS!r} entry points: {reason}", UserWarning, stacklevel=2)


def get_task(name: str) -> EvalTask:
    tasks = registered()
    if name not in tasks:
        raise ValueError(f"unknown eval task {name!r}; the tasks are {', '.join(tasks)}")
    return tasks[name]


def task_of_report(report_task: str) -> EvalTask | None:
    """The task whose runner writes reports of ``report_task`` (None: a report of something else, e.g. tune)."""
    return next((t for t in registered().values() if t.report == report_task), None)


def patch_tasks() -> list[EvalTask]:
    """The tasks ``hf-posenc patch --eval`` offers (those with ``patch``)."""
    return [t for t in registered().values() if t.patch is not None]


def lengths_flags() -> list[str]:
    """The ``--<flag>-lengths`` of ``hf-posenc patch``: each task's ``lengths_flag``, once, in registration order."""
    return list(dict.fromkeys(t.patch.lengths_flag for t in patch_tasks()))


def eval_names(tasks) -> str:
    """``ppl, passkey, retrieval, harness:TASK (TASK: an lm-eval task, ...)``: what ``patch --eval`` takes."""
    return ", ".join(f"{t.name}:{t.patch.argument[0]} ({t.patch.argument[0]}: {t.patch.argument[1]})"
                     if t.patch.argument else t.name for t in tasks)


def parse_evals(evals: list[str] | None) -> list[tuple[EvalTask, list[str]]]:
    """``patch --eval`` names -> (task, its arguments) in the order first named: ``["ppl", "harness:vt",
    "harness:cwe"]`` -> [(ppl, []), (harness, ["vt", "cwe"])]; unknown names, a task not offered by ``patch``, an
    argument to a task that takes none, a missing one, are refused before anything loads."""
    tasks = {t.name: t for t in patch_tasks()}
    chosen: dict[str, list[str]] = {}
    for item in evals or []:
        name, colon, arg = item.partition(":")
        task = tasks.get(name.strip())
        if task is None or bool(colon) != bool(task.patch.argument) or (colon and not arg.strip()):
            raise ValueError(f"--eval takes {eval_names(tasks.values())}, got {item!r}")
        chosen.setdefault(task.name, [])
        if colon:
            chosen[task.name].append(arg.strip())
    out = []
    for name, args in chosen.items():
        task = tasks[name]
        out.append((task, task.patch.check_arguments(args) if task.patch.check_arguments else []))
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
