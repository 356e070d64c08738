"""The documentation: the README's first screen, its table of what is supported generated from the method
records, the reference pages generated from the parsers and the records, and the site built with mkdocs --strict."""

import html
import os
import re
import shutil
import subprocess
import sys

import pytest

from hf_posenc.cli import reference_docs
from hf_posenc.method_listing import list_methods

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_the_readme_opens_with_the_two_commands_and_stays_short():
    text = _readme()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert blocks[0].startswith("bash scripts/setup.sh && .venv/bin/hf-posenc eval ppl")  # the main job
    assert blocks[1].strip() == ("bash scripts/setup.sh --vllm --llama-cpp --transformers4 && "
                                 ".venv/bin/python -m pytest -q -n 2 --dist loadfile tests")
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        assert blocks[1].strip() in f.read()  # CI runs the test command written in the README
    lines = text.splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: reference belongs in docs/"
    assert any(line.startswith("## Quick start") for line in lines[:60]), "the Quick start within the first screens"


def test_the_readmes_support_table_is_the_one_the_method_records_give():
    text = _readme()
    assert reference_docs.with_support_table(text) == text, "run: python scripts/support_table.py --write"
    for name in list_methods():
        assert f"| `{name}` |" in text


def test_every_sub_command_and_every_method_has_its_generated_reference():
    cli = reference_docs.cli_reference()
    names = list(reference_docs.subcommands())
    assert {"methods", "tune", "patch", "finetune", "upload", "serve-check", "serve-config", "explain", "eval ppl",
            "eval passkey"} <= set(names)
    for name in names:
        assert f"## hf-posenc {name}\n" in cli
    assert "--checkpoint-every" in cli and "--engine {vllm,llama.cpp}" in cli  # the flags as the parsers have them
    methods = reference_docs.methods_reference()
    for name in list_methods():
        assert f"\n## {name}\n" in methods
    assert "llama.cpp: same up to L" in methods  # dynamic_ntk's record, as written


def test_the_site_builds_strictly(tmp_path):
    if shutil.which("mkdocs", path=os.path.dirname(sys.executable)) is None:
        pytest.skip("mkdocs is not installed (pip install '.[docs]')")
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mkdocs"), "build", "--strict",
                           "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "hf-posenc finetune" in cli and "--checkpoint-every" in cli
    assert "dynamic_ntk" in (tmp_path / "site" / "methods" / "index.html").read_text()
    assert (tmp_path / "site" / "fine-tuning" / "index.html").exists()
    index = (tmp_path / "site" / "index.html").read_text()  # the README's sections, as the README has them now
    assert "<table>" in index and "| `yarn` |" not in index and "<code>dca</code>" in index  # the support table
    found = re.search(r"^## What it found\n\n.*?(\d+\.\d\d)", _readme(), re.M | re.S).group(1)
    assert found in index and 'href="benchmarks/"' in index and 'href="docs/' not in index
    assert "What it found" not in open(os.path.join(ROOT, "docs", "index.md"), encoding="utf-8").read().replace(
        "<!-- README: What it found -->", "")  # included, never copied
    started = html.unescape(re.sub(r"<[^>]+>", "", (tmp_path / "site" / "getting-started" / "index.html").read_text()))
    assert all(command.strip() in started for command in re.findall(r"```bash\n(.*?)```", _readme(), re.S)[:3])
    assert "PosEncConfig.parse" in started
    # the benchmarks page is BENCHMARKS.md as it is when the site is built, never a copy of it left to go stale
    assert "\n## " not in open(os.path.join(ROOT, "docs", "benchmarks.md"), encoding="utf-8").read()
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    sections = [line[3:].split("`")[0].strip() for line in open(os.path.join(ROOT, "BENCHMARKS.md"), encoding="utf-8")
                if line.startswith("## ")]
    assert len(sections) > 10 and all(html.escape(s, quote=False) in benchmarks for s in sections)
    gallery = (tmp_path / "site" / "explain" / "index.html").read_text()  # hf-posenc explain's pictures, drawn
    assert "yarn:factor=2" in gallery and (tmp_path / "site" / "explain" / "yarn" / "wavelengths.png").exists()
    assert (tmp_path / "site" / "explain" / "dca" / "positions.png").exists()


def test_the_python_fine_tuning_example_imports_what_it_names_and_calls_finetune_with_its_keywords():
    """docs/fine-tuning.md's Python block: its imports exist, every keyword it gives finetune() is a parameter, every
    settings class takes the keywords given it, and its fresh-clone split of the built-in corpus passes the held-out
    check it says it passes."""
    import ast
    import inspect

    from hf_posenc.io.documents import builtin_corpus, check_heldout

    page = open(os.path.join(ROOT, "docs", "fine-tuning.md"), encoding="utf-8").read()
    code = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "finetune(" in b)
    tree, names = ast.parse(code), {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            exec(compile(ast.Module([node], []), "docs", "exec"), names)
    calls = [n for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names]
    assert {c.func.id for c in calls} >= {"finetune", "TrainSettings", "PoseSettings", "LoraSettings", "builtin_corpus"}
    for call in calls:
        taken = inspect.signature(names[call.func.id]).parameters
        assert {k.arg for k in call.keywords} <= set(taken), (call.func.id, [k.arg for k in call.keywords])
    docs = builtin_corpus()
    check_heldout(docs[1:3], docs[3:], None)  # the example's split: no held-out passage in the training documents
