"""The hf_posenc block of config.json: one schema-versioned record; checkpoints saved by an earlier release keep
loading to the outputs that release computed; a bad block is refused with the checkpoint named."""

import json
import os
import shutil

import pytest
import torch

import hf_posenc
from hf_posenc.config import PLAIN_SCHEMA, SavedBlock

RELEASE = os.path.join(os.path.dirname(__file__), "data", "release-0.1.0")


@pytest.mark.parametrize("name", ["yarn", "self_extend", "learned"])
def test_checkpoints_of_release_0_1_0_load_to_the_same_outputs(name):
    expected = json.load(open(os.path.join(RELEASE, "expected.json")))
    model = hf_posenc.from_pretrained(os.path.join(RELEASE, name), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.tensor(expected["ids"])).logits[0, ::9, :8]
    assert (out - torch.tensor(expected["logits"][name])).abs().max().item() <= 1e-5
    assert hf_posenc.get_config(model).method == name


def test_the_block_round_trips_with_its_schema():
    model = hf_posenc.patch(__import__("helpers").tiny_model("llama"), "yarn", factor=2.0)
    block = model.config.hf_posenc
    assert block["schema"] == PLAIN_SCHEMA and block["family"] == "rope_decoder" and block["native"] is True
    again = SavedBlock.from_dict(block)
    assert again.to_dict() == block and again.config == hf_posenc.get_config(model)


@pytest.mark.parametrize("change,message", [
    ({"schema": 99}, "has schema 99 \\(written by hf_posenc '0.1.0'\\); this hf_posenc \\(.*\\) reads schemas up to 4"),
    ({"schema": "2"}, "has schema='2'; expected an integer from 1 to 4"),
    ({"pretrained_context": "64"}, "has pretrained_context='64'; expected an integer >= "),
    ({"version": 3}, "has version=3; expected a str"),
    ({"original": [1, 2]}, "has original=\\[1, 2\\]; expected a dict"),
    ({"family": "t5_relative"}, "names the family 't5_relative', which does not fit this model \\(LlamaForCausalLM\\)"),
    ({"family": "mamba"}, "names the family adapter 'mamba', which this hf_posenc"),
    ({"method": "yran"}, "'hf_posenc' block of its config.json: unknown method 'yran'. Did you mean 'yarn'\\?"),
    ({"extra": 1}, "has unknown field\\(s\\) \\['extra'\\]"),
])
def test_a_bad_block_is_refused_naming_the_checkpoint(tmp_path, change, message):
    folder = tmp_path / "ckpt"
    shutil.copytree(os.path.join(RELEASE, "yarn"), folder)
    data = json.loads((folder / "config.json").read_text())
    data["hf_posenc"].update(change)
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as err:
        hf_posenc.from_pretrained(str(folder))
    assert str(folder) in str(err.value)
