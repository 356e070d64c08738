"""The project's structure by its own measure (issue 41), read from the source with ``ast`` (nothing is imported):

- functions and methods with more than 12 parameters (entry points should take settings objects instead);
- import cycles between the package's modules, imports inside functions included (a cycle hidden in a function is
  still a cycle);
- modules of ``hf_posenc/eval/`` that import argparse or anything of ``hf_posenc.cli`` (flags belong to ``cli/``);
- imports inside functions of the package's own modules or of the standard library (they go at module top; a
  function-level import is for a heavy or optional third-party package: vllm, peft, lm_eval, matplotlib, ...);
- imports that point up: the package's modules sit in the layers of :data:`LAYERS` (pure math and records at the
  bottom, the command line at the top), and a module imports from its own layer or those below; a module in no
  layer is reported too, so that a new one is placed.

``tests/test_structure.py`` holds the counts of today as a ceiling: a change may lower them, never raise them.

    python scripts/check_structure.py            # the three lists
    python scripts/check_structure.py --counts   # one line of counts
    python scripts/check_structure.py --strict   # exit status 1 unless every list is empty
"""

from __future__ import annotations

import argparse
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "hf_posenc"
MAX_PARAMETERS = 12

# the layers, bottom first: a module imports from its own layer or those below. A name is a package or module
# under hf_posenc ("" is the package's __init__); the longest name that starts a module's dotted path places it, so
# a package sits in one layer and the few of its modules that lower layers read are named in theirs.
LAYERS = (
    ("basics", ("_version", "io", "encodings", "checkpoints.models", "checkpoints.compat",
                "checkpoints.legacy_rope")),
    ("records", ("methods", "config_syntax", "config")),
    ("patching", ("adapters", "patching", "checkpoints", "serving.freezing", "serving.dual_chunk_config",
                  "serving.gguf_file", "serving.gguf_compose", "method_listing")),
    ("engines", ("engines", "serving.support")),
    ("measuring", ("eval", "tuning", "explaining")),
    ("training, publishing and serving", ("training", "publishing", "serving")),
    ("interface", ("_moved", "cli", "__main__", "")),
)


def modules(root: str = ROOT) -> dict[str, str]:
    """Dotted module name -> file path, for every module of the package."""
    found = {}
    for folder, _, files in os.walk(os.path.join(root, PACKAGE)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _tree(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def long_signatures(found: dict[str, str]) -> list[str]:
    """``module:function (N)`` for every function with more than MAX_PARAMETERS parameters (self/cls not counted;
    ``*args``/``**kwargs`` count one each)."""
    out = []
    for name, path in sorted(found.items()):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]
                count = len([p for p in params if p.arg not in ("self", "cls")])
                if count > MAX_PARAMETERS:
                    out.append(f"{name}:{node.name} ({count})")
    return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(found: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in the file, inside functions too)."""
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        is_package = path.endswith("__init__.py")
        edges = set()
        for node in ast.walk(_tree(path)):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in found else base for alias in node.names]
            for target in targets:
                while target and target not in found:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith(PACKAGE):
                    edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted (a package's ``__init__``
    importing its submodules is an import like any other)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def edges(v: str) -> list[str]:
        return sorted(graph.get(v, ()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def argparse_in_eval(found: dict[str, str], graph: dict[str, set[str]]) -> list[str]:
    """Modules of ``hf_posenc.eval`` that import argparse or anything of ``hf_posenc.cli`` (its flags)."""
    out = []
    for name, path in sorted(found.items()):
        if not name.startswith(f"{PACKAGE}.eval"):
            continue
        tree = _tree(path)
        plain = any(isinstance(n, ast.Import) and any(a.name == "argparse" for a in n.names) for n in ast.walk(tree))
        plain = plain or any(isinstance(n, ast.ImportFrom) and n.module == "argparse" for n in ast.walk(tree))
        cli = [d for d in graph.get(name, ()) if d == f"{PACKAGE}.cli" or d.startswith(f"{PACKAGE}.cli.")]
        if plain or cli:
            out.append(name)
    return out


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module`` (by the longest name of the layers that starts its path under the
    package), None when in none."""
    inner = module.split(".", 1)[1] if "." in module else ""
    parts = inner.split(".") if inner else [""]
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        found = next((i for i, (_, names) in enumerate(LAYERS) if name in names), None)
        if found is not None:
            return found
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b (layer x -> layer y)`` for every import from a lower layer to a higher one, and ``a (no layer)``."""
    out = []
    for name in sorted(graph):
        mine = layer_of(name)
        if mine is None:
            out.append(f"{name} (in no layer of LAYERS)")
            continue
        for target in sorted(graph[name]):
            theirs = layer_of(target)
            if theirs is not None and theirs > mine:
                out.append(f"{name} -> {target} ({LAYERS[mine][0]} -> {LAYERS[theirs][0]})")
    return out


def local_imports(found: dict[str, str]) -> list[str]:
    """``module:line name`` for every import inside a function of the package's own modules or the standard
    library (one inside ``try``, which a module some Pythons lack may fail, excepted)."""
    std = set(sys.stdlib_module_names)
    out = []
    for name, path in sorted(found.items()):
        for fn in ast.walk(_tree(path)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            guarded = {x for t in ast.walk(fn) if isinstance(t, ast.Try) for s in t.body for x in ast.walk(s)}
            for node in ast.walk(fn):
                if node in guarded:
                    continue
                if isinstance(node, ast.Import):
                    out += [f"{name}:{node.lineno} {a.name}" for a in node.names
                            if a.name.split(".")[0] in std or a.name.startswith(PACKAGE)]
                elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PACKAGE)
                                                           or (node.module or "").split(".")[0] in std):
                    out.append(f"{name}:{node.lineno} {'.' * node.level}{node.module or ''}")
    return out


def measure(root: str = ROOT) -> dict[str, list]:
    found = modules(root)
    graph = import_graph(found)
    return {"long_signatures": long_signatures(found), "cycles": cycles(graph),
            "argparse_in_eval": argparse_in_eval(found, graph), "upward_imports": upward_imports(graph),
            "local_imports": local_imports(found)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--counts", action="store_true", help="print one line of counts instead of the lists.")
    p.add_argument("--strict", action="store_true", help="exit with status 1 when any list is not empty (the "
                                                          "pre-commit hook).")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    got = measure()
    if args.counts:
        print(", ".join(f"{k}: {len(v)} (modules in cycles: {sum(map(len, v))})" if k == "cycles" else f"{k}: {len(v)}"
                        for k, v in got.items()))
        return 0
    print(f"Functions with more than {MAX_PARAMETERS} parameters ({len(got['long_signatures'])}):")
    print("".join(f"  {x}\n" for x in got["long_signatures"]), end="")
    print(f"Import cycles ({len(got['cycles'])}):")
    print("".join(f"  {' <-> '.join(c)}\n" for c in got["cycles"]), end="")
    print(f"eval modules importing argparse or hf_posenc.cli ({len(got['argparse_in_eval'])}):")
    print("".join(f"  {x}\n" for x in got["argparse_in_eval"]), end="")
    print(f"Imports from a lower layer to a higher one ({len(got['upward_imports'])}):")
    print("".join(f"  {x}\n" for x in got["upward_imports"]), end="")
    print(f"Imports inside functions of the package or the standard library ({len(got['local_imports'])}):")
    print("".join(f"  {x}\n" for x in got["local_imports"]), end="")
    return 1 if args.strict and any(got.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
