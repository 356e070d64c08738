"""``hf-posenc finetune`` unchanged under torchrun: 2 processes on CPU (gloo) give the losses of
1 process with the same global batch, one process saves one checkpoint that keeps its patch, and no lock stays."""

import json
import os
import sys

import pytest
from helpers import book_path, run_launched

import hf_posenc


def _argv(model, out, batch_size):
    return ["finetune", "--model", model, "--method", "yarn", "--factor", "2", "--text-file", book_path("pg1513.txt"),
            "--eval-text-file", book_path("pg84.txt"), "--seq-len", "64", "--steps", "4", "--eval-windows", "1",
            "--learning-rate", "3e-3", "--batch-size", str(batch_size), "--device", "cpu", "--no-progress",
            "--output", str(out), "--eval-length", "96", "--eval-needle-depths", "0.5", "--eval-needle-trials", "1"]


def _run(prefix, argv, cwd):
    return run_launched(prefix, argv, cwd, timeout=600)


def test_two_processes_train_as_one_with_the_same_global_batch(tiny_checkpoint, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, "-m", "hf_posenc"], _argv(tiny_checkpoint, one, 2), tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "hf_posenc"],
         _argv(tiny_checkpoint, two, 1), tmp_path)
    a, b = (json.loads((o / "hf_posenc_eval" / "finetune.json").read_text()) for o in (one, two))
    assert a["setup"]["processes"] == 1 and b["setup"]["processes"] == 2
    assert a["setup"]["blocks_seen"] == b["setup"]["blocks_seen"] == 4 * 2  # global: steps x batch x processes
    assert [x["step"] for x in a["losses"]] == [x["step"] for x in b["losses"]] == [1, 2, 3, 4]
    for x, y in zip(a["losses"], b["losses"]):  # measured: equal to 1e-6
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-5)
    assert b["heldout_after"]["ppl"] == pytest.approx(a["heldout_after"]["ppl"], rel=1e-5)
    assert b["heldout_after"]["ppl"] != pytest.approx(b["heldout_before"]["ppl"], rel=1e-6)  # it trained
    long_a, long_b = a["long_context"]["after"], b["long_context"]["after"]  # each process computes it, one saves
    assert long_b["past_original"]["ppl"] == pytest.approx(long_a["past_original"]["ppl"], rel=1e-5)
    assert long_b["truncated"]["ppl"] == pytest.approx(long_a["truncated"]["ppl"], rel=1e-5)
    assert long_b["needles"]["by_depth"]["0.5"]["trials"] == 1
    assert hf_posenc.get_config(hf_posenc.from_pretrained(str(two))).method == "yarn"  # saved once, patch kept
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".")]
    assert leftovers == [], leftovers  # no lock, no staged folder
