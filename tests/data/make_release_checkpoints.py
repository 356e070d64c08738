"""Writes tests/data/release-0.1.0: tiny patched checkpoints saved by an hf_posenc release, with the logits that
release computed, so that tests/test_saved_block.py checks that they keep loading to the same outputs.

Run with the release on the path (here: commit c430e73, hf_posenc 0.1.0):
    git worktree add /tmp/release c430e73
    PYTHONPATH=/tmp/release:/tmp/release/tests python tests/data/make_release_checkpoints.py tests/data/release-0.1.0
"""

import json
import os
import sys

import torch
from helpers import ids, tiny_model

import hf_posenc

CASES = {"yarn": ("yarn", {"factor": 2.0}), "self_extend": ("self_extend", {"group_size": 4, "window": 16}),
         "learned": ("learned", {"factor": 2.0})}


def main(out: str) -> None:
    x = ids(100)
    expected = {}
    for name, (method, knobs) in CASES.items():
        model = tiny_model("llama")
        model.config._attn_implementation = "sdpa"
        hf_posenc.patch(model, method, **knobs)
        with torch.no_grad():
            expected[name] = model(x).logits[0, ::9, :8].tolist()  # a sample: every 9th position, 8 logits
        model.save_pretrained(os.path.join(out, name), safe_serialization=True)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"version": hf_posenc.__version__, "ids": x.tolist(), "logits": expected}, f)


if __name__ == "__main__":
    main(sys.argv[1])
