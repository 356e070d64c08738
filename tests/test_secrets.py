"""Secrets never shown, recorded or put on a command line: argparse's errors, the commands recorded in
cards and reports, the vLLM worker's argv and its errors; and an engine that dies says why.

The tests marked ``needs_vllm`` start one real vLLM engine (``.venv-vllm``, as in ``test_vllm.py``); the others
stand a small script in for the engine's worker.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import textwrap

import pytest
from helpers import all_text, refused, tiny_model
from test_vllm import needs_vllm, save_tiny, vllm_python

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.io.provenance import command_line, scrub, scrub_data

SECRET = "plainSecret-42xy"  # no Hub token shape: only where it stands says it is a secret
SECRET_FLAGS = ["--token", "--tok", "--hub-token", "--hub_token", "--use-auth-token", "--use_auth_token",
                "--auth-token", "--access-token", "--api-key", "--apiKey", "--hubToken", "--password",
                "--client-secret", "--key", "--auth"]
PLAIN_FLAGS = ["--tokenizer", "--max-gen-tokens", "--key-tokens", "--key-alpha", "--key-beta", "--keys",
               "--max_new_tokens", "--pad-token-id", "--author", "--passkey-trials"]
SHAPED = "hf_" + "Q7x" * 12  # shaped like a Hub token, known to nobody
FLAGGED = "plainsecret-42"  # a value after --token: no shape, still a secret
STORED = "storedLoginToken_987654"  # what 'hf auth login' stored


# -- which flags are secret ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", SECRET_FLAGS)
def test_the_value_of_every_secret_flag_is_taken_out_of_the_recorded_command(flag):
    for argv in ([flag, SECRET, "--tokenizer", "gpt2"], [f"{flag}={SECRET}", "--tokenizer", "gpt2"]):
        recorded = command_line(argv, "train.py")
        assert SECRET not in recorded and "***" in recorded and "--tokenizer gpt2" in recorded, recorded


@pytest.mark.parametrize("flag", PLAIN_FLAGS)
def test_the_value_of_a_flag_that_only_mentions_tokens_or_keys_is_kept(flag):
    recorded = command_line([flag, "value-7", "--hub_token", SECRET], "train.py")
    assert recorded == f"train.py {flag} value-7 --hub_token ***"


def _all_flags(parser) -> set[str]:
    import argparse

    flags = {s for a in parser._actions for s in a.option_strings if s.startswith("--")}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _all_flags(sub)
    return flags


def test_every_flag_of_the_cli_keeps_its_value_in_the_recorded_command():
    """None of hf-posenc's own flags takes a secret (--tokenizer, --key-tokens, --max-gen-tokens...): each value
    shows."""
    from hf_posenc.cli import build_parser

    flags = _all_flags(build_parser())
    assert {"--tokenizer", "--key-tokens", "--max-gen-tokens", "--keys", "--engine-arg"} <= flags
    for flag in sorted(flags - {"--help"}):
        assert command_line([flag, "value-7"], "hf-posenc") == f"hf-posenc {flag} value-7", flag


def test_scrub_masks_secret_keywords_in_text_and_in_data():
    text = (f"LLM(hf_token='{SECRET}', max_num_batched_tokens=8192) HF_TOKEN={SECRET}x --engine-arg api_key={SECRET}y "
            f"{{\"hf_token\": \"{SECRET}z\", \"key\": 12}} Authorization: Bearer {SECRET}w")
    clean = scrub(text)
    assert SECRET not in clean, clean
    assert "max_num_batched_tokens=8192" in clean and '"key": 12' in clean
    data = {"setup": {"engine_args": {"hf_token": SECRET, "gpu_memory_utilization": 0.5}, "tokenizer": "gpt2",
                      "command": f"eval --engine-arg hf_token={SECRET}"},
            "results": [{"key": "71234", "passkey": "5512", "tokens": 100}]}
    clean = scrub_data(data)
    assert SECRET not in json.dumps(clean)
    assert clean["setup"]["engine_args"]["gpu_memory_utilization"] == 0.5 and clean["setup"]["tokenizer"] == "gpt2"
    assert clean["results"] == data["results"]  # a passkey and its key are data, not secrets


def test_scrub_masks_the_password_of_a_url():
    clean = scrub(f"ProxyError: cannot connect to http://me:{SECRET}@proxy.example:3128 for https://huggingface.co/x")
    assert SECRET not in clean and "http://me:***@proxy.example:3128" in clean and "https://huggingface.co/x" in clean


@pytest.mark.parametrize("text, masked", [
    (f"no data file at /tmp/https:/user:{SECRET}@example.com/d.", "https:/user:***@example.com/d"),  # a path's
    (f"'git+ssh:user:{SECRET}@host/x'", "git+ssh:user:***@host/x"),
    (f"remote user:{SECRET}@example.com/d", "user:***@example.com/d"),
    (f"GET https%3A%2F%2Fuser%3A{SECRET}%40example.com%2Fd", "https%3A%2F%2Fuser%3A***%40example.com%2Fd"),
    (f"s3://AKIAEXAMPLE:{SECRET}@bucket/key", "s3://AKIAEXAMPLE:***@bucket/key"),
])
def test_scrub_masks_a_urls_password_whatever_became_of_its_slashes(text, masked):
    clean = scrub(text)
    assert SECRET not in clean and masked in clean
    assert scrub("at 10:30:45 see http://host:8000/v1 or mail me@example.com") == \
        "at 10:30:45 see http://host:8000/v1 or mail me@example.com"  # no password there: kept as it is


def test_a_dataset_urls_password_never_comes_back_in_the_error(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """datasets quotes the URL as a path (``https:/user:PASSWORD@...``) in its error; the CLI's error masks it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "held.txt").write_text("held-out text, never trained on")
    err = refused(["finetune", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--dataset",
                   f"https://user:{SECRET}@example.com/d", "--eval-text-file", "held.txt", "--output", "out"], capsys)
    assert "--dataset 'https://user:***@example.com/d'" in err and SECRET not in err
    assert sorted(os.listdir(tmp_path)) == ["held.txt"]


# -- argparse never echoes a secret ----------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--token", "--use-auth-token", "--hub-token", "--hub_token", "--auth-token",
                                  "--access-token", "--password"])
def test_a_secret_flag_before_a_sub_command_is_never_echoed(flag, capsys):
    """``eval --token SECRET`` made argparse take SECRET for the task: ``invalid choice: 'SECRET'``."""
    err = refused(["eval", flag, SECRET, "ppl"], capsys)
    assert SECRET not in err and "invalid choice: '***'" in err
    err = refused([flag, SECRET, "eval", "ppl"], capsys)
    assert SECRET not in err


@pytest.mark.parametrize("flag", ["--use-auth-token", "--hub-token", "--hub_token", "--auth-token", "--access-token"])
def test_an_unrecognised_secret_flag_is_named_and_its_value_hidden(flag, capsys):
    err = refused(["patch", "--method", "yarn", "--factor", "2", "--output", "o", flag, SECRET], capsys)
    assert f"unrecognized arguments: {flag} ***" in err and SECRET not in err
    err = refused(["patch", "--method", "yarn", "--factor", "2", "--output", "o", f"{flag}={SECRET}"], capsys)
    assert f"unrecognized arguments: {flag}=***" in err and SECRET not in err


def test_no_unrecognised_value_is_echoed_whatever_its_flag(capsys):
    err = refused(["upload", "folder", "me/x", "--credentials-file", SECRET, "stray-word"], capsys)
    assert "unrecognized arguments: --credentials-file *** ***" in err and SECRET not in err
    err = refused(["eval", "--verbose", SECRET, "ppl"], capsys)  # taken for the task: still hidden
    assert SECRET not in err


@pytest.mark.parametrize("value", [f"hf_token:{SECRET}", f"hf_token {SECRET}", f"api_key:{SECRET}"])
def test_a_mistyped_engine_arg_holding_a_token_is_not_quoted_back(value, capsys):
    err = refused(["eval", "ppl", "--engine-arg", value], capsys)
    assert "argument --engine-arg: expected KEY=VALUE" in err and SECRET not in err
    err = refused(["eval", "ppl", "--engine-arg", "gpu_memory_utilization:0.5"], capsys)
    assert "got 'gpu_memory_utilization:0.5'" in err  # a plain mistake is still shown as typed


def test_an_error_about_the_tokenizer_still_shows_its_value(capsys):
    err = refused(["eval", "ppl", "--lengths", "zero", "--tokenizer", "my/tokenizer"], capsys)
    assert "'zero'" in err  # a recognised flag's bad value is named, as ever
    assert "tokenizer my/tokenizer" in scrub("cannot load --tokenizer my/tokenizer")


# -- a script's own token flag never reaches the card -------------------------------------------------------------

def test_a_scripts_hub_token_flag_never_reaches_the_model_card(tmp_path, monkeypatch, bert_tokenizer):
    monkeypatch.setattr(sys, "argv", ["train.py", "--tokenizer", "bert", "--hub_token", SECRET, "--use-auth-token",
                                      SECRET + "2", f"--hub-token={SECRET}3", "--engine-arg", f"hf_token={SECRET}4"])
    model = tiny_model("llama", vocab_size=bert_tokenizer.vocab_size)
    hf_posenc.patch(model, "yarn", factor=2.0)
    hf_posenc.save_pretrained(model, str(tmp_path / "out"), bert_tokenizer)
    saved = all_text(tmp_path / "out")
    assert SECRET not in saved
    assert "train.py --tokenizer bert --hub_token *** --use-auth-token *** --hub-token=*** --engine-arg " \
           "hf_token=***" in saved


# -- upload's rerun line pastes back -------------------------------------------------------------------------------

def test_the_rerun_line_of_a_failed_upload_is_shell_quoted(tmp_path):
    from hub_server import HubServer

    from hf_posenc.publishing.hub import UploadError, upload

    folder = tmp_path / "my model's \"final\" copy"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with HubServer("hf_" + "Z" * 30) as hub:
        hub.state.fault = "drop"
        with pytest.raises(UploadError) as err:
            upload(str(folder), "me/x", revision="my branch", token=SECRET, endpoint=hub.url, timeout=5)
    message = str(err.value)
    assert SECRET not in message
    line = message.split("rerun: ", 1)[1]
    assert shlex.split(line) == ["hf-posenc", "upload", str(folder), "me/x", "--revision", "my branch"]


# -- the vLLM worker: no secret on its command line; a death explained --------------------------------------------

FAKE_WORKER = textwrap.dedent("""
    import json, sys
    mode = {mode!r}
    print("vLLM starting, engine args in use", file=sys.stderr, flush=True)
    print(json.dumps({{"ready": True, "max_model_len": 64, "version": "fake"}}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if "op" not in req:
            continue  # the spec, given on standard input
        if mode == "die":
            print("Traceback (most recent call last):", file=sys.stderr)
            print("  File 'core.py', line 1, in step", file=sys.stderr)
            print("RuntimeError: out of memory in the engine core (hf_token={secret})", file=sys.stderr)
            for i in range(3):
                print(f"(EngineCore pid=7) shutting down {{i}}", file=sys.stderr)
            sys.stderr.flush()
            print(json.dumps({{"error": "request", "message": "EngineDeadError: EngineCore encountered an issue. "
                              "See stack trace (above) for the root cause."}}), flush=True)
            sys.exit(1)
        print(json.dumps({{"results": [[1]]}}), flush=True)
""")


def _fake_worker(tmp_path, monkeypatch, mode: str) -> None:
    import hf_posenc.engines.vllm_engine as vllm_engine

    path = tmp_path / f"worker_{mode}.py"
    path.write_text(FAKE_WORKER.format(mode=mode, secret=SECRET))
    monkeypatch.setattr(vllm_engine, "WORKER", str(path))


def test_an_engine_that_dies_mid_request_says_why_and_keeps_its_log(tmp_path, monkeypatch):
    from hf_posenc.engines.vllm_engine import EngineError, VllmEngine

    _fake_worker(tmp_path, monkeypatch, "die")
    engine = VllmEngine(str(tmp_path), python=sys.executable, engine_args={"hf_token": SECRET})
    with pytest.raises(EngineError) as err:
        engine.ask({"op": "generate", "prompts": [[1, 2]], "max_tokens": 1, "stop": []})
    engine.close()
    message = str(err.value)
    assert "out of memory in the engine core" in message and engine.log in message
    assert SECRET not in message and os.path.isfile(engine.log)
    os.remove(engine.log)


def test_the_log_of_an_engine_that_served_well_is_removed(tmp_path, monkeypatch):
    from hf_posenc.engines.vllm_engine import VllmEngine

    _fake_worker(tmp_path, monkeypatch, "serve")
    with VllmEngine(str(tmp_path), python=sys.executable) as engine:
        assert engine.ask({"op": "generate", "prompts": [[1]], "max_tokens": 1, "stop": []}) == [[1]]
        assert os.path.isfile(engine.log)
    assert not os.path.exists(engine.log)


def test_the_workers_command_line_holds_no_engine_argument(tmp_path, monkeypatch):
    """The spec (with ``hf_token``) goes on standard input: ``ps`` shows every process's argv to every user."""
    import subprocess

    import hf_posenc.engines.vllm_engine as vllm_engine
    from hf_posenc.engines.vllm_engine import EngineError, VllmEngine

    seen = []

    class Spy(subprocess.Popen):
        def __init__(self, args, *rest, **kwargs):
            seen.append(list(args))
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(vllm_engine.subprocess, "Popen", Spy)
    monkeypatch.setenv("PYTHONPATH", "/nowhere")  # the worker finds no vllm here: it says so, after reading its spec
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the engine's log goes
    with pytest.raises(EngineError) as err:
        VllmEngine(str(tmp_path), python=sys.executable, engine_args={"hf_token": SECRET})
    assert seen and SECRET not in " ".join(seen[0]) and SECRET not in str(err.value)
    assert "vllm" in str(err.value).lower()
    assert not list(tmp_path.glob("hf_posenc_vllm_*"))  # an empty log is not kept (nor named)


@needs_vllm
def test_a_real_engine_runs_without_its_token_on_any_command_line(tmp_path, bert_tokenizer):
    """One real engine start: the token given as an engine argument is on no command line of the worker or of the
    processes vLLM starts; the engine serves; its log goes once it closed well."""
    from hf_posenc.engines.vllm_engine import VllmEngine

    folder = save_tiny(tmp_path / "plain", bert_tokenizer)
    with VllmEngine(folder, python=vllm_python(), engine_args={"hf_token": SECRET}) as engine:
        lines = [_cmdline(pid) for pid in _tree(engine.proc.pid)]
        assert lines and not [line for line in lines if SECRET in line], lines
        assert len(engine.ask({"op": "generate", "prompts": [[5, 6, 7]], "max_tokens": 2, "stop": []})[0]) == 2
    assert not os.path.exists(engine.log)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        here = todo.pop()
        found.append(here)
        for task in os.listdir(f"/proc/{here}/task"):
            try:
                with open(f"/proc/{here}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
    return found


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode("utf-8", "replace")


def test_an_unforeseen_failure_prints_its_traceback_scrubbed(monkeypatch, capsys):
    from hf_posenc import cli

    secret = "hf_" + "Q" * 30

    def broken(args, command):
        raise RuntimeError(f"deep failure near {secret}")

    monkeypatch.setattr(cli.methods_cmd, "run", broken)
    with pytest.raises(RuntimeError):  # a program calling main(argv) gets the exception itself
        cli.main(["methods"])
    monkeypatch.setattr(sys, "argv", ["hf-posenc", "methods"])
    assert cli.main() == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: deep failure near ***" in err and secret not in err
    assert "unexpected error" in err


# -- tokens of every kind: out of the recorded command, the card and the reports --------------------------------
@pytest.fixture
def stored_login(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    path = tmp_path / "hf_home" / "token"
    path.parent.mkdir()
    path.write_text(STORED)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(path))
    monkeypatch.setenv("HF_TOKEN", "envTokenValue_1234")
    return path


def test_scrub_takes_out_every_kind_of_token(stored_login):
    text = (f"push.py {SHAPED} --token {FLAGGED} --hf-token='{FLAGGED}x' --api-key=abc12345 "
            f"envTokenValue_1234 server said: bad token {STORED}")
    clean = scrub(text, "argumentToken_55")
    for secret in (SHAPED, FLAGGED, "abc12345", "envTokenValue_1234", STORED):
        assert secret not in clean
    assert clean.startswith("push.py *** --token *** --hf-token=*** --api-key=*** *** server said: bad token ***")
    assert scrub("uses argumentToken_55 here", "argumentToken_55") == "uses *** here"
    assert scrub("model hf_posenc-yarn, tokens 4096") == "model hf_posenc-yarn, tokens 4096"  # not secrets


def test_a_token_on_the_command_line_never_reaches_the_card_or_the_reports(tmp_path, monkeypatch, stored_login,
                                                                         bert_tokenizer):
    monkeypatch.setattr(sys, "argv", ["push.py", SHAPED, "--token", FLAGGED, STORED])
    assert command_line() == "push.py *** --token *** ***"
    model = tiny_model("llama", vocab_size=bert_tokenizer.vocab_size)
    hf_posenc.patch(model, "yarn", factor=2.0)
    report = {"task": "perplexity", "table": f"| method | 64 tokens |\n|---|---|\n| yarn {SHAPED} | 11.00 |",
              "setup": {"lengths": [64], "documents": ["a.txt"], "command": f"eval --token {FLAGGED}"},
              "results": {"yarn": {"64": {"ppl": 11.0}}}}
    hf_posenc.save_pretrained(model, str(tmp_path / "out"), bert_tokenizer, eval_results=[report])
    saved = all_text(tmp_path / "out")
    assert "push.py *** --token ***" in saved  # the command is recorded, without its secrets
    for secret in (SHAPED, FLAGGED, STORED, "envTokenValue_1234"):
        assert secret not in saved


def test_the_cli_records_its_command_without_the_token(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "envTokenValue_1234")
    out = tmp_path / "ppl"
    argv = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none", "--lengths", "32", "--max-windows", "1",
            "--corpus", "python-docs", "--output", str(out), "--no-plots", "--no-progress", "--dataset-config",
            f"--token={SHAPED}"]
    argv[argv.index("--dataset-config")] = "--split"  # a harmless flag whose value is a secret-shaped string
    argv[-1] = SHAPED
    assert main(argv) == 0
    saved = json.loads((out / "perplexity.json").read_text())
    assert saved["setup"]["command"].endswith("--split ***")
    assert SHAPED not in all_text(out) and SHAPED not in capsys.readouterr().out
