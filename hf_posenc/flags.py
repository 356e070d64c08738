"""What the command line's values are: argument types (each a clear error naming the bad value), the flag groups
several commands share, and the method configuration a command was given."""

from __future__ import annotations

import argparse
import json

from .eval import params as P
from .config import PosEncConfig
from .config_syntax import parse_method_params
from .eval.data import DocumentSource, check_encoding
from .methods import DEFAULT_FACTOR, resolve_method


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
    a :class:`hf_posenc.eval.data.DocumentSource` (none of them given: the default corpus)."""
    return DocumentSource(args.text_file, args.text_dir, args.dataset, args.dataset_config, args.split, args.column,
                          getattr(args, "limit", None), getattr(args, "corpus", None), args.encoding)


def upload_flags(g) -> None:
    g.add_argument("--private", action="store_true", default=None, help="create the repo private.")
    g.add_argument("--revision", default=None, help="branch to commit to (created from main if missing).")
    g.add_argument("--commit-message", default=None, help="commit message (default: 'Upload model patched by hf_posenc').")
    g.add_argument("--timeout", type=positive_float, default=60.0,
                   help="seconds to wait for the Hub to answer one request before the upload gives up.")


def file_config(args):
    given = [flag for flag, value in (("--method", args.method), ("--factor", args.factor),
                                      ("--method-param", args.method_param)) if value is not None]
    if given:
        raise ValueError(f"--config {args.config} holds the whole configuration: drop {', '.join(given)}")
    try:
        with open(args.config, encoding="utf-8") as f:
            return PosEncConfig.from_json(f.read(), as_text=True)  # its fields refused as their text form is
    except OSError as err:
        raise ValueError(f"--config {args.config}: cannot read it ({err.strerror})") from None
    except (json.JSONDecodeError, TypeError, KeyError) as err:
        raise ValueError(f"--config {args.config}: not a PosEncConfig JSON file ({err})") from None


def method_config(args):
    if getattr(args, "config", None):
        return file_config(args)
    if not args.method:
        raise ValueError("give --method (see 'hf-posenc methods') or --config FILE")

    knobs = parse_method_params(args.method_param)
    name = resolve_method(args.method).name
    params = {**knobs.pop("*", {}), **knobs.pop(name, {})}
    if knobs:  # METHOD.KEY=VALUE for a method other than the one applied
        raise ValueError(f"--method-param names {sorted(knobs)}, but --method is {name!r}; use KEY=VALUE or "
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
