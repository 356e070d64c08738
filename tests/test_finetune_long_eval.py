"""The long-context evaluation of hf-posenc finetune: perplexity past L with its truncated baseline
and needles in the held-out prose, before and after training; the numbers of eval ppl / eval passkey on that model."""

import json
import re

import pytest
import torch
from helpers import ORIGINAL, book_path, ids, refused, tiny_model

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.config import as_config
from hf_posenc.io.documents import read_text_file
from hf_posenc.training.long_eval import LongEval, LongEvalSettings

NEEDLES = ["--eval-needle-depths", "0.2,0.9", "--eval-needle-trials", "2"]


def _argv(checkpoint, out, *extra):
    return ["finetune", "--model", checkpoint, "--method", "yarn", "--factor", "2", "--text-file",
            book_path("pg1513.txt"), "--eval-text-file", book_path("pg84.txt"), "--seq-len", "64", "--steps", "3",
            "--learning-rate", "3e-3", "--eval-windows", "1", "--output", str(out), "--no-progress", *extra]


def _report(out):
    return json.loads((out / "hf_posenc_eval" / "finetune.json").read_text())


def _eval_ppl(model, tok, checkpoint, config, length):
    """What hf-posenc eval ppl --lengths N --max-windows 1 gives on ``model`` (the held-out book as its text)."""
    from hf_posenc.checkpoints.models import resolve_source
    from hf_posenc.eval.run_ppl import run_perplexity

    rep = run_perplexity(lengths=[length], docs=[read_text_file(book_path("pg84.txt"))], max_windows=1,
                         methods=[config], loaded=(model, tok, resolve_source(checkpoint)), progress=False, plots=False,
                         model=checkpoint)
    baseline = rep["setup"]["truncated_baseline"]["label"]
    mine = next(r for label, r in rep["results"].items() if label != baseline)[str(length)]
    return mine, rep["results"][baseline][str(length)]


def _same_ppl(section, mine, truncated):
    assert section["ppl"] == pytest.approx(mine["ppl"], rel=1e-6)
    assert section["past_original"]["ppl"] == pytest.approx(mine["past_original"]["ppl"], rel=1e-6)
    assert section["past_original"]["from"] == mine["past_original"]["from"]
    assert section["truncated"]["past_original"]["ppl"] == pytest.approx(truncated["past_original"]["ppl"], rel=1e-6)
    assert section["context_gain"] == pytest.approx(mine["context_gain"], rel=1e-6)


def _fresh(checkpoint, config):
    from hf_posenc.checkpoints.runtime import load_model_and_tokenizer

    lm, tok, _ = load_model_and_tokenizer(checkpoint, "float32", "cpu")
    return hf_posenc.patch(lm, config), tok


def test_pose_run_reports_eval_ppl_and_passkey_numbers_before_and_after_and_the_card_shows_them(
        tiny_checkpoint, tmp_path, capsys):
    from hf_posenc.checkpoints.models import resolve_source
    from hf_posenc.eval.run_passkey import run_passkey

    out = tmp_path / "ft"
    assert main(_argv(tiny_checkpoint, out, "--pose-window", "32", "--target-length", "128", *NEEDLES)) == 0
    printed = capsys.readouterr().out
    report = _report(out)
    section = report["long_context"]
    assert (section["length"], section["original_context"]) == (128, ORIGINAL)  # PoSE's target by default
    assert report["setup"]["long_eval"] == {"length": 128, "needle_depths": [0.2, 0.9], "needle_trials": 2}
    config = as_config(report["setup"]["method"])

    model, tok = _fresh(tiny_checkpoint, config)  # the model before training, computed independently
    _same_ppl(section["before"], *_eval_ppl(model, tok, tiny_checkpoint, config, 128))
    keys = run_passkey(lengths=[128], depths=[0.2, 0.9], trials=2, haystack="text",
                       docs=[read_text_file(book_path("pg84.txt"))], methods=[config],
                       loaded=(model, tok, resolve_source(tiny_checkpoint)), progress=False, plots=False,
                       model=tiny_checkpoint)
    got = next(iter(keys["results"].values()))
    for depth in (0.2, 0.9):
        cell = got["cells"][f"128@{depth}"]
        assert section["before"]["needles"]["by_depth"][f"{depth:g}"]["accuracy"] == cell["accuracy"]
        assert section["before"]["needles"]["by_depth"][f"{depth:g}"]["trials"] == 2
    assert section["before"]["needles"]["beyond_reach"] == got["beyond_reach"]["128"]
    assert section["before"]["needles"]["beyond_reach"]["trials"] >= 1  # a needle at 0.2 of 128 lies before L

    saved = hf_posenc.from_pretrained(str(out)).eval()  # the saved model: the method, and the numbers of "after"
    assert hf_posenc.get_config(saved).method == "yarn"
    # (its own configuration restated: the saved model; yarn x2 asked again would extend it to 4L)
    _same_ppl(section["after"], *_eval_ppl(saved, tok, tiny_checkpoint, hf_posenc.get_config(saved), 128))
    assert section["after"]["past_original"]["ppl"] != section["before"]["past_original"]["ppl"]  # it trained
    assert section["after"]["truncated"]["ppl"] != section["before"]["truncated"]["ppl"]

    for text in (printed, (out / "README.md").read_text(), (out / "hf_posenc_eval" / "finetune.md").read_text()):
        assert "Long context, held-out text at 128 tokens (original context L = 64" in text
        for row in ("before training (yarn)", "truncated to L, before training", "after training (yarn)",
                    "truncated to L, after training"):
            assert f"| {row} |" in text
        assert "| needles @0.2 | needles @0.9 | needles beyond L |" in text


def test_lora_run_at_full_length_with_an_explicit_eval_length(tiny_checkpoint, tmp_path):
    pytest.importorskip("peft")
    from hf_posenc.training.lora import load_lora

    out = tmp_path / "ft"
    assert main(_argv(tiny_checkpoint, out, "--lora-r", "4", "--eval-length", "96", "--eval-needle-trials", "0")) == 0
    report = _report(out)
    section = report["long_context"]
    assert section["length"] == 96 and section["needle_trials"] == 0 and "needles" not in section["before"]
    config = as_config(report["setup"]["method"])
    model, tok = _fresh(tiny_checkpoint, config)  # LoRA starts as the identity: the numbers of the patched model
    _same_ppl(section["before"], *_eval_ppl(model, tok, tiny_checkpoint, config, 96))
    trained = load_lora(str(out)).eval().get_base_model()  # its adapters in place; the patch is the base model's
    _same_ppl(section["after"], *_eval_ppl(trained, tok, tiny_checkpoint, hf_posenc.get_config(trained), 96))
    assert section["after"]["ppl"] != section["before"]["ppl"]
    assert "needles" not in report["table"] and "| after training (yarn) |" in report["table"]


@pytest.mark.parametrize("extra,message", [
    (["--eval-length", "64"], "--eval-length 64 is within the model's original context \\(64\\)"),
    (["--pose-window", "32", "--target-length", "128", "--eval-length", "48"],
     "--eval-length 48 is within the model's original context \\(64\\)"),
    (["--eval-length", "128", "--eval-needle-depths", "0.5,1.5"],
     "--eval-needle-depths must be one or more fractions in \\[0, 1\\].*got \\[0.5, 1.5\\]"),
    (["--eval-length", "128", "--eval-needle-trials", "-1"], "--eval-needle-trials must be an integer >= 0.*got -1"),
    (["--no-long-eval", "--eval-length", "128"], "--eval-length shape the long-context evaluation that --no-long-eval"),
    (["--eval-needle-trials", "2"], "--eval-needle-trials shape the long-context evaluation, which runs at"),
    (["--eval-length", "10000000"], "too little held-out text for --eval-length 10000000: the longest held-out"),
])
def test_bad_long_eval_input_is_refused_before_the_model_loads(extra, message, tiny_checkpoint, tmp_path, capsys,
                                                               monkeypatch):
    import hf_posenc.checkpoints.runtime as runtime

    def never(*args, **kwargs):
        raise AssertionError("loaded the model before the refusal")

    monkeypatch.setattr(runtime, "load_model_and_tokenizer", never)
    err = refused(_argv(tiny_checkpoint, tmp_path / "ft", *extra), capsys)
    assert re.search(message, err), err
    assert not (tmp_path / "ft").exists()


def test_no_long_eval_skips_it(tiny_checkpoint, tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("evaluated")

    monkeypatch.setattr(LongEval, "measure", never)
    out = tmp_path / "ft"
    assert main(_argv(tiny_checkpoint, out, "--pose-window", "32", "--target-length", "128", "--no-long-eval")) == 0
    report = _report(out)
    assert "long_context" not in report and report["setup"]["long_eval"] is None
    assert "Long context" not in report["table"] and "Long context" not in (out / "README.md").read_text()
    assert LongEvalSettings().length_for(None) is None and LongEvalSettings().length_for(128) == 128


@pytest.mark.parametrize("method", ["yarn", "learned", "dynamic_ntk"])
def test_the_evaluation_leaves_the_patch_the_weights_and_the_mode_as_they_were(method, bert_tokenizer):
    """The truncated baseline patches the model with 'none'; a learned table re-created when the method is applied
    again gets its trained values back, and requires_grad and the training mode are kept."""
    factor = 3.0 if method == "learned" else 2.0  # a table of 192 rows: the needle's answer goes past 128
    model = hf_posenc.patch(tiny_model("llama", vocab_size=bert_tokenizer.vocab_size), method, factor=factor)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # as if trained: not what re-applying the patch would initialise
    model.model.embed_tokens.weight.requires_grad_(False)
    config = hf_posenc.get_config(model)
    x = ids(100)
    with torch.no_grad():
        expected = model(x).logits
    model.train()
    weights = {name: t.detach().clone() for name, t in model.state_dict().items()}
    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    same = {name: p for name, p in model.named_parameters()}
    settings = LongEvalSettings(128, (0.5,), 1)
    long_eval = LongEval(bert_tokenizer, [read_text_file(book_path("pg84.txt"))], settings, 128, ORIGINAL, 0, False)
    got = long_eval.measure(model, "test")
    assert got["truncated"]["past_original"]["ppl"] > 0 and got["needles"]["by_depth"]["0.5"]["trials"] == 1
    for past in (got["past_original"], got["truncated"]["past_original"]):  # every token from position L on
        assert (past["from"], past["tokens"]) == (ORIGINAL, 128 - ORIGINAL)
    assert model.training and hf_posenc.get_config(model) == config
    now = model.state_dict()
    assert now.keys() == weights.keys() and all(torch.equal(now[k], v) for k, v in weights.items())
    assert {name: p.requires_grad for name, p in model.named_parameters()} == grads
    kept = {name: p is same[name] for name, p in model.named_parameters()}
    if method == "learned":  # the table was re-created, with the trained values copied in
        assert kept.pop("model.hf_posenc_positions.weight") is False
    assert all(kept.values())  # every other parameter (all of them for a patch of hooks and buffers) is the same
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x).logits, expected)
    again = long_eval.measure(model, "again")  # and measuring again gives the same numbers
    assert again["past_original"]["ppl"] == got["past_original"]["ppl"]
    assert again["truncated"]["ppl"] == got["truncated"]["ppl"] and not model.training
