"""The launch recipes serve-config prints (and model cards embed), run as a user pastes them: bash runs the shell
lines with each engine's binaries replaced by stubs that record their argv. For every engine and for folder and
GGUF names holding spaces, quotes, ``$``, backticks, newlines and ``EOF``, the lines write exactly the files the
launch announces, nothing else, and pass every command its arguments intact -- or the launch refuses the name by
name. And a context past what an engine's own settings hold is refused."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess

import pytest

from hf_posenc.engines.launch import LAUNCHERS, Launch
from hf_posenc.serving.launch_settings import engine_launch, serve_config, served_of

HOSTILE = ["plain", "with space", "it's", 'say "hi"', "cost $HOME", "tick `touch TICKED`", "$(touch DOLLAR)",
           "line\nbreak", "x\nEOF\ntouch PWNED\ncat > /dev/null <<'EOF'", "EOF", "EOF\n", "semi;colon&pipe|",
           "-dash", "back\\slash", "star*?[ab]", "tab\there", "trail ", "ünïcode", "a!b", "```fence", "#hash"]
ORIGINAL = 512
PLAIN = {"model_type": "llama", "max_position_embeddings": ORIGINAL, "hidden_size": 64, "num_attention_heads": 4,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
STUB = '#!/bin/sh\nprintf \'%s\\0\' "$#" "$(basename "$0")" "$@" >> "$RECORD"\n'
UNWRITABLE_IN_A_MODELFILE = ('"', "\n")


def served(tmp_path, name: str, gguf: bool):
    """A plain LLaMA checkpoint as serve-config describes it, its folder (or .gguf file) named ``name``."""
    folder = served_of(PLAIN, {}, str(tmp_path / "models" / name))
    if not gguf:
        return folder
    return dataclasses.replace(folder, path=str(tmp_path / "models" / (name + ".gguf")), gguf=True)


def _stubs(root, launch: Launch) -> str:
    os.makedirs(root, exist_ok=True)
    for argv in [*launch.steps, launch.command]:
        path = os.path.join(root, argv[0])
        with open(path, "w") as f:
            f.write(STUB)
        os.chmod(path, 0o755)
    return root


def _recorded(path: str) -> list[list[str]]:
    if not os.path.exists(path):
        return []
    fields, calls = open(path, "rb").read().decode("utf-8", "surrogateescape").split("\0")[:-1], []
    while fields:
        count = int(fields[0])
        calls.append(fields[1:count + 2])
        fields = fields[count + 2:]
    return calls


def run_pasted(tmp_path, launch: Launch, script: str) -> tuple[dict[str, str], list[list[str]], str]:
    """Run ``script`` with bash in an empty folder, the launch's binaries stubbed: (the files it left there, the
    argv of each stub call, stderr)."""
    work, record = tmp_path / "work", tmp_path / "record"
    work.mkdir(parents=True)
    stubs = _stubs(str(tmp_path / "stubs"), launch)
    env = {"PATH": f"{stubs}:{os.environ['PATH']}", "RECORD": str(record), "HOME": str(tmp_path)}
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, timeout=60)
    files = {name: (work / name).read_bytes().decode("utf-8", "surrogateescape") for name in os.listdir(work)}
    return files, _recorded(str(record)), done.stderr.decode(errors="replace") + f"(exit {done.returncode})"


def launch_gguf(checkpoint) -> str:
    """The GGUF path the Modelfile names for ``checkpoint`` (the file itself, or the folder's conversion)."""
    from hf_posenc.engines.launch.llama_cpp import gguf_of

    return gguf_of(checkpoint)[0]


def _refuses_by_name(launch: Launch, path: str) -> bool:
    return launch.computes == "cannot" and repr(path) in launch.reason


@pytest.mark.parametrize("gguf", [False, True], ids=["folder", "gguf"])
@pytest.mark.parametrize("name", HOSTILE, ids=[repr(n) for n in HOSTILE])
@pytest.mark.parametrize("engine", list(LAUNCHERS))
def test_the_shell_lines_write_the_announced_files_and_pass_each_argument_intact(tmp_path, engine, name, gguf):
    checkpoint = served(tmp_path, name, gguf)
    launch = engine_launch(engine, checkpoint, None)
    if launch.command is None:
        if engine == "ollama" and any(c in name for c in UNWRITABLE_IN_A_MODELFILE):
            assert _refuses_by_name(launch, launch_gguf(checkpoint)), launch.reason
        return
    if engine == "ollama":
        assert not any(c in name for c in UNWRITABLE_IN_A_MODELFILE), "a name a Modelfile cannot hold was written"
    files, calls, err = run_pasted(tmp_path, launch, "\n".join(launch.shell()) + "\n")
    assert err == "(exit 0)" and files == launch.files, (err, files)
    assert calls == [*launch.steps, launch.command]


def _ollama_from(modelfile: str) -> str:
    """The FROM value of a Modelfile as Ollama's parser (parser/parser.go) reads it: the rest of the line, trimmed;
    between triple or single double quotes, what is inside them, with no escapes."""
    (line,) = [line for line in modelfile.split("\n") if line.startswith("FROM ")]
    value = line[len("FROM "):].strip(" \t")
    for quote in ('"""', '"'):
        if value.startswith(quote):
            assert len(value) >= 2 * len(quote) and value.endswith(quote), value
            return value[len(quote):-len(quote)]
    return value


OLLAMA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{1,79}")  # Ollama's types/model/name.go, a model part


@pytest.mark.parametrize("name", [*HOSTILE, "model.gguf "], ids=[repr(n) for n in [*HOSTILE, "model.gguf "]])
def test_the_modelfile_names_the_gguf_as_ollama_reads_it_and_the_model_name_is_one_ollama_takes(tmp_path, name):
    for gguf in (False, True):
        checkpoint = served(tmp_path, name, gguf)
        if name == "model.gguf ":
            checkpoint = dataclasses.replace(checkpoint, path=str(tmp_path / name), gguf=True)
        launch = engine_launch("ollama", checkpoint, None)
        if launch.command is None:
            assert any(c in name for c in UNWRITABLE_IN_A_MODELFILE)
            assert _refuses_by_name(launch, launch_gguf(checkpoint)), launch.reason
            continue
        assert _ollama_from(launch.files["Modelfile"]) == launch_gguf(checkpoint)
        model = launch.command[-1]
        assert OLLAMA_NAME.fullmatch(model) and ".." not in model, model
        assert launch.steps[-1][:3] == ["ollama", "create", model]


def test_a_crafted_gguf_name_runs_nothing_when_the_printed_lines_are_pasted(tmp_path):
    checkpoint = served(tmp_path, "x\nEOF\ntouch PWNED\ncat > /dev/null <<'EOF'", gguf=True)
    launch = engine_launch("ollama", checkpoint, None)
    if launch.command is not None:  # written: it must be written safely
        files, _, err = run_pasted(tmp_path, launch, "\n".join(launch.shell()) + "\n")
        assert "PWNED" not in files and files == launch.files, (files, err)
    else:
        assert _refuses_by_name(launch, checkpoint.path) and "Modelfile" in launch.reason


def test_a_body_holding_the_delimiter_gets_another_one():
    body = "FROM x\nEOF\nEOF_1\nPARAMETER num_ctx 8\n"
    launch = Launch("Ollama", "not measured", "r", command=["ollama", "run", "x"], files={"Modelfile": body})
    head, *rest = launch.shell()
    end = head.split("<<", 1)[1].strip("'")
    assert end not in body and rest[rest.index(end) - 1] == "PARAMETER num_ctx 8"
    with pytest.raises(ValueError, match="ending with a line break; \\['Modelfile'\\]"):
        Launch("Ollama", "not measured", "r", command=["ollama"], files={"Modelfile": "FROM x"})


def _fenced(text: str) -> list[str]:
    """The shell blocks of serve-config's text: each fenced block (three or more backticks) opened as bash."""
    return [m.group(2) for m in re.finditer(r"^(`{3,})bash\n(.*?)^\1$", text, re.S | re.M)]


@pytest.mark.parametrize("name", ["plain", "with space", "EOF", "tick `id`"])
def test_the_printed_text_runs_as_printed(tmp_path, name, capsys):
    """serve-config's text output, its shell block pasted as it is printed."""
    from hf_posenc.cli import main

    folder = tmp_path / "models" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(PLAIN))
    assert main(["serve-config", str(folder)]) == 0
    out = capsys.readouterr().out
    launches = [launch for launch in serve_config(str(folder)) if launch.command]
    blocks = _fenced(out)
    assert len(blocks) == len(launches) and any(launch.files for launch in launches), out
    for i, (launch, block) in enumerate(zip(launches, blocks)):
        assert block == "\n".join(launch.shell()) + "\n"
        files, calls, err = run_pasted(tmp_path / str(i), launch, block)
        assert err == "(exit 0)" and files == launch.files and calls == [*launch.steps, launch.command], err


def test_the_model_card_embeds_each_engines_lines_in_a_bash_block():
    from hf_posenc.serving.launch_settings import card_launches

    for launch in card_launches(PLAIN, {}, "me/tiny"):
        if launch["shell"]:
            assert launch["fence"].startswith("```") and launch["fence"] not in launch["shell"]


# ---- a context past what an engine's settings hold ------------------------------------------------------------------

HUGE = 99999999999999999999


@pytest.mark.parametrize("engine", list(LAUNCHERS))
def test_a_context_past_what_the_engine_takes_is_refused_by_name(tmp_path, engine):
    for gguf in (False, True):
        for checkpoint in (served(tmp_path, "m", gguf),
                           dataclasses.replace(served(tmp_path, "m", gguf), context=HUGE)):  # one that states it
            for length in (HUGE, None, 2**32):
                launch = engine_launch(engine, checkpoint, length)
                assert launch.max_length is None or launch.max_length < 2**32, (engine, launch)
                asked = checkpoint.context if length is None else length
                assert asked < 2**31 or str(asked) not in "\n".join(launch.shell()), launch


def test_llama_cpp_refuses_a_ctx_size_past_its_32_bit_int(tmp_path, capsys):
    from hf_posenc.cli import main

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(PLAIN))
    assert main(["serve-config", str(folder), "--engine", "llama.cpp", "--max-length", str(HUGE)]) == 0
    out = capsys.readouterr().out
    assert "## llama.cpp: cannot" in out and "--ctx-size 9" not in out
    assert f"at most {2**31 - 1:,} tokens" in out and f"not {HUGE:,}" in out
    (ok,) = serve_config(str(folder), ["llama.cpp"], 2**31 - 1)
    assert ok.command[-2:] == ["--ctx-size", str(2**31 - 1)]
