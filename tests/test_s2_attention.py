"""S²-Attn (LongLoRA, arXiv:2309.12307) against a written-out reference: each query attends causally within its
group of G tokens, half of the heads in groups shifted by G/2 (without the paper's wrap-around, so causal)."""

import pytest
import torch

from hf_posenc.adapters.s2_attention import check_group, s2_attention


def reference(q, k, v, group, scale):
    """Dense scores with the allowed pairs written out: j <= i and i, j in the same group."""
    b, h, t, d = q.shape
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    out = torch.empty_like(q)
    for head in range(h):
        offset = group // 2 if head >= h // 2 else 0
        allowed = (j <= i) & ((i + offset) // group == (j + offset) // group)
        scores = (q[:, head] @ k[:, head].transpose(-1, -2)) * scale
        out[:, head] = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v[:, head]
    return out


@pytest.mark.parametrize("heads,length,group", [(4, 32, 8), (2, 16, 16), (6, 24, 4), (4, 8, 2)])
def test_s2_attention_equals_the_written_out_reference(heads, length, group):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, length, 8, generator=g, dtype=torch.float64) for _ in range(3))
    got = s2_attention(q, k, v, group, 8 ** -0.5)
    assert (got - reference(q, k, v, group, 8 ** -0.5)).abs().max().item() < 1e-12


def test_no_query_sees_a_later_key_nor_one_outside_its_groups():
    q = torch.zeros(1, 2, 16, 4, dtype=torch.float64)  # equal scores: each output is the mean of the values it sees
    v = torch.arange(16, dtype=torch.float64)[None, None, :, None].expand(1, 2, 16, 4).contiguous()
    out = s2_attention(q, torch.zeros_like(q), v, 8, 1.0)[0, :, :, 0]
    assert out[0, 9].item() == pytest.approx((8 + 9) / 2)  # plain head: group [8, 16), keys 8..9
    assert out[1, 3].item() == pytest.approx((0 + 1 + 2 + 3) / 4)  # shifted head: group [0, 4), keys 0..3
    assert out[1, 9].item() == pytest.approx(sum(range(4, 10)) / 6)  # shifted head: group [4, 12), keys 4..9
    assert out[1, 15].item() == pytest.approx(sum(range(12, 16)) / 4)  # the last shifted group [12, 16): no wrap


@pytest.mark.parametrize("group,length,message", [(3, 12, "even whole number >= 2"), (0, 8, "got 0"),
                                                  (8, 20, "the training length \\(20\\) must be a multiple of it")])
def test_groups_that_cut_no_sequence_are_refused(group, length, message):
    with pytest.raises(ValueError, match=message):
        check_group(group, length)


# -- in a model, while training ----------------------------------------------------------------------------------
def test_a_training_model_attends_in_shifted_groups_and_in_full_otherwise():
    import copy

    from helpers import ids, tiny_model
    from transformers import AttentionInterface

    import hf_posenc
    from hf_posenc.adapters.s2_attention import S2Training

    def written_out(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        reps = query.shape[1] // key.shape[1]
        k, v = key.repeat_interleave(reps, 1), value.repeat_interleave(reps, 1)
        return reference(query, k, v, 16, scaling).transpose(1, 2).contiguous(), None

    AttentionInterface.register("test_s2_written_out", written_out)
    model = hf_posenc.patch(tiny_model("llama"), "yarn", factor=2.0)  # 4 heads over 2 key/value heads
    x = ids(96)
    full = model(x).logits
    reference_model = copy.deepcopy(model).train()
    reference_model.config._attn_implementation = "test_s2_written_out"
    expected = reference_model(x).logits
    before = model.config._attn_implementation
    with S2Training(model, 16):
        model.train()
        trained = model(x).logits
        model.eval()
        evaluated = model(x).logits
    assert (trained - expected).abs().max().item() < 1e-5
    assert (trained - full).abs().max().item() > 1e-3  # the groups change what is computed
    assert (evaluated - full).abs().max().item() < 1e-5  # evaluation attends in full (by SDPA; the model's eager)
    assert model.config._attn_implementation == before and (model(x).logits - full).abs().max().item() == 0.0


def test_cli_finetune_with_s2_attn_and_its_refusals(tiny_checkpoint, tmp_path, capsys):
    import json
    import re

    from helpers import book_path, refused

    from hf_posenc.cli import main

    def argv(method, out, *extra):
        return ["finetune", "--model", tiny_checkpoint, "--method", method, "--text-file", book_path("pg1513.txt"),
                "--eval-text-file", book_path("pg84.txt"), "--seq-len", "64", "--steps", "2", "--eval-windows", "1",
                "--output", str(out), "--no-progress", *extra]

    assert main(argv("yarn", tmp_path / "ok", "--factor", "2", "--s2-attn-group", "16")) == 0
    report = json.loads((tmp_path / "ok" / "hf_posenc_eval" / "finetune.json").read_text())
    assert report["setup"]["s2_attn_group"] == 16
    for method, extra, message in [("self_extend", [], "'self_extend' brings its own attention"),
                                   ("alibi", [], "'alibi' brings its own attention"),
                                   ("yarn", ["--factor", "2"], "the training length \\(64\\) must be a multiple")]:
        group = "24" if method == "yarn" else "16"
        err = refused(argv(method, tmp_path / method, *extra, "--s2-attn-group", group), capsys)
        assert re.search(message, err), err
        assert not (tmp_path / method).exists()
