"""``hf-posenc methods``: the methods, their knobs and the families they support."""

from __future__ import annotations

import json

from ..method_listing import list_methods


def add_parser(sub) -> None:
    m = sub.add_parser("methods", allow_abbrev=False,
                       help="list the methods, their knobs and the families they support.")
    m.add_argument("--json", action="store_true", help="print JSON instead of a table.")


def run(args, command: str) -> int:
    _print_methods(args.json)
    return 0


def _print_methods(as_json: bool) -> None:
    methods = list_methods()
    if as_json:
        print(json.dumps(methods, indent=2))
        return
    for name, info in methods.items():
        alias = f" (aliases: {', '.join(info['aliases'])})" if info["aliases"] else ""
        print(f"{name}{alias}: {info['summary']}")
        if info["params"]:
            print("    knobs: " + ", ".join(f"{k}={v}" for k, v in info["params"].items()))
        print("    families: " + ", ".join(info["families"]))
        if info["engines"]:
            print("    engines: " + ", ".join(f"{e} ({c.replace('_', ' ')})" for e, c in info["engines"].items()))
