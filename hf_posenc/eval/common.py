"""What the evaluations share: the Run (variants, model, processes, cells, report)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import time
from typing import Any

from ..adapters.base import text_config
from ..adapters.layout import served_context
from ..checkpoints.context import original_context
from ..checkpoints.runtime import load_model_and_tokenizer, seed_everything
from ..io.digests import file_digests
from ..io.files import OutputLock, check_output_folder
from ..io.interrupts import deferred_interrupts
from ..io.provenance import environment, recorded_command
from ..io.reports import finish_report
from ..patching import checkpoint_config
from .cells import CELLS_FILE, CellStore, run_cells
from .engine_choice import EngineChoice
from .processes import Processes, device_name
from .settings import RunSettings
from .variants import applied, build_variants

WEIGHT_FILES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".index.json")
MODEL_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
               "vocab.txt", "merges.txt", "tokenizer.model", "special_tokens_map.json", "added_tokens.json",
               "chat_template.jinja"}  # beside the weights: what makes the model and its tokenizer


def model_files(folder: str, gguf_file: str | None) -> list[str]:
    """The files of a model folder that decide its outputs: weights (of a GGUF folder, the file loaded), config and
    tokenizer. Reports, cells and plots written into the folder are not among them, so an evaluation whose
    ``--output`` is the model's folder resumes."""
    names = sorted(f for f in os.listdir(folder) if f.endswith(WEIGHT_FILES) or f in MODEL_FILES)
    return [f for f in names if f == gguf_file or not f.endswith(".gguf")]


def model_identity(model: str, lm, src) -> dict[str, Any]:
    """What names the exact weights: the Hub revision transformers resolved (``lm``: the loaded model; None before
    the load), or for a local folder a digest of its model files (names, sizes and every byte: see
    :mod:`hf_posenc.io.digests`)."""
    identity = {"model": model, "revision": getattr(getattr(lm, "config", None), "_commit_hash", None)}
    folder = src.path if os.path.isdir(src.path) else None
    if folder is not None:
        names = model_files(folder, src.kwargs.get("gguf_file"))
        paths = [os.path.join(folder, name) for name in names]
        digest = hashlib.sha256()
        for name, path, content in zip(names, paths, file_digests(paths)):
            digest.update(f"{name}:{os.path.getsize(path)}:{content}\n".encode())
        identity["files"] = "sha256:" + digest.hexdigest()[:32]
    return identity


def tokenizer_digest(tok) -> str:
    """A digest of what makes ``tok`` tokenize as it does: a fast tokenizer's whole serialized pipeline (vocabulary,
    merges, normalizer, pre-tokenizer, added tokens), else its vocabulary, with its class either way."""
    backend = getattr(tok, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(tok.get_vocab(), sort_keys=True)
    return "sha256:" + hashlib.sha256(f"{type(tok).__name__}\n{text}".encode()).hexdigest()[:32]


def check_original_context(value) -> None:
    """A given original context is a positive whole number of tokens."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"original_context (--original-context) is the context L a run measures past and truncates "
                         f"to, a positive whole number of tokens (e.g. 16384), got {value!r}")


REPORTS = ("perplexity", "passkey", "retrieval", "harness", "tune")  # the tasks whose <task>.json / .md a Run writes
BEST = "best.json"  # (tune's winner)
REMOVED = ("tune_generations.png", "tune_factors.png")  # an evolutionary search's own plots (a grid search's report
# in the same folder removes them: remove_stale_plots)


# each report's figures (name patterns), in its output folder
TASK_PLOTS = {"perplexity": ("ppl_vs_length.png", "loss_by_position_*.png"),
              "passkey": ("passkey_vs_length.png", "passkey_heatmap_*.png"), "retrieval": ("retrieval_vs_length.png",),
              "harness": ("harness_vs_length.png",), "tune": ("tune_loss_by_position.png", *REMOVED)}
PLOTS = tuple(p for patterns in TASK_PLOTS.values() for p in patterns)  # a Run's figures


_REPORT_NAMES = frozenset({f"{task}.{ext}" for task in REPORTS for ext in ("json", "md")} | {BEST})


def written_by_a_run(name: str) -> bool:
    """Whether a Run writes (or replaces) a file of this name in its output folder: a report, best.json, a plot."""
    return name in _REPORT_NAMES or any(fnmatch.fnmatchcase(name, plot) for plot in PLOTS)


def remove_stale_plots(output: str, task: str, written: list[str]) -> None:
    """The figures of ``task``'s report in ``output`` that this run did not write (``written``: their paths) go: an
    earlier run's (a length no longer asked, a method dropped, --no-plots after a run with plots) would stand beside
    a report they do not show. Only names a Run writes, in a folder a run holds."""
    kept = {os.path.basename(p) for p in written}
    for name in sorted(os.listdir(output)):
        if name not in kept and any(fnmatch.fnmatchcase(name, p) for p in TASK_PLOTS.get(task, ())):
            os.unlink(os.path.join(output, name))


def check_reports_are_ours(output: str) -> None:
    """Refuse, before any compute, a folder no evaluation has written into (no cells file) that holds a file named
    as a report an evaluation writes: it would be replaced (a folder with a cells file is an earlier run's, whose
    reports are rewritten as it resumes)."""
    if not os.path.isdir(output) or os.path.isfile(os.path.join(output, CELLS_FILE)):
        return
    clash = sorted(name for name in os.listdir(output) if written_by_a_run(name))
    if clash:
        raise ValueError(f"--output {output!r} already holds {', '.join(clash)}, which no hf-posenc evaluation wrote "
                         f"there (the folder has no {CELLS_FILE}) and this run would replace: give a new or empty "
                         "folder, or move those files away yourself")


class Run:
    """One evaluation run: its variants, its model (loaded once, per process), its processes and cells, as
    ``settings`` (:class:`settings.RunSettings`) say. Its engine: transformers, or vLLM (every variant computed by
    vLLM, one refused by name where vLLM does not compute it as hf_posenc does, or ``auto``: those on transformers;
    see :mod:`hf_posenc.engines.vllm_engine`)."""

    def __init__(self, settings: RunSettings):
        s, load, out, engine = settings, settings.load, settings.output, settings.engine
        self.settings = settings
        check_original_context(s.original_context)
        self.variants = build_variants(s.methods, s.factor, s.method_params or {}, s.variants)  # before the slow load
        if engine.allow_long:
            raise ValueError("allow_long is serve-check's (vLLM started past the context config.json advertises); an "
                             "evaluation serves each variant within what it advertises: drop allow_long")
        self.engine = EngineChoice(engine.name or "transformers", self.variants, engine.python,
                                   engine.tensor_parallel_size, engine.args)
        if out.output:
            check_output_folder(out.output)  # an unwritable --output is found before the compute, not after
            check_reports_are_ours(out.output)
        self.processes = Processes(load.device)
        if self.engine.served and load.device_map:
            raise ValueError("--engine vllm: vLLM places the model itself (--tensor-parallel-size spreads it over "
                             "GPUs): drop --device-map")
        if load.device_map and self.processes.world > 1:
            raise ValueError("--device-map spreads one model over the devices of one process; with several "
                             "processes each holds a whole model on its own device: use one or the other")
        self.model, self.seed, self.dtype, self.tokenizer = load.model, s.seed, load.dtype, load.tokenizer
        self.device = self.processes.device(load.device)
        self.attn_implementation, self.device_map, self.max_memory = (load.attn_implementation, load.device_map,
                                                                      load.max_memory)
        self.output, self.overwrite, self.progress, self.plots = out.output, out.overwrite, out.progress, out.plots
        self.command, self.loaded = out.command, s.loaded
        self._stores: dict[str, CellStore] = {}
        # one run per output folder: a second one is refused here, before the slow load
        self._lock = None
        try:  # a kill as the lock is taken leaves no lock file
            with deferred_interrupts():
                self._lock = OutputLock(out.output) if out.output and self.processes.is_main else None
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engine, release the output folder (see :class:`files.OutputLock`)."""
        self.engine.close()
        if self._lock is not None:
            self._lock.release()

    def load(self):
        """(model, tokenizer, source), loaded once."""
        if self.loaded is None:
            seed_everything(self.seed)
            self.loaded = load_model_and_tokenizer(self.model, self.dtype, self.device, self.attn_implementation,
                                                   self.tokenizer, device_map=self.device_map,
                                                   max_memory=self.max_memory)
        self.started = time.time()
        return self.loaded

    def tokenizer_settings(self, tok) -> dict[str, Any]:
        """What names the tokenizer in a task's settings: its name or path and vocabulary, and where it does not come
        from the model's own source (whose identity covers it), a digest of how it tokenizes (``content``), so that
        a tokenizer changed in place is not taken for the one the cells were computed with."""
        name = getattr(tok, "name_or_path", None)
        out = {"tokenizer": name, "vocabulary": len(tok)}
        sources = {os.path.abspath(str(p)) for p in (self.model, self.load()[2].path)}  # (an alias, its folder)
        if not isinstance(name, str) or os.path.abspath(name) not in sources:
            out["tokenizer_content"] = tokenizer_digest(tok)
        return out

    def original(self, lm) -> int | None:
        """The context L this run measures past and truncates to: ``original_context`` where given, else the
        model's own (:func:`checkpoints.context.original_context`)."""
        return self.settings.original_context or original_context(lm)

    @property
    def attention(self) -> str:
        return self.attn_implementation or self.loaded[0].config._attn_implementation

    def fingerprint(self, task: str, settings: dict[str, Any]) -> dict[str, Any]:
        lm, _, src = self.loaded
        versions = {k: v for k, v in environment().items() if k in ("hf_posenc", "torch", "transformers")}
        kept = {"task": task, "model": model_identity(self.model, lm, src), "settings": settings, "seed": self.seed,
                "dtype": self.dtype, "attn_implementation": self.attention, "versions": versions}
        if self.engine.served:  # cells of the transformers engine keep the fingerprint they always had
            kept["engine"] = self.engine.describe()
        if self.settings.original_context:  # cells truncated at, and counted past, another L than the model's
            kept["original_context"] = self.settings.original_context
        own = checkpoint_config(lm)
        if own is not None:  # a checkpoint saved with a RoPE scaling: its variants (not "none") start from it
            kept["checkpoint_scaling"] = own.to_dict()
        served = served_context(lm.config)
        if served != getattr(text_config(lm.config)[0], "max_position_embeddings", None):
            kept["served_context"] = served  # (a YaRN left at its pretraining max_position_embeddings, which releases
            # before 0.2.1 extended from: their cells are refused)
        return kept

    def model_for(self, variant, longest: int):
        """What computes ``variant``'s cells: the loaded model (patched by it, as :func:`cells.run_cells` leaves it) or
        the engine serving it, started for inputs of up to ``longest`` tokens."""
        return self.engine.model_for(variant, self.loaded[0], longest, self.dtype, self.seed)

    def cells(self, task: str, settings: dict[str, Any], keys: dict[str, list[list]], compute,
              variants: list | None = None, desc: str | None = None, fields=None) -> dict[str, list]:
        """The cell results of ``variants`` (default: every variant of the run; see :func:`cells.run_cells`),
        resumed from ``output`` when it has them. Called again for the same task in one run, it reuses the
        cells computed so far (the settings of the first call are the task's)."""
        variants = variants or self.variants
        store = self._stores.get(task)
        if store is None:
            kept = self.fingerprint(task, settings) if self.output else {}  # only a cells file needs one
            store = self._stores[task] = CellStore(self.output, kept, self.processes, self.overwrite,
                                                   device=device_name(self.device))
        return run_cells(self.loaded[0], variants, keys, compute, store, self.processes,
                         self.progress and self.processes.is_main, desc=desc or task, fields=fields)

    def cell_seconds(self, task: str, label: str, keys: list[list]) -> float:
        """The recorded compute seconds of ``label``'s cells ``keys`` of ``task`` (see :meth:`cells`)."""
        return self._stores[task].seconds_of(label, keys)

    def report(self, task: str, settings: dict[str, Any], results: dict[str, Any], table, plots) -> dict[str, Any]:
        """The report (written by the main process only, when there is an output folder)."""
        lm, _, src = self.loaded
        setup = {
            "model": self.model, "model_source": src.label or src.path, "original_context": self.original(lm),
            "variants": {v.label: v.config.to_dict() for v in self.variants}, "applied": applied(lm, self.variants),
            "seed": self.seed,
            "dtype": self.dtype, "device": self.device, "processes": self.processes.world,
            "attn_implementation": self.attention, "command": recorded_command(self.command),
            "environment": environment(),
            "seconds": round(time.time() - self.started, 1), **settings,
        }
        if self.settings.original_context:
            setup["original_context_given"] = True
            setup["model_original_context"] = original_context(lm)
        if self.engine.served:
            setup["engine"] = {**self.engine.describe(), "fallbacks": self.engine.fallbacks,
                               "on_vllm": [v.label for v in self.variants if self.engine.on_vllm(v)
                                           and v.label not in self.engine.fallbacks]}
        if task in self._stores:  # what its cells cost in all, over every call that computed some of them
            setup["compute"] = self._stores[task].compute()
        if not self.processes.is_main:  # the main process writes and prints the report
            return {"task": task, "setup": setup, "results": results, "table": "", "written_by_another_process": True}
        report = finish_report(task, setup, results, table, self.output, plots if self.plots else None)
        if self.output:
            remove_stale_plots(self.output, task, report.get("plots") or [])
        return report
