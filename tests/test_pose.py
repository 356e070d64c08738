"""PoSE position ids (arXiv:2309.10400, Sec. 3.2) against the paper's formula written out, their coverage of the
target context, determinism by seed, and refusals."""

import pytest
import torch

from hf_posenc.encodings.pose import check_pose, chunk_positions, pose_batch, pose_position_ids


def test_chunk_positions_follow_the_formula_written_out():
    # W = 8 in chunks of 3, 2, 3 with skips u = 0, 10, 21 (T >= 8 + 21): st = 0, 3, 5
    assert chunk_positions([3, 2, 3], [0, 10, 21]).tolist() == [0, 1, 2, 13, 14, 26, 27, 28]
    assert chunk_positions([8], [0]).tolist() == list(range(8))


@pytest.mark.parametrize("window,target,chunks", [(8, 32, 2), (16, 64, 3), (5, 6, 5), (2048, 16384, 2)])
def test_every_window_is_a_valid_pose_window(window, target, chunks):
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        pos = pose_position_ids(window, target, chunks, g)
        steps = pos[1:] - pos[:-1]
        assert pos.shape == (window,) and pos.dtype == torch.long
        assert pos[0] == 0 and pos[-1] <= target - 1 and bool((steps >= 1).all())  # u_0 = 0, increasing, < T
        assert int((steps > 1).sum()) <= chunks - 1  # a skip only between chunks


def test_the_windows_cover_every_distance_of_the_target_and_reach_its_end():
    ids = pose_batch(400, 8, 32, 2, seed=0)
    distances = {int(d) for row in ids for d in (row[:, None] - row[None, :]).flatten() if d > 0}
    assert distances == set(range(1, 32))  # every relative position of [0, 32), from 8-token windows
    assert int(ids[:, -1].max()) == 31 and int(ids[:, -1].min()) < 31


def test_the_windows_are_drawn_by_seed_and_row_alone():
    assert pose_batch(2, 16, 64, 2, seed=2**50).shape == (2, 16)  # any seed the CLI takes
    a = pose_batch(6, 16, 64, 2, seed=3)
    assert torch.equal(a, pose_batch(6, 16, 64, 2, seed=3))
    assert torch.equal(a[:4], pose_batch(4, 16, 64, 2, seed=3))  # row i does not depend on how many are drawn
    assert not torch.equal(a, pose_batch(6, 16, 64, 2, seed=4))


@pytest.mark.parametrize("window,target,chunks,message", [
    (2048, 2048, 2, r"--pose-window \(2048\) must be shorter than --target-length \(2048\)"),
    (4096, 2048, 2, r"--pose-window \(4096\) must be shorter"),
    (0, 2048, 2, r"--pose-window must be a positive whole number, got 0"),
    (8, 32, 0, r"--pose-chunks must be a positive whole number, got 0"),
    (4, 32, 5, r"--pose-chunks \(5\) cannot exceed --pose-window \(4\)"),
    (8, 32.5, 2, r"--target-length must be a positive whole number, got 32.5"),
    (1, 32, 1, r"--pose-window must be at least 2 tokens"),
    (32, 2**40, 2, r"--target-length 1099511627776 is past 16,777,216 positions"),
])
def test_windows_that_make_no_pose_window_are_refused(window, target, chunks, message):
    with pytest.raises(ValueError, match=message):
        check_pose(window, target, chunks)


# -- training on PoSE windows ------------------------------------------------------------------------------------
def test_the_trainer_feeds_each_window_its_pose_position_ids():
    from helpers import tiny_model

    import hf_posenc
    from hf_posenc.training.finetune import _train
    from hf_posenc.training.settings import TrainSettings

    model = hf_posenc.patch(tiny_model("llama"), "yarn", factor=2.0)
    blocks = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(0))
    positions = pose_batch(4, 16, 128, 2, seed=0)
    seen = []
    model.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["position_ids"].clone()), with_kwargs=True)
    losses, _ = _train(model, blocks, positions, TrainSettings(steps=2, batch_size=2, learning_rate=1e-3,
                                                               gradient_checkpointing=False, device="cpu"),
                       progress=False)
    fed = torch.cat(seen)
    assert len(losses) == 2 and fed.shape == (4, 16)
    assert sorted(map(tuple, fed.tolist())) == sorted(map(tuple, positions.tolist()))  # each window its own ids
    assert int(fed.max()) > 64  # past the tiny model's original context of 64


def test_cli_finetune_with_pose_windows_records_them(tiny_checkpoint, tmp_path, capsys):
    import json

    from helpers import book_path

    from hf_posenc.cli import main

    out = tmp_path / "ft"
    assert main(["finetune", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--text-file",
                 book_path("pg1513.txt"), "--eval-text-file", book_path("pg84.txt"), "--pose-window", "32",
                 "--target-length", "128", "--seq-len", "64", "--steps", "2", "--eval-windows", "1", "--output",
                 str(out), "--no-progress", "--no-long-eval"]) == 0  # (its long eval: test_finetune_long_eval)
    assert "32 (PoSE to 128)" in capsys.readouterr().out
    report = json.loads((out / "hf_posenc_eval" / "finetune.json").read_text())
    assert report["setup"]["pose"] == {"window": 32, "target": 128, "chunks": 2} and len(report["losses"]) == 2


@pytest.mark.parametrize("extra,message", [
    (["--method", "self_extend", "--pose-window", "32", "--target-length", "128"],
     "which 'self_extend' \\(attention method\\) does not read"),
    (["--method", "yarn", "--factor", "2", "--pose-window", "32"], "--pose-window and --target-length go together"),
    (["--method", "yarn", "--factor", "2", "--pose-chunks", "7"], "--pose-chunks applies to PoSE training"),
    (["--method", "yarn", "--factor", "2", "--pose-window", "32", "--target-length", "128", "--packing",
      "stream-restart"], "PoSE draws them for the whole window: use one or the other"),
    (["--method", "yarn", "--factor", "2", "--pose-window", "128", "--target-length", "128"],
     "--pose-window \\(128\\) must be shorter than --target-length \\(128\\)"),
    (["--method", "yarn", "--factor", "2", "--pose-window", "16", "--target-length", "48"],
     "--target-length 48 is within the model's original context \\(64\\)"),
])
def test_pose_input_that_means_nothing_is_refused(extra, message, tiny_checkpoint, tmp_path, capsys):
    import re

    from helpers import book_path, refused

    err = refused(["finetune", "--model", tiny_checkpoint, *extra, "--text-file", book_path("pg1513.txt"),
                   "--eval-text-file", book_path("pg84.txt"), "--seq-len", "64", "--steps", "1", "--output",
                   str(tmp_path / "ft"), "--no-progress"], capsys)
    assert re.search(message, err), err
    assert not (tmp_path / "ft").exists()
