"""``hf-posenc eval TASK``: methods or variants side by side, as resumable cells; one sub-command per registered
eval task (:mod:`hf_posenc.eval.tasks`)."""

from __future__ import annotations

import argparse
import os

from ..flags import eval_task_flags


def add_parser(sub) -> None:
    from ..eval.tasks import registered

    tasks = registered()
    ev = sub.add_parser("eval", allow_abbrev=False, help="long-context evaluation: " + ", ".join(tasks) + ".")
    evsub = ev.add_subparsers(dest="task", required=True)
    for task in tasks.values():
        p = evsub.add_parser(task.name, allow_abbrev=False, help=task.summary, description=task.summary,
                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        eval_task_flags(p, task)
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
