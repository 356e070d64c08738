"""A patched model deep-copies and pickles: the copy is patched, unpatching it restores the copy, the original is
untouched (TRL's create_reference_model deep-copies models)."""

import copy
import pickle
import subprocess
import sys

import pytest
import torch
from helpers import ids, logits, tiny_model

import hf_posenc

CASES = [("yarn", {"factor": 2.0}), ("dynamic_ntk", {"factor": 2.0}), ("alibi", {}), ("learned", {"factor": 3.0}),
         ("dca", {"chunk_size": 40, "local_window": 4}), ("self_extend", {"group_size": 4, "window": 16})]


@pytest.mark.parametrize("method,knobs", CASES)
def test_deepcopy_and_pickle_of_a_patched_model(method, knobs, tmp_path):
    model = tiny_model("llama")
    model.config._attn_implementation = "sdpa"
    x = ids(150)
    plain = logits(model, x)
    hf_posenc.patch(model, method, **knobs)
    patched = logits(model, x)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert hf_posenc.get_config(clone) == hf_posenc.get_config(model)
        assert (logits(clone, x) - patched).abs().max().item() <= 1e-6
        hf_posenc.unpatch(clone)
        assert (logits(clone, x) - plain).abs().max().item() <= 1e-6  # the copy restored ...
        assert torch.equal(logits(model, x), patched) and hf_posenc.is_patched(model)  # ... the original untouched
    saved = copy.deepcopy(model)
    saved.save_pretrained(tmp_path)
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert (logits(again, x) - patched).abs().max().item() <= 1e-5


def test_a_pickled_patched_model_runs_in_a_fresh_process(tmp_path):
    model = tiny_model("llama")
    model.config._attn_implementation = "sdpa"
    hf_posenc.patch(model, "rerope", window=16)
    x = ids(100)
    torch.save({"model": model, "x": x, "expected": logits(model, x)}, tmp_path / "m.pt")
    code = (f"import torch; d = torch.load({str(tmp_path / 'm.pt')!r}, weights_only=False); "
            "out = d['model'](d['x']).logits.float(); print((out - d['expected']).abs().max().item())")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr[-2000:]
    assert float(run.stdout.strip().splitlines()[-1]) <= 1e-6
