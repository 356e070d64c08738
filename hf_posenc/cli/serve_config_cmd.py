"""``hf-posenc serve-config``: the launch settings under which each engine computes a saved checkpoint (or GGUF) as
hf_posenc does, or why it cannot."""

from __future__ import annotations

import json

from ..engines.launch import LAUNCHERS
from ..serving.launch_settings import serve_config
from .flags import comma_choices, positive
from .parser import DefaultsShown


def add_parser(sub) -> None:
    sc = sub.add_parser("serve-config", allow_abbrev=False, formatter_class=DefaultsShown,
                        help="print the launch settings (command, environment, files, Python keywords) under which "
                             "each serving engine computes a saved checkpoint or GGUF as hf_posenc does, or why it "
                             "cannot.")
    sc.add_argument("path", help="the checkpoint folder ('hf-posenc patch --output' wrote it) or a .gguf file "
                                 "('hf-posenc patch --gguf' wrote it).")
    sc.add_argument("--engine", type=comma_choices(list(LAUNCHERS)), default=list(LAUNCHERS),
                    help=f"the engines, comma-separated, among {', '.join(LAUNCHERS)}.")
    sc.add_argument("--max-length", type=positive, default=None,
                    help="the longest input (prompt and output) to launch for (default: the context the checkpoint "
                         "advertises; an engine that cannot compute that far says so).")
    sc.add_argument("--json", action="store_true", help="print JSON instead of text.")


def run(args, command: str) -> int:
    launches = serve_config(args.path, args.engine, args.max_length)
    if args.json:
        print(json.dumps([launch.to_dict() for launch in launches], indent=2))
    else:
        print("\n".join(launch.text() for launch in launches))
    return 0
