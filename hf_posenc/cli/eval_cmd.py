"""``hf-posenc eval TASK``: methods or variants side by side, as resumable cells; one sub-command per registered
eval task (:mod:`hf_posenc.eval.tasks`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from ..eval.tasks import get_task, registered
from .eval_flags import add_params_flags, add_run_flags, params_from_args, run_settings
from .parser import DefaultsShown


def add_parser(sub) -> None:
    tasks = registered()
    ev = sub.add_parser("eval", allow_abbrev=False, help="long-context evaluation: " + ", ".join(tasks) + ".")
    evsub = ev.add_subparsers(dest="task", required=True)
    for task in tasks.values():
        p = evsub.add_parser(task.name, allow_abbrev=False, help=task.summary, description=task.summary,
                             formatter_class=DefaultsShown)
        add_run_flags(p, task)
        add_params_flags(p, task.params)


def relaunch(argv: list[str], processes: int) -> int:
    """The same command under torchrun with ``processes`` processes (less the flag that asked for it)."""
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
    if getattr(args, "data_parallel_size", 1) > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        if args.engine == "transformers":
            raise ValueError("--data-parallel-size runs vLLM engines side by side: add --engine vllm (for "
                             "transformers, launch with torchrun or accelerate yourself)")
        return relaunch(args.argv, args.data_parallel_size)

    task = get_task(args.task)
    params = params_from_args(task, args)  # documents are named, not read, here: the task reads them first
    report = task.run(run_settings(args, task, command), params)
    if report.get("written_by_another_process"):  # the main process prints it
        return 0
    print(report["table"])
    if args.output:
        print(f"\nresults: {args.output}/ (JSON, Markdown table" + (", PNG plots)" if not args.no_plots else ")"))
    return 0
