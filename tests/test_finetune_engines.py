"""``hf-posenc finetune`` unchanged under ``accelerate launch`` with the shipped configs: 2 CPU
processes (gloo) give the losses of 1 process with the same global batch (measured: equal to 1e-6; asserted to 1e-5),
one full (unsharded) checkpoint saved once that loads back with its patch. DeepSpeed ZeRO-2/3 run when deepspeed is
installed; FSDP runs on accelerators only (accelerate trains a CPU run with the FSDP config as DDP, and says so)."""

import importlib.util
import json
import os
import sys

import pytest
import torch
from helpers import book_path, run_launched
from safetensors.torch import load_file

import hf_posenc

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")
NO_DEEPSPEED = importlib.util.find_spec("deepspeed") is None


def _argv(model, out, batch_size):
    return ["finetune", "--model", model, "--method", "yarn", "--factor", "2", "--text-file", book_path("pg1513.txt"),
            "--eval-text-file", book_path("pg84.txt"), "--seq-len", "64", "--steps", "3", "--eval-windows", "1",
            "--learning-rate", "3e-3", "--batch-size", str(batch_size), "--device", "cpu", "--no-progress",
            "--output", str(out)]


def _run(prefix, argv, cwd):
    return run_launched(prefix, argv, cwd, timeout=300)


def _config(name, folder):
    """The shipped accelerate config, its DeepSpeed file named by absolute path (the shipped one is relative to the
    repository root)."""
    with open(os.path.join(CONFIGS, "accelerate", name)) as f:
        text = f.read().replace("configs/deepspeed/", os.path.abspath(os.path.join(CONFIGS, "deepspeed")) + "/")
    path = folder / name
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def one_process(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "out"
    _run([sys.executable, "-m", "hf_posenc"], _argv(tiny_checkpoint, out, 2), out.parent)
    return out


def _launch(config, tiny_checkpoint, tmp_path):
    out = tmp_path / "two"
    done = _run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", _config(config, tmp_path),
                 "--num_processes", "2", "--main_process_port", "0", "-m", "hf_posenc"],
                _argv(tiny_checkpoint, out, 1), tmp_path)
    return out, done


def _same_training(one, two, engine):
    a, b = (json.loads((o / "hf_posenc_eval" / "finetune.json").read_text()) for o in (one, two))
    assert a["setup"]["processes"] == 1 and b["setup"]["processes"] == 2
    assert a["setup"]["engine"] == "single" and b["setup"]["engine"] == engine
    assert [x["step"] for x in a["losses"]] == [x["step"] for x in b["losses"]] == [1, 2, 3]
    for x, y in zip(a["losses"], b["losses"]):
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-5)
    assert b["heldout_after"]["ppl"] == pytest.approx(a["heldout_after"]["ppl"], rel=1e-5)
    # one full state dict: every tensor at its whole shape, the weights of the 1-process run (Adam: to 1e-4)
    whole, saved = load_file(str(one / "model.safetensors")), load_file(str(two / "model.safetensors"))
    assert sorted(whole) == sorted(saved)
    for k in whole:
        assert saved[k].shape == whole[k].shape, k
        assert torch.allclose(saved[k], whole[k], atol=1e-4), k
    assert hf_posenc.get_config(hf_posenc.from_pretrained(str(two))).method == "yarn"  # the patch kept
    leftovers = [n for n in os.listdir(two.parent) if n.startswith(".")]
    assert leftovers == [], leftovers  # saved once: no lock, no staged folder


def test_accelerate_ddp_trains_as_one_process(one_process, tiny_checkpoint, tmp_path):
    two, _ = _launch("ddp.yaml", tiny_checkpoint, tmp_path)
    _same_training(one_process, two, "ddp")


def test_accelerate_fsdp_config_on_cpu_trains_as_ddp_and_says_so(one_process, tiny_checkpoint, tmp_path):
    """accelerate 1.15 applies FSDP to accelerator processes only (AcceleratorState keeps a CPU run MULTI_CPU and
    drops the FSDP plugin): the run is data parallel, its report says ddp, and stderr says why."""
    two, done = _launch("fsdp.yaml", tiny_checkpoint, tmp_path)
    assert "accelerate left the FSDP config unused" in done.stderr
    _same_training(one_process, two, "ddp")


@pytest.mark.skipif(NO_DEEPSPEED, reason="deepspeed is not installed (pip install deepspeed)")
@pytest.mark.parametrize("stage", [2, 3])
def test_accelerate_deepspeed_zero_trains_as_one_process_and_saves_whole_weights(stage, one_process,
                                                                                 tiny_checkpoint, tmp_path):
    """ZeRO-3 partitions every parameter: the save gathers them (without it each tensor was saved empty)."""
    two, _ = _launch(f"zero{stage}.yaml", tiny_checkpoint, tmp_path)
    _same_training(one_process, two, f"deepspeed-zero{stage}")


def test_shipped_deepspeed_configs_leave_the_sizes_to_the_trainer():
    for stage in (2, 3):
        with open(os.path.join(CONFIGS, "deepspeed", f"zero{stage}.json")) as f:
            config = json.load(f)
        assert config["zero_optimization"]["stage"] == stage
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            assert config[key] == "auto", key
