"""What the command line's values are: argument types (each a clear error naming the bad value), the flag groups
several commands share, and the method configuration a command was given."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from ..checkpoints.models import DEFAULT_MODEL
from ..config import PosEncConfig
from ..config_syntax import parse_method_params
from ..eval import params as P
from ..eval.settings import LoadSettings, OutputSettings
from ..io.documents import DocumentSource, check_encoding
from ..methods import DEFAULT_FACTOR, resolve_method


def argument_type(read):
    """An argparse type of a reader of :mod:`hf_posenc.eval.params` (its ValueError said as the flag's error)."""
    def parse(text: str):
        try:
            return read(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = read.__name__
    parse.__doc__ = read.__doc__
    return parse


ints, floats, depths = argument_type(P.ints), argument_type(P.floats), argument_type(P.depths)
positive, positive_float, names = argument_type(P.positive), argument_type(P.positive_float), argument_type(P.names)
seed = argument_type(P.seed)


def comma_choices(allowed: list[str]):
    """An argument type: comma-separated names among ``allowed``, at least one, each once."""
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [n for n in names if n not in allowed]
        if not names or bad or len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"expected comma-separated names among {', '.join(allowed)} (each once), "
                                             f"got {text!r}")
        return names

    return parse


def memory(text: str) -> dict:
    """``0=20GiB,cpu=64GiB`` -> {0: "20GiB", "cpu": "64GiB"} (accelerate's max_memory)."""
    out: dict = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        device, eq, size = item.partition("=")
        if not eq or not size.strip() or not device.strip():
            raise argparse.ArgumentTypeError(f"expected DEVICE=SIZE,... (e.g. 0=20GiB,cpu=64GiB), got {text!r}")
        device = device.strip()
        out[int(device) if device.isdigit() else device] = size.strip()
    if not out:
        raise argparse.ArgumentTypeError(f"expected DEVICE=SIZE,... (e.g. 0=20GiB,cpu=64GiB), got {text!r}")
    return out


def encoding(text: str) -> str:
    try:
        return check_encoding(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def encoding_flag(g) -> None:
    g.add_argument("--encoding", type=encoding, default="utf-8",
                   help="the text files' encoding; a file not valid in it is refused by name.")


def data_flags(p: argparse.ArgumentParser, split: str, purpose: str):
    """Where the text comes from: files, folders or a Hugging Face dataset."""
    d = p.add_argument_group("data")
    d.add_argument("--text-file", action="append",
                   help=f"a {purpose}text file (Gutenberg header/footer dropped); repeatable.")
    d.add_argument("--text-dir", action="append", help=f"a folder of {purpose}.txt/.md files, one document each; "
                   "repeatable.")
    d.add_argument("--dataset", help=f"{purpose}data from a Hugging Face dataset: Hub name (pg19, ...) or a "
                   "save_to_disk folder.")
    d.add_argument("--dataset-config", help="the dataset's configuration name, if it has several.")
    d.add_argument("--split", default=split, help="dataset split.")
    d.add_argument("--column", default="text", help="dataset column holding the text.")
    encoding_flag(d)
    return d


def document_source(args):
    """The documents asked for by a command with the flags of :func:`data_flags`, ``--limit`` and ``--corpus``, as
    a :class:`hf_posenc.io.documents.DocumentSource` (none of them given: the default corpus)."""
    return DocumentSource(args.text_file, args.text_dir, args.dataset, args.dataset_config, args.split, args.column,
                          getattr(args, "limit", None), getattr(args, "corpus", None), args.encoding)


def upload_flags(g) -> None:
    g.add_argument("--private", action="store_true", default=None, help="create the repo private.")
    g.add_argument("--revision", default=None, help="branch to commit to (created from main if missing).")
    g.add_argument("--commit-message", default=None,
                   help="commit message (default: 'Upload model patched by hf_posenc').")
    g.add_argument("--timeout", type=positive_float, default=60.0,
                   help="seconds to wait for the Hub to answer one request before the upload gives up.")


def _knob_flags_given(args) -> list[str]:
    """Which of the flags that set a configuration's knobs a command was given."""
    return [flag for flag, value in (("--factor", args.factor), ("--method-param", args.method_param),
                                     ("--original-max-position-embeddings",
                                      getattr(args, "original_max_position_embeddings", None))) if value is not None]


def file_config(args):
    given = (["--method"] if args.method is not None else []) + _knob_flags_given(args)
    if given:
        raise ValueError(f"--config {args.config} holds the whole configuration: drop {', '.join(given)}")
    try:
        with open(args.config, encoding="utf-8") as f:
            return PosEncConfig.from_json(f.read(), as_text=True)  # its fields refused as their text form is
    except OSError as err:
        raise ValueError(f"--config {args.config}: cannot read it ({err.strerror})") from None
    except (json.JSONDecodeError, TypeError, KeyError) as err:
        raise ValueError(f"--config {args.config}: not a PosEncConfig JSON file ({err})") from None


def method_config(args, named: str = "--method"):
    """The configuration of ``--config FILE``, of ``--method`` in the config syntax, or of a bare ``--method`` with
    ``--factor`` (2 when not given, for a method that takes one) and ``--method-param``; ``named``: what the command
    calls its method in messages (explain's is a positional)."""
    if getattr(args, "config", None):
        return file_config(args)
    if not args.method:
        raise ValueError("give --method (see 'hf-posenc methods') or --config FILE")
    if ":" in args.method:  # the config syntax holds the knobs itself
        given = _knob_flags_given(args)
        if given:
            raise ValueError(f"{named} {args.method} holds its knobs already: drop {', '.join(given)}, or give "
                             "them in it")
        return PosEncConfig.parse(args.method)

    knobs = parse_method_params(args.method_param)
    name = resolve_method(args.method).name
    params = {**knobs.pop("*", {}), **knobs.pop(name, {})}
    if knobs:  # METHOD.KEY=VALUE for a method other than the one applied
        raise ValueError(f"--method-param names {sorted(knobs)}, but {named} is {name!r}; use KEY=VALUE or "
                         f"{name}.KEY=VALUE")
    factor = args.factor if args.factor is not None or not resolve_method(name).uses_factor else DEFAULT_FACTOR
    return PosEncConfig(name, factor, getattr(args, "original_max_position_embeddings", None), params)


def engine_arg(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` (the value read as JSON, else kept as text): one more keyword of ``vllm.LLM``."""
    key, eq, raw = text.partition("=")
    if not eq or not key.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY a vllm.LLM keyword (e.g. "
                                         f"gpu_memory_utilization=0.8), got {text!r}")
    try:
        return key.strip(), json.loads(raw)
    except json.JSONDecodeError:
        return key.strip(), raw


def engine_flags(g) -> None:
    """How the vLLM engine runs: its Python, its parallelism, more of its keywords."""
    g.add_argument("--engine-python", default=None, metavar="PYTHON",
                   help="the Python interpreter that has vLLM (default: $HF_POSENC_VLLM_PYTHON, else this one; "
                        "'bash scripts/setup.sh --vllm' makes .venv-vllm/bin/python).")
    g.add_argument("--tensor-parallel-size", type=positive, default=1,
                   help="GPUs one vLLM engine spreads the model over (vLLM's tensor_parallel_size).")
    g.add_argument("--engine-arg", type=engine_arg, action="append", default=[], metavar="KEY=VALUE",
                   help="one more vllm.LLM keyword, e.g. gpu_memory_utilization=0.8 or max_num_batched_tokens=8192 "
                        "(values read as JSON); repeatable.")


@dataclass(frozen=True)
class LoadFlags:
    """Which model and how it loads: ``--model``, ``--tokenizer``, ``--dtype``, ``--device`` (and, where a command
    takes them, ``--attn-implementation``, ``--device-map``, ``--max-memory``), defined here once for every command.
    A command says which of them it takes, its defaults and how its help words them; :meth:`settings` reads them
    back as one :class:`hf_posenc.eval.settings.LoadSettings`. ``model`` None: the command takes no ``--model`` (it
    names its checkpoint otherwise); ``device`` None: no default, the command picks one (finetune: cuda where there
    is one)."""

    model: str | None = DEFAULT_MODEL
    model_help: str = "Hub id, local folder, .gguf file or alias."
    tokenizer_help: str | None = "where the tokenizer comes from when the model's folder has none (Hub id, folder or " \
                                 "alias)."
    dtype_help: str = "float32, bfloat16 or float16."
    device: str | None = "cpu"
    device_help: str = "torch device, e.g. cpu or cuda."
    attention: bool = False
    placement: bool = False

    def add(self, g) -> None:
        """The flags, into the argument group (or parser) ``g``."""
        self.add_model(g)
        self.add_loading(g)

    def add_model(self, g) -> None:
        """``--model`` alone (a command that shows the rest elsewhere calls :meth:`add_loading` there)."""
        if self.model is not None:
            g.add_argument("--model", default=self.model, help=self.model_help)

    def add_loading(self, g) -> None:
        """The flags of how the model loads, all but ``--model``."""
        if self.tokenizer_help is not None:
            g.add_argument("--tokenizer", default=None, help=self.tokenizer_help)
        g.add_argument("--dtype", default="float32", help=self.dtype_help)
        g.add_argument("--device", default=self.device, help=self.device_help)
        if self.attention:
            g.add_argument("--attn-implementation", default=None, help="transformers attention implementation (sdpa, "
                           "eager, flash_attention_2); default: the model's.")
        if self.placement:
            g.add_argument("--device-map", default=None, help="'auto': spread a model too big for one device over all "
                           "of them (accelerate big-model inference, one process); --device is then not used.")
            g.add_argument("--max-memory", type=memory, default=None, metavar="DEVICE=SIZE,...",
                           help="with --device-map: how much of each device to use, e.g. 0=20GiB,1=20GiB,cpu=64GiB.")

    def settings(self, args: argparse.Namespace, model: str | None = None) -> LoadSettings:
        """The :class:`LoadSettings` of the parsed flags (``model``: the checkpoint when the command takes no
        ``--model``)."""
        if args.device is None:
            raise ValueError("give --device: this command picks none by itself")
        return LoadSettings(model if self.model is None else args.model, args.dtype, args.device,
                            args.attn_implementation if self.attention else None,
                            args.tokenizer if self.tokenizer_help is not None else None,
                            args.device_map if self.placement else None, args.max_memory if self.placement else None)


@dataclass(frozen=True)
class OutputFlags:
    """Where a resumable run's results go and how it shows itself: ``--output`` (its cells resume there),
    ``--overwrite``, ``--seed``, ``--no-progress``, ``--no-plots``, defined once for the commands that keep cells
    (eval, tune); :meth:`settings` reads them back as one :class:`hf_posenc.eval.settings.OutputSettings`."""

    output_help: str
    required: bool = False
    seed_help: str = "random seed (keys, sampling); same seed, same numbers."
    plots_help: str = "skip the PNG plots."

    def add(self, g) -> None:
        """The flags, into the argument group (or parser) ``g``."""
        g.add_argument("--output", required=self.required, default=None, help=self.output_help)
        g.add_argument("--overwrite", action="store_true", help="discard finished cells of another setup in --output "
                       "instead of refusing to mix them.")
        g.add_argument("--seed", type=seed, default=0, help=self.seed_help)
        g.add_argument("--no-progress", action="store_true", help="hide the progress bars.")
        g.add_argument("--no-plots", action="store_true", help=self.plots_help)

    @staticmethod
    def settings(args: argparse.Namespace, command: str | None) -> OutputSettings:
        """The :class:`OutputSettings` of the parsed flags (``command``: the command line the report records)."""
        return OutputSettings(args.output, args.overwrite, not args.no_progress, not args.no_plots, command)


def method_flags(g, *, required: bool = False, config_file: bool = False) -> None:
    """The method a command applies: ``--method``, ``--factor``, ``--method-param`` (and ``--config FILE``, its JSON
    form, with ``--original-max-position-embeddings`` where ``config_file``); :func:`method_config` reads them."""
    g.add_argument("--method", required=required, default=None, metavar="METHOD[:KEY=VALUE,...]",
                   help="the method to apply (see 'hf-posenc methods'), alone or with its knobs in the config syntax, "
                        "e.g. yarn:factor=4,beta_fast=16.")
    if config_file:
        g.add_argument("--config", default=None, metavar="FILE", help="a PosEncConfig JSON file (e.g. best.json of "
                       "'hf-posenc tune') in place of --method/--factor/--method-param; a tune.json beside it puts the "
                       "tuning table into the model card.")
    g.add_argument("--factor", type=float, default=None, help=f"context-extension factor (methods that take one; "
                   f"default: {DEFAULT_FACTOR:g}).")
    if config_file:
        g.add_argument("--original-max-position-embeddings", type=int, default=None,
                       help="the context the model was trained for, when its config does not say it right.")
    method_param_flag(g, "a knob of the method, e.g. beta_fast=16 or 'layer_types=[\"full_attention\"]' (values "
                      "are read as JSON); repeatable.")


def method_param_flag(g, help: str, per_method: bool = False) -> None:
    """``--method-param``: one knob, ``KEY=VALUE`` (``[METHOD.]KEY=VALUE`` where a command compares several
    methods); repeatable; :func:`hf_posenc.config_syntax.parse_method_params` reads it."""
    g.add_argument("--method-param", action="append", metavar="[METHOD.]KEY=VALUE" if per_method else "KEY=VALUE",
                   help=help)
