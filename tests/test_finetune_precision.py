"""bf16 where the device supports it: ``--mixed-precision bf16`` trains under autocast over float32
weights and optimizer state; what a device cannot compute is refused before any compute."""

import pytest
import torch
from helpers import book_path, refused, tiny_model

import hf_posenc
from hf_posenc.training.finetune import _train, check_mixed_precision
from hf_posenc.training.settings import TrainSettings


def _run(mixed_precision: str):
    model = hf_posenc.patch(tiny_model("llama"), "yarn", factor=2.0)
    model.config._attn_implementation = "sdpa"
    blocks = torch.randint(0, 96, (6, 48), generator=torch.Generator().manual_seed(0))
    seen = []
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    losses, _ = _train(model, blocks, None, TrainSettings(steps=3, batch_size=2, learning_rate=1e-3,
                                                          gradient_checkpointing=False, device="cpu",
                                                          mixed_precision=mixed_precision), progress=False)
    hook.remove()
    return [x["loss"] for x in losses], model, set(seen)


def test_bf16_autocast_computes_in_bf16_and_keeps_float32_weights():
    full, _, full_dtypes = _run("no")
    half, model, half_dtypes = _run("bf16")
    assert full_dtypes == {torch.float32} and half_dtypes == {torch.bfloat16}  # the layers ran in bf16
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the weights stayed float32
    assert hf_posenc.get_config(model).method == "yarn"
    assert half != full  # not the float32 run under another name
    assert half == pytest.approx(full, abs=0.05)  # bf16 rounding, not another computation


@pytest.mark.parametrize("args, said", [
    (("fp16", "float32", "cpu"), "--mixed-precision fp16 needs a CUDA device"),
    (("bf16", "bfloat16", "cpu"), "--dtype bfloat16 already loads the weights in it"),
    (("half", "float32", "cpu"), "--mixed-precision must be one of no, bf16, fp16, got 'half'"),
])
def test_what_the_device_cannot_compute_is_refused(args, said):
    with pytest.raises(ValueError, match=said):
        check_mixed_precision(*args)


def test_cli_refuses_fp16_on_cpu_before_loading(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import hf_posenc.checkpoints.runtime as runtime

    monkeypatch.setattr(runtime, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("loaded the model"))
    err = refused(["finetune", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--text-file",
                   book_path("pg1513.txt"), "--eval-text-file", book_path("pg84.txt"), "--device", "cpu",
                   "--mixed-precision", "fp16", "--output", str(tmp_path / "out")], capsys)
    assert "needs a CUDA device" in err and not (tmp_path / "out").exists()
