"""The project's structure by its own measure (scripts/check_structure.py, read with ast): today's debts
are a ceiling that a change may lower and never raise, and the measure itself finds what it claims to."""

import os
import sys
import textwrap

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))

import check_structure as S  # noqa: E402

# today's debts, a ceiling (lower these numbers as debts are paid; never raise them)
LONG_SIGNATURES: set[str] = set()
CYCLES = 0
ARGPARSE_IN_EVAL: set[str] = set()


def test_no_new_structural_debt():
    got = S.measure()
    new = {x.split(" ")[0] for x in got["long_signatures"]} - LONG_SIGNATURES
    assert not new, f"functions with more than {S.MAX_PARAMETERS} parameters: take a settings object instead: {new}"
    assert len(got["cycles"]) <= CYCLES, f"a new import cycle: {got['cycles']}"
    assert set(got["argparse_in_eval"]) <= ARGPARSE_IN_EVAL, "flags belong to cli/, not eval/"
    assert not got["upward_imports"], f"imports point down the layers of check_structure.LAYERS: " \
                                      f"{got['upward_imports']}"
    assert not got["local_imports"], f"imports of the package and the standard library go at module top: " \
                                     f"{got['local_imports']}"


def test_the_measure_finds_cycles_inside_functions_long_signatures_and_flags(tmp_path):
    package = tmp_path / "hf_posenc"
    (package / "eval").mkdir(parents=True)
    (package / "cli").mkdir()
    files = {
        "__init__.py": "",
        "a.py": "from .b import thing\n",
        "b.py": "def thing():\n    from . import a  # hidden in a function\n",
        "c.py": "def wide(self, " + ", ".join(f"p{i}" for i in range(13)) + "):\n    pass\n"
                "def fine(" + ", ".join(f"p{i}" for i in range(12)) + "):\n    pass\n",
        "cli/__init__.py": "from ..config import thing\n",
        "cli/flags.py": "",
        "eval/__init__.py": "",
        "eval/run.py": "def flags():\n    from ..cli.flags import x\n",
        "eval/plain.py": "import argparse\n",
        "eval/clean.py": "from .run import flags\n",
        "methods.py": "def late():\n    from .cli import main  # a record reaching up to the command line\n",
        "config.py": "thing = 1\n",
    }
    for name, text in files.items():
        (package / name).write_text(textwrap.dedent(text))
    got = S.measure(str(tmp_path))
    assert got["cycles"] == [["hf_posenc.a", "hf_posenc.b"]]
    assert got["long_signatures"] == ["hf_posenc.c:wide (13)"]  # self not counted; 12 is allowed
    assert got["argparse_in_eval"] == ["hf_posenc.eval.plain", "hf_posenc.eval.run"]
    assert "hf_posenc.methods -> hf_posenc.cli (records -> interface)" in got["upward_imports"]
    assert not [x for x in got["upward_imports"] if x.startswith("hf_posenc.cli")]  # down: allowed
    assert "hf_posenc.a (in no layer of LAYERS)" in got["upward_imports"]
    assert got["local_imports"] == ["hf_posenc.b:2 .", "hf_posenc.eval.run:2 ..cli.flags", "hf_posenc.methods:2 .cli"]


def test_no_environment_is_tracked():
    """The environments setup.sh makes (.venv, .venv-vllm, .venv-transformers4, .llama-cpp) are never committed, not
    even as a symlink (a tracked symlink at .venv made a checkout replace the real, ignored environment: git treats
    ignored files as expendable)."""
    import subprocess

    root = os.path.join(os.path.dirname(__file__), "..")
    done = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        import pytest

        pytest.skip("not a git checkout")
    kept = [f for f in done.stdout.splitlines()
            if f.split("/")[0] in (".venv", ".venv-vllm", ".venv-transformers4", ".llama-cpp")]
    assert not kept, f"tracked environment files: {kept[:5]}"


def test_ruff_finds_nothing_with_the_project_s_configuration():
    """``ruff check`` (pyproject.toml's [tool.ruff]: pycodestyle, pyflakes, import order, bugbear; 120 columns) over
    the package, the tests and the scripts; ruff comes with the dev extra (scripts/setup.sh installs it)."""
    import shutil
    import subprocess

    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    if ruff is None:
        import pytest

        pytest.skip("ruff is not installed (pip install '.[dev]')")
    root = os.path.join(os.path.dirname(__file__), "..")
    done = subprocess.run([ruff, "check", "--no-cache", "hf_posenc", "tests", "scripts"], cwd=root,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_structure_hook_fails_on_a_debt(tmp_path, monkeypatch, capsys):
    """``--strict`` (the pre-commit hook) exits 1 when a list is not empty, 0 on the tree as it is."""
    assert S.main(["--strict"]) == 0
    monkeypatch.setattr(S, "measure", lambda root=S.ROOT: {"long_signatures": ["m:f (13)"], "cycles": [],
                                                          "argparse_in_eval": [], "upward_imports": [],
                                                          "local_imports": []})
    assert S.main(["--strict"]) == 1 and "m:f (13)" in capsys.readouterr().out
