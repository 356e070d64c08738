"""The ``hf-posenc`` command: ``methods``, ``eval ppl|passkey|retrieval|harness``, ``tune``, ``patch``, ``finetune``,
``upload``, ``upgrade-config`` and ``serve-check``. One module per command, each with ``add_parser(sub)`` and
``run(args, command) -> exit status``; ``args`` holds the argument types and the flag groups they share."""

from __future__ import annotations

import argparse
import sys
import traceback

from ..engines.vllm_engine import EngineError
from ..io.interrupts import Terminated, sigterm_interrupts
from ..io.provenance import command_line, scrub
from ..publishing.hub import UploadError
from . import (
    eval_cmd,
    explain_cmd,
    finetune_cmd,
    methods_cmd,
    patch_cmd,
    serve_check_cmd,
    serve_config_cmd,
    tune_cmd,
    upgrade_config_cmd,
    upload_cmd,
)
from .parser import Parser

COMMANDS = {"methods": methods_cmd, "eval": eval_cmd, "tune": tune_cmd, "patch": patch_cmd,
            "finetune": finetune_cmd, "upload": upload_cmd, "upgrade-config": upgrade_config_cmd,
            "serve-check": serve_check_cmd, "serve-config": serve_config_cmd, "explain": explain_cmd}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hf-posenc", description="Change, extend and measure the positional "
                                     "encoding of Hugging Face models.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from_command_line = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # a command that relaunches itself (eval --data-parallel-size) needs its own words
    try:
        with sigterm_interrupts():  # a kill unwinds: locks released, staged folders removed
            return COMMANDS[args.command].run(args, command_line(argv, "hf-posenc"))
    except ValueError as err:
        print(f"hf-posenc: error: {scrub(str(err))}", file=sys.stderr)
        return 2
    except EngineError as err:  # the engine's reason and the end of its log
        print(f"hf-posenc: error: {scrub(str(err))}", file=sys.stderr)
        return 1
    except UploadError as err:  # the local save is complete; the message says what to rerun
        print(f"hf-posenc: error: {scrub(str(err))}", file=sys.stderr)
        return 1
    except Terminated:  # SIGTERM (an upload printed what to rerun)
        print("hf-posenc: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("hf-posenc: interrupted", file=sys.stderr)
        return 130
    except Exception:  # a failure nobody foresaw, on the command line (a caller of main(argv) gets the exception):
        if not from_command_line:  # its traceback, for a bug report, scrubbed of every secret
            raise
        print(scrub(traceback.format_exc()), file=sys.stderr, end="")
        print("hf-posenc: unexpected error (traceback above); please report it", file=sys.stderr)
        return 1
