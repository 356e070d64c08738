"""No silent wrong: padding state per call, resume only with identical weights and settings, one run per output
folder, and an exact KV cache for the dynamic scalings."""

import json
import os

import pytest
import torch
from helpers import greedy, ids, refused, tiny_model

import hf_posenc
from hf_posenc.cli import main


# -- 1. padding of the attention-level methods, computed per call -------------------------------------------
def _self_extend():
    model = tiny_model("llama")
    model.config._attn_implementation = "sdpa"
    return hf_posenc.patch(model, "self_extend", group_size=4, window=16)


@torch.no_grad()
def _rows_match_alone(model, input_ids, mask) -> float:
    out = model(input_ids, attention_mask=mask).logits
    worst = 0.0
    for r in range(input_ids.shape[0]):
        pad = int((mask[r] == 0).sum())
        alone = model(input_ids[r : r + 1, pad:]).logits[0]
        worst = max(worst, (out[r, pad:] - alone).abs().max().item())
    return worst


def test_a_mask_changed_in_place_is_read_again():
    """The same mask tensor (same id, same storage, same shape) with other padding: the padding of the new
    content is used, not that of the previous call."""
    model, input_ids = _self_extend(), ids(120, batch=2)
    mask = torch.ones(2, 120, dtype=torch.long)
    mask[0, :30] = 0
    assert _rows_match_alone(model, input_ids, mask) <= 1e-4
    mask.fill_(1)
    mask[1, :45] = 0
    assert _rows_match_alone(model, input_ids, mask) <= 1e-4


def test_random_left_padding_call_after_call_matches_each_row_alone():
    model = _self_extend()
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        input_ids = torch.randint(1, 96, (2, 120), generator=g)
        mask = torch.ones(2, 120, dtype=torch.long)
        for r, pad in enumerate(torch.randint(0, 51, (2,), generator=g).tolist()):
            mask[r, :pad] = 0
        assert _rows_match_alone(model, input_ids, mask) <= 1e-4


# -- 2. resume only with the same weights, every byte ------------------------------------------------------------


def _ppl(model, out, *extra):
    return ["eval", "ppl", "--model", str(model), "--methods", "none", "--lengths", "32", "--max-windows", "1",
            "--corpus", "python-docs", "--output", str(out), "--no-plots", "--no-progress", *extra]


def test_weights_changed_in_the_middle_are_not_resumed(own_checkpoint, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    out = tmp_path / "ppl"
    assert main(_ppl(own_checkpoint, out)) == 0
    cache = json.loads((tmp_path / "cache" / "file_digests.json").read_text())
    weights = own_checkpoint / "model.safetensors"
    assert os.path.realpath(weights) in cache  # hashed once, remembered by path, size and mtime
    assert weights.stat().st_size > 8 << 20  # the change below is MiBs away from both ends
    state = load_file(weights)
    state["model.embed_tokens.weight"][10000:20000] *= 5
    save_file(state, weights, metadata={"format": "pt"})
    err = refused(_ppl(own_checkpoint, out), capsys)
    assert "holds the cells of another setup (model.files: 'sha256:" in err
    assert main(_ppl(own_checkpoint, out, "--overwrite")) == 0


def test_the_same_weights_by_another_path_resume_and_other_weights_there_do_not(own_checkpoint, bert_tokenizer,
                                                                                    tmp_path, capsys, monkeypatch):
    """A local model is its files: the cells resume when its folder is given by a relative path from another
    working folder, or moved (the benchmarks' checkpoints, read from another worktree), and not when the files
    at the path are others."""
    import shutil

    import hf_posenc.eval.run_passkey as run_passkey
    import hf_posenc.eval.run_ppl as run_ppl

    def passkey(model):  # its settings name the tokenizer, here the model folder's own
        return ["eval", "passkey", "--model", str(model), "--methods", "none", "--lengths", "64", "--depths", "0.5",
                "--trials", "1", "--output", str(tmp_path / "passkey"), "--no-plots", "--no-progress"]

    out = tmp_path / "ppl"
    assert main(_ppl(own_checkpoint, out)) == 0 and main(passkey(own_checkpoint)) == 0
    first = json.loads((out / "perplexity.json").read_text())["results"]
    moved = tmp_path / "elsewhere" / "model"
    shutil.copytree(own_checkpoint, moved)
    shutil.rmtree(own_checkpoint)
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setattr(run_ppl, "window_cell", lambda *a, **k: pytest.fail("a cell was computed again"))
    monkeypatch.setattr(run_passkey, "passkey_cell", lambda *a, **k: pytest.fail("a cell was computed again"))
    assert main(_ppl("model", out)) == 0 and main(passkey("model")) == 0  # relative, from elsewhere: the very cells
    assert json.loads((out / "perplexity.json").read_text())["results"] == first
    # other weights at that path
    tiny_model("llama", seed=1, vocab_size=bert_tokenizer.vocab_size).save_pretrained(moved)
    err = refused(_ppl("model", out), capsys)
    assert "holds the cells of another setup (model.files: 'sha256:" in err


def test_a_tokenizer_from_another_folder_changed_in_place_is_not_resumed(own_checkpoint, bert_tokenizer, tmp_path,
                                                                          capsys):
    """--tokenizer from elsewhere: its path and vocabulary size stay when its files change, how it tokenizes does
    not (a passkey cell's prompt is its tokens)."""
    elsewhere = tmp_path / "tokenizer"
    bert_tokenizer.save_pretrained(elsewhere)
    args = ["eval", "passkey", "--model", str(own_checkpoint), "--tokenizer", str(elsewhere), "--methods", "none",
            "--lengths", "64", "--depths", "0.5", "--trials", "1", "--output", str(tmp_path / "passkey"),
            "--no-plots", "--no-progress"]
    assert main(args) == 0 and main(args) == 0  # the same tokenizer: resumed
    vocab = json.loads((elsewhere / "tokenizer.json").read_text())
    words = vocab["model"]["vocab"]
    words["zzunused"] = words.pop("the")  # the same size, another tokenization
    (elsewhere / "tokenizer.json").write_text(json.dumps(vocab))
    assert "holds the cells of another setup (settings.tokenizer_content: 'sha256:" in refused(args, capsys)


def test_a_rerun_leaves_no_figure_of_the_earlier_report_and_no_other_tasks(tiny_checkpoint, tmp_path):
    out = tmp_path / "ppl"

    def ppl(lengths, *extra):
        return ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none", "--lengths", lengths, "--max-windows",
                "1", "--corpus", "python-docs", "--output", str(out), "--no-progress", *extra]

    assert main(ppl("32,48")) == 0
    assert {"loss_by_position_32.png", "loss_by_position_48.png", "ppl_vs_length.png"} <= set(os.listdir(out))
    (out / "passkey_heatmap_none.png").write_bytes(b"another task's figure")
    assert main(ppl("32")) == 0  # 48 no longer asked: its figure goes, another task's stays
    assert "loss_by_position_48.png" not in os.listdir(out) and "loss_by_position_32.png" in os.listdir(out)
    assert main(ppl("32", "--no-plots")) == 0  # figures of a report they no longer show
    assert not [n for n in os.listdir(out) if n.startswith(("loss_by_position", "ppl_vs"))]
    assert (out / "passkey_heatmap_none.png").read_bytes() == b"another task's figure"


def test_the_digest_cache_is_used_while_size_and_mtime_stay(tmp_path, monkeypatch):
    from hf_posenc.io import digests

    monkeypatch.setenv("HF_POSENC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(digests, "RACY_NS", 0)  # else a file written just now is hashed again (digests' guarantee)
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 1000)
    first = digests.file_digests([str(f)])
    read = []
    monkeypatch.setattr(digests, "hash_file", lambda p: read.append(p) or "x")
    assert digests.file_digests([str(f)]) == first and read == []
    f.write_bytes(b"b" * 1000)
    os.utime(f, ns=(1, 1))  # new content, same size, another mtime: hashed again
    assert digests.file_digests([str(f)]) == ["x"] and read == [str(f)]


# -- 3. one run per output folder; every cell line checked -------------------------------------------------------
def test_a_second_run_on_the_same_output_is_refused_naming_the_lock(tiny_checkpoint, tmp_path, capsys):
    from hf_posenc.io.files import LOCK_FILE, OutputLock

    out = tmp_path / "busy"
    held = OutputLock(str(out))  # another run holding the folder
    try:
        err = refused(_ppl(tiny_checkpoint, out), capsys)
    finally:
        held.release()
    assert f"is in use by another hf-posenc run (pid {os.getpid()}, lock {out / LOCK_FILE})" in err
    assert not out.exists()  # the lock of a run that wrote nothing leaves nothing behind
    assert main(_ppl(tiny_checkpoint, out)) == 0  # released: the folder is free again
    assert (out / "perplexity.json").exists() and not (out / LOCK_FILE).exists()  # and the lock file is gone


def test_a_failed_run_releases_the_folder(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "o"
    assert "--lengths must be token counts >= 2" in refused(_ppl(tiny_checkpoint, out)[:6] + [
        "--lengths", "1", "--corpus", "python-docs", "--output", str(out)], capsys)
    assert not out.exists()
    assert main(_ppl(tiny_checkpoint, out)) == 0


def _failing_cells(monkeypatch, after: int):
    """``window_cell`` computes ``after`` cells, then fails (as an out-of-memory or a kill would)."""
    import hf_posenc.eval.run_ppl as run_ppl

    real, calls = run_ppl.window_cell, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) > after:
            raise RuntimeError("the device ran out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(run_ppl, "window_cell", failing)


def test_a_run_failing_in_its_first_cell_leaves_no_folder(tiny_checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "o"
    _failing_cells(monkeypatch, after=0)
    with pytest.raises(RuntimeError, match="ran out of memory"):
        main(_ppl(tiny_checkpoint, out))
    assert not out.exists()  # no cells file holding only its setup line, no empty folder


def test_a_run_failing_after_a_cell_keeps_it_for_the_next(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    out = tmp_path / "o"
    args = _ppl(tiny_checkpoint, out)
    _failing_cells(monkeypatch, after=1)
    with pytest.raises(RuntimeError, match="ran out of memory"):
        main(args)
    lines = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["setup", "cell"] and not (out / "perplexity.json").exists()
    monkeypatch.undo()
    assert main(args) == 0
    total = int(capsys.readouterr().err.split("resumed 1 of ")[1].split()[0])
    assert total > 1 and [json.loads(line)["kind"] for line in (out / "cells.jsonl").read_text().splitlines()] == \
        ["setup"] + ["cell"] * total


def test_processes_starting_the_cells_file_together_write_one_setup_line(tmp_path):
    from hf_posenc.config import PosEncConfig
    from hf_posenc.eval.cells import CellStore
    from hf_posenc.eval.processes import Processes
    from hf_posenc.eval.variants import Variant

    out = tmp_path / "o"
    variant = Variant("none", PosEncConfig(method="none"))
    first, second = (CellStore(str(out), {"task": "t"}, Processes("cpu")) for _ in range(2))  # both saw no file
    assert not out.exists()
    first.add(variant, [1], {"x": 1.0}, 0.1)
    second.add(variant, [2], {"x": 2.0}, 0.1)
    kinds = [json.loads(line)["kind"] for line in (out / "cells.jsonl").read_text().splitlines()]
    assert kinds == ["setup", "cell", "cell"] and os.listdir(out) == ["cells.jsonl"]  # no temporary file left


def _variant_run(checkpoint, out, factor):
    return ["eval", "ppl", "--model", str(checkpoint), "--variant", f"y=yarn:factor={factor}", "--lengths", "32",
            "--max-windows", "2", "--corpus", "python-docs", "--output", str(out), "--no-plots", "--no-progress"]


def test_every_cell_line_of_a_label_is_checked_not_only_the_last(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "mixed"
    assert main(_variant_run(tiny_checkpoint, out, 4)) == 0
    lines = (out / "cells.jsonl").read_text().splitlines()
    cell = json.loads(lines[1])
    cell["config"]["factor"] = 2.0  # as if a second run (factor 2) had appended its cells to the same folder
    cell["key"][-1] += 1000
    (out / "cells.jsonl").write_text("\n".join(lines + [json.dumps(cell)]) + "\n")
    err = refused(_variant_run(tiny_checkpoint, out, 4), capsys)
    assert "variant 'y' is {'method': 'yarn', 'factor': 4.0" in err and "factor: 4.0 -> 2.0" not in err
    assert "factor: 2.0 -> 4.0" in err


@pytest.mark.parametrize("line,why", [
    ('[1, 2, 3]', "a JSON list, not an object"),
    ('{"kind": "cell", "variant": "y"}', "no config, key, result"),
    ('{"kind": "cell", "variant": 7, "config": {}, "key": [1], "result": {}}', "a field of the wrong type"),
    ('{"kind": "cell", "variant": "y", "config": {}, "key": "32", "result": {}}', "a field of the wrong type"),
    ('{"kind": "something", "x": 1}', "no variant, config, key, result"),
])
def test_a_cell_line_that_is_not_a_cell_is_refused_by_line(line, why, tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(_variant_run(tiny_checkpoint, out, 2)) == 0
    with open(out / "cells.jsonl", "a") as f:
        f.write(line + "\n")
    number = len((out / "cells.jsonl").read_text().splitlines())
    err = refused(_variant_run(tiny_checkpoint, out, 2), capsys)
    assert f"line {number} of {out / 'cells.jsonl'} is not a cell of this run ({why}" in err and "--overwrite" in err


def test_a_cell_whose_result_lacks_a_field_is_refused_by_line(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "fields"
    assert main(_variant_run(tiny_checkpoint, out, 2)) == 0
    lines = (out / "cells.jsonl").read_text().splitlines()
    cell = json.loads(lines[2])
    cell["result"]["nll_sum"] = "12.5"  # valid JSON, a string where a number belongs
    (out / "cells.jsonl").write_text("\n".join(lines[:2] + [json.dumps(cell)]) + "\n")
    err = refused(_variant_run(tiny_checkpoint, out, 2), capsys)
    assert f"line 3 of {out / 'cells.jsonl'} is not a cell of this run (its result lacks a field" in err


# -- 4. the dynamic scalings' exact cache ---------------------------------------------------------------------
@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_the_exact_cache_equals_recomputing_the_sequence_to_fp32_noise(method):
    from test_consistent_cache import recomputed_greedy

    model = hf_posenc.patch(tiny_model("llama"), method, factor=4.0, cache="exact")
    prompt = ids(40)
    mask = torch.ones_like(prompt)
    seq, scores = greedy(model, prompt, 60, mask)  # 40 + 60 passes the original 64
    ref_seq, ref_scores = recomputed_greedy(model, prompt, mask, 60)
    assert torch.equal(seq, ref_seq)
    assert (scores - ref_scores).abs().max().item() <= 1e-5


def test_the_exact_cache_with_left_padding_and_after_save_load(tmp_path):
    from test_consistent_cache import recomputed_greedy

    model = hf_posenc.patch(tiny_model("qwen2"), "dynamic_ntk", factor=4.0, cache="exact")
    model.save_pretrained(tmp_path / "m")
    again = hf_posenc.from_pretrained(str(tmp_path / "m")).eval()
    assert hf_posenc.get_config(again).params["cache"] == "exact"
    prompt = ids(40, batch=2)
    mask = torch.ones_like(prompt)
    mask[0, :7] = 0
    _, scores = greedy(again, prompt, 40, mask)
    _, ref_scores = recomputed_greedy(again, prompt, mask, 40)
    assert (scores - ref_scores).abs().max().item() <= 1e-5


# -- 5. absurd values refused at config creation; reports are standard JSON; best.json checked as a block -----
@pytest.mark.parametrize("method,factor,params,message", [
    ("yarn", 2.0, {"attention_factor": 1e30}, "attention_factor must be a number from 0 (excluded) to 10"),
    ("yarn", 2.0, {"beta_fast": 1e308, "beta_slow": 1.0}, "beta_fast must be a number from 0 (excluded) to 1e+06"),
    ("dynamic_yarn", 2.0, {"attn_factor": float("inf")}, "attn_factor must be a finite number > 0"),
    ("longrope", 2.0, {"attention_factor": 1e300}, "attention_factor must be a number from 0 (excluded) to 10"),
    ("string", None, {"attention_factor": 1e300}, "attention_factor must be a number from 0 (excluded) to 10"),
    ("leaky_rerope", None, {"leak": 1e308}, "leak must be a number > 1 and <= 1e+06"),
    ("leaky_rerope", None, {"leak": float("nan")}, "leak must be a number > 1 and <= 1e+06"),
    ("dca", None, {"max_position_embeddings": 1}, "max_position_embeddings must be an integer >= 16"),
    ("rerope", None, {"max_position_embeddings": 1}, "max_position_embeddings must be an integer >= 16"),
    ("alibi", None, {"max_position_embeddings": 1}, "max_position_embeddings must be an integer from 16 to"),
    ("alibi", None, {"max_position_embeddings": 10**30}, "max_position_embeddings must be an integer from 16 to"),
])
def test_absurd_knobs_are_refused_when_the_config_is_made(method, factor, params, message):
    from hf_posenc.config import PosEncConfig

    with pytest.raises(ValueError, match=None) as err:
        PosEncConfig(method, factor, None, params)
    assert message in str(err.value)


def test_an_advertised_context_below_the_original_is_refused_at_patch_time():
    with pytest.raises(ValueError) as err:
        hf_posenc.patch(tiny_model("llama"), "dca", max_position_embeddings=32)
    assert "max_position_embeddings=32 must lie between the original context (64) and 1024 x it" in str(err.value)


def test_a_report_with_a_nan_is_standard_json_with_null_and_a_warning(tmp_path, capsys):
    from hf_posenc.io.reports import write_json

    path = tmp_path / "r.json"
    write_json({"results": {"yarn": {"ppl": float("nan"), "curve": [1.0, float("inf")]}, "none": {"ppl": 3.0}}}, path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["results"] == {"yarn": {"ppl": None, "curve": [1.0, None]}, "none": {"ppl": 3.0}}
    err = capsys.readouterr().err
    assert "r.json: 2 value(s) are not finite numbers" in err and "results.yarn.ppl, results.yarn.curve[1]" in err


def _best(tmp_path, **changes):
    block = {"method": "yarn", "factor": 2.0, "original_max_position_embeddings": None, "params": {},
             "family": "rope_decoder", "native": True, "original": {}, "version": "0.1.0", "schema": 2, **changes}
    path = tmp_path / "best.json"
    path.write_text(json.dumps(block))
    return str(path)


@pytest.mark.parametrize("changes,message", [
    ({"schema": 99}, "has schema 99 (written by hf_posenc '0.1.0')"),
    ({"native": "maybe"}, "has native='maybe'; expected a bool"),
    ({"family": "rope_decoderz"}, "names the family adapter 'rope_decoderz', which this hf_posenc"),
    ({"params": {"beta_fast": float("inf")}}, "beta_fast must be a finite number > 0"),
])
def test_a_best_json_is_checked_exactly_like_a_stored_block(changes, message, tiny_checkpoint, tmp_path, capsys,
                                                             monkeypatch):
    import hf_posenc.checkpoints.runtime as runtime

    monkeypatch.setattr(runtime, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("loaded before refusing"))
    err = refused(["patch", "--model", tiny_checkpoint, "--config", _best(tmp_path, **changes), "--output",
                    str(tmp_path / "o")], capsys)
    assert message in err and not (tmp_path / "o").exists()
    with pytest.raises(ValueError) as same:  # the Python API reads such a dict the same way
        hf_posenc.patch(tiny_model("llama"), json.loads(open(_best(tmp_path, **changes)).read()))
    assert message in str(same.value)


# -- 8. files others can read; resume after a budget change or into the model's folder; atomic plots ---------
def _modes(folder) -> set[str]:
    out = set()
    for root, dirs, files in os.walk(folder):
        out |= {f"d{oct(os.stat(os.path.join(root, d)).st_mode & 0o777)}" for d in dirs}
        out |= {f"f{oct(os.stat(os.path.join(root, f)).st_mode & 0o777)}" for f in files}
    return out


def test_outputs_follow_the_umask(tiny_checkpoint, tmp_path):
    old = os.umask(0o022)
    try:
        assert main(["patch", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--output",
                     str(tmp_path / "ckpt"), "--no-progress"]) == 0
        assert main(_ppl(tiny_checkpoint, tmp_path / "runs" / "ppl")[:-2] + ["--no-progress"]) == 0
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "ckpt").st_mode & 0o777) == "0o755"
    assert _modes(tmp_path / "ckpt") <= {"f0o644", "d0o755"} and "f0o644" in _modes(tmp_path / "ckpt")
    assert _modes(tmp_path / "runs") == {"f0o644", "d0o755"}  # reports, cells and the plots


def test_an_eval_into_the_model_folder_resumes(own_checkpoint, capsys):
    argv = _ppl(own_checkpoint, own_checkpoint)
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 0
    import re

    assert re.search(r"resumed (\d+) of \1 cells", capsys.readouterr().err)  # all of them


def test_changing_only_the_budget_resumes_a_tune(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "tune"
    argv = ["tune", "--model", tiny_checkpoint, "--target-length", "128", "--corpus", "python-docs", "--methods",
            "yarn", "--no-progress", "--output", str(out), "--budget-minutes"]
    assert main(argv + ["100"]) == 0
    cells = (out / "cells.jsonl").read_text()
    capsys.readouterr()
    assert main(argv + ["200"]) == 0
    assert "resumed" in capsys.readouterr().err and (out / "cells.jsonl").read_text() == cells
    assert json.loads((out / "tune.json").read_text())["setup"]["budget_minutes"] == 200.0


def test_a_plot_that_fails_half_way_leaves_the_old_picture(tmp_path):
    from hf_posenc.io import reports as report

    path = tmp_path / "p.png"
    report.plot_lines({"a": ([1, 2], [3, 4])}, "t", "x", "y", str(path))
    before = path.read_bytes()
    import matplotlib.figure

    real = matplotlib.figure.Figure.savefig

    def broken(self, f, **kw):
        f.write(b"\x89PNG half")
        raise OSError("disk full (simulated)")

    matplotlib.figure.Figure.savefig = broken
    try:
        with pytest.raises(OSError):
            report.plot_lines({"a": ([1, 2], [5, 6])}, "t", "x", "y", str(path))
    finally:
        matplotlib.figure.Figure.savefig = real
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["p.png"]


# -- 9. a fixed original context applies to every tune candidate ------------------------------------------------
def test_tune_takes_a_fixed_original_context(tiny_checkpoint, tmp_path):
    out = tmp_path / "tune"
    assert main(["tune", "--model", tiny_checkpoint, "--target-length", "64", "--corpus", "python-docs", "--methods",
                 "yarn", "--method-param", "original_max_position_embeddings=32", "--no-progress", "--output",
                 str(out)]) == 0  # 64 is the model's own context, beyond the 32 given
    res = json.loads((out / "tune.json").read_text())["results"]
    configs = [c for label, c in res["configs"].items() if label != "none"]
    assert configs and all(c["original_max_position_embeddings"] == 32 for c in configs)
    assert {c["factor"] for c in configs} >= {2.0}  # the grid's factors reach 64 from 32
    assert res["reference"]["config"]["original_max_position_embeddings"] == 32
    assert json.loads((out / "best.json").read_text())["original_max_position_embeddings"] == 32


# -- 10. the transformers release the suite stands behind -------------------------------------------------------
def test_a_transformers_newer_than_the_tested_one_is_named_at_patch_time(monkeypatch):
    """setup.sh installs the tested transformers (scripts/constraints.txt, the same release as the package's own
    constant); with a newer minor release patching warns, naming both; patch releases of the tested one do not."""
    import warnings
    from pathlib import Path

    from hf_posenc.checkpoints import compat
    from hf_posenc.checkpoints.compat import TESTED_TRANSFORMERS, untested_transformers

    pins = (Path(__file__).parents[1] / "scripts" / "constraints.txt").read_text()
    assert f"transformers=={TESTED_TRANSFORMERS}\n" in pins
    major, minor = (int(p) for p in TESTED_TRANSFORMERS.split(".")[:2])
    assert (untested_transformers(f"{major}.{minor}.9") is None
            and untested_transformers(f"{major}.{minor - 1}.0") is None)
    newer = f"{major}.{minor + 1}.0"
    monkeypatch.setattr(compat, "installed_transformers", lambda: newer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hf_posenc.patch(tiny_model("llama"), "linear", factor=2.0)
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert any(newer in s and TESTED_TRANSFORMERS in s for s in said), said


def test_a_run_resumes_under_another_torch_build_of_the_same_release_only(own_checkpoint, tmp_path, capsys):
    """A CPU run goes on on a GPU machine with the same torch release (its build tag differs: +cpu, +cu130; each cell
    records its device); another torch release or another transformers is another setup."""
    import torch

    out = tmp_path / "ppl"
    assert main(_ppl(own_checkpoint, out)) == 0
    cells = out / "cells.jsonl"
    lines = cells.read_text().splitlines(keepends=True)
    setup = json.loads(lines[0])
    release = torch.__version__.split("+")[0]
    for torch_version, transformers_version, resumes in ((f"{release}+cu130", None, True), ("1.0.0+cpu", None, False),
                                                         (None, "4.0.0", False)):
        changed = json.loads(lines[0])
        changed["fingerprint"]["versions"]["torch"] = torch_version or setup["fingerprint"]["versions"]["torch"]
        changed["fingerprint"]["versions"]["transformers"] = (transformers_version
                                                              or setup["fingerprint"]["versions"]["transformers"])
        cells.write_text(json.dumps(changed) + "\n" + "".join(lines[1:]))
        capsys.readouterr()
        if resumes:
            assert main(_ppl(own_checkpoint, out)) == 0
            err = capsys.readouterr().err
            assert f"resumed {len(lines) - 1} of {len(lines) - 1} cells" in err
        else:
            err = refused(_ppl(own_checkpoint, out), capsys)
            assert ("another setup (versions.t" in err
                    and ("torch: '1.0.0' ->" in err or "transformers: '4.0.0' ->" in err))


def test_cells_of_an_earlier_release_resume_from_the_release_that_computes_them_alike(own_checkpoint, tmp_path, capsys):
    """hf_posenc's own version: a release from CELLS_SINCE on computes every cell as this one does (a restructure
    moves code, not numbers), so its cells resume; an older one is another setup, named."""
    from hf_posenc.eval.cells import CELLS_SINCE

    out = tmp_path / "ppl"
    assert main(_ppl(own_checkpoint, out)) == 0
    cells = out / "cells.jsonl"
    lines = cells.read_text().splitlines(keepends=True)
    for version, resumes in ((CELLS_SINCE, True), ("0.0.9", False)):
        changed = json.loads(lines[0])
        changed["fingerprint"]["versions"]["hf_posenc"] = version
        cells.write_text(json.dumps(changed) + "\n" + "".join(lines[1:]))
        capsys.readouterr()
        if resumes:
            assert main(_ppl(own_checkpoint, out)) == 0
            assert f"resumed {len(lines) - 1} of {len(lines) - 1} cells" in capsys.readouterr().err
            assert cells.read_text().splitlines(keepends=True)[1:] == lines[1:]  # nothing computed again
        else:
            err = refused(_ppl(own_checkpoint, out), capsys)
            assert "another setup (versions.hf_posenc: '0.0.9' ->" in err
