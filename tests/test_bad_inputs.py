"""Bad input and secrets: every refused input is refused by name, and no token ever leaves the machine."""

import json
import sys

import pytest

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.provenance import command_line, scrub
from conftest import all_text, tiny_model

SHAPED = "hf_" + "Q7x" * 12  # shaped like a Hub token, known to nobody
FLAGGED = "plainsecret-42"  # a value after --token: no shape, still a secret
STORED = "storedLoginToken_987654"  # what 'hf auth login' stored


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


def _refused(argv, capsys) -> str:
    """Run the CLI; it must exit with status 2 and one error line, no traceback. Returns stderr."""
    try:
        rc = main(argv)
    except SystemExit as stop:  # argparse's own refusal
        rc = stop.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("argv,message", [
    (["eval", "ppl", "--max-windows", "-1"], "argument --max-windows: expected an integer >= 1, got '-1'"),
    (["eval", "ppl", "--max-windows", "0"], "argument --max-windows: expected an integer >= 1, got '0'"),
    (["eval", "ppl", "--stride", "0"], "argument --stride: expected an integer >= 1, got '0'"),
    (["eval", "ppl", "--limit", "0"], "argument --limit: expected an integer >= 1, got '0'"),
    (["eval", "ppl", "--buckets", "0"], "argument --buckets: expected an integer >= 1, got '0'"),
    (["eval", "ppl", "--chunk-size", "0"], "argument --chunk-size: expected an integer >= 1, got '0'"),
    (["eval", "ppl", "--lengths", ""], "argument --lengths: expected one or more comma-separated integers >= 1, got ''"),
    (["eval", "passkey", "--lengths", ""], "argument --lengths: expected one or more comma-separated integers >= 1"),
    (["eval", "passkey", "--depths", ""], "argument --depths: expected one or more comma-separated numbers, got ''"),
    (["eval", "passkey", "--depths", "0.5,1.5"], "argument --depths: depths are fractions of the filler between 0 and 1"),
    (["eval", "ppl", "--methods", ""], "argument --methods: expected one or more comma-separated names, got ''"),
    (["eval", "ppl", "--methods", "yarn,none,yarn"], "argument --methods: yarn listed more than once in 'yarn,none,yarn'"),
    (["eval", "passkey", "--trials", "0"], "argument --trials: expected an integer >= 1, got '0'"),
    (["finetune", "--method", "alibi", "--output", "x", "--eval-text-file", "y", "--steps", "0"],
     "argument --steps: expected an integer >= 1, got '0'"),
])
def test_cli_refuses_bad_numbers_and_lists_by_name(argv, message, capsys):
    assert message in _refused(argv, capsys)


def test_eval_refuses_a_knob_no_method_takes(tiny_checkpoint, tmp_path, capsys):
    err = _refused(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn", "--method-param",
                    "beta_fastt=16", "--lengths", "32", "--corpus", "python-docs", "--output", str(tmp_path / "o")],
                   capsys)
    assert "--method-param beta_fastt: no method of this run takes it (methods ['none', 'yarn'] take: " in err
    assert not (tmp_path / "o").exists()


def test_patch_refuses_outputs_it_must_not_write_before_any_compute(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import hf_posenc.eval.common as common

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(common, "load_model_and_tokenizer", no_load)
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me")
    base = ["patch", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2"]
    assert f"--output '{a_file}' is an existing file" in _refused(base + ["--output", str(a_file)], capsys)
    assert "is the folder of the model being patched" in _refused(base + ["--output", tiny_checkpoint], capsys)
    err = _refused(base + ["--output", str(tmp_path / "o"), "--private"], capsys)
    assert "--private and --revision apply to an upload: add --push-to-hub" in err
    assert a_file.read_text() == "keep me" and not (tmp_path / "o").exists()


def test_a_failing_patch_leaves_the_output_as_it_was(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    import hf_posenc.hub as hub

    out = tmp_path / "out"
    assert main(["patch", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--output", str(out),
                 "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    real = hub.save_tokenizer

    def broken(*args, **kwargs):  # the weights are written by now: a failure half-way through the save
        real(*args, **kwargs)
        raise ValueError("disk full (simulated)")

    monkeypatch.setattr(hub, "save_tokenizer", broken)
    assert "disk full (simulated)" in _refused(["patch", "--model", tiny_checkpoint, "--method", "pi", "--factor",
                                                "2", "--output", str(out), "--no-progress"], capsys)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # the yarn save, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no partial folder left beside it
