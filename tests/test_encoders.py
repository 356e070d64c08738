"""Encoder families: learned absolute tables (BERT, RoBERTa, DistilBERT) and T5 relative buckets."""

import math
import subprocess
import sys

import pytest
import torch
from helpers import only_names_a_fresh_folder_is_checked_for
from transformers import AutoConfig, AutoModel, T5ForConditionalGeneration

import hf_posenc
from hf_posenc.encodings import absolute as A
from hf_posenc.encodings import t5_buckets as B
from hf_posenc.encodings.alibi import alibi_slopes

N = 64  # positions of the tiny encoders


def tiny_encoder(model_type: str, seed: int = 0):
    kw = dict(vocab_size=120, max_position_embeddings=N, pad_token_id=1)
    if model_type == "distilbert":
        kw.update(dim=32, hidden_dim=64, n_layers=2, n_heads=4)
    else:
        kw.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    if model_type == "roberta":
        kw["max_position_embeddings"] = N + 2  # fairseq layout: rows 0..1 are padding rows
    torch.manual_seed(seed)
    return AutoModel.from_config(AutoConfig.for_model(model_type, **kw)).eval()


def tokens(n: int, seed: int = 3):
    return torch.randint(5, 120, (2, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def encode(model, x):
    return model(input_ids=x).last_hidden_state


# -- pure tables ---------------------------------------------------------------------------------
def test_sinusoid_table_is_vaswanis():
    t = A.sinusoid_table(50, 10)
    for p, i in [(0, 0), (7, 2), (49, 4)]:
        angle = p / 10000 ** (2 * i / 10)
        assert t[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
        assert t[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert A.sinusoid_table(3, 5).shape == (3, 5)


def test_interpolated_table_follows_position_interpolation():
    table = torch.randn(16, 4)
    out = A.interpolate_table(table, 64)
    assert out.shape == (64, 4) and torch.equal(out[::4], table)  # new 4k reads old k exactly
    assert torch.allclose(out[2], (table[0] + table[1]) / 2) and torch.allclose(out[63], table[15])
    with pytest.raises(ValueError, match="only grows"):
        A.interpolate_table(table, 8)


def test_hierarchical_table_keeps_the_trained_rows_and_follows_the_formula():
    n, alpha = 8, 0.4
    table = torch.randn(n, 3)
    out = A.hierarchical_table(table, n * n, alpha)
    assert torch.equal(out[:n], table)
    u = (table.double() - alpha * table[0].double()) / (1 - alpha)
    for i, j in [(1, 0), (3, 5), (7, 7)]:
        expected = alpha * u[i] + (1 - alpha) * u[j]
        assert torch.allclose(out[i * n + j].double(), expected, atol=1e-6)
    with pytest.raises(ValueError, match=r"reaches lengths 8\.\.64"):
        A.hierarchical_table(table, 65, alpha)
    with pytest.raises(ValueError, match="alpha"):
        A.hierarchical_table(table, 16, 1.0)


# -- learned absolute adapters ---------------------------------------------------------------------
@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert"])
@pytest.mark.parametrize("method", ["interpolate", "hierarchical", "sinusoidal"])
def test_tables_grow_and_unpatch_restores(model_type, method):
    model = tiny_encoder(model_type)
    other = tiny_encoder(model_type)
    x_short, x_long = tokens(40), tokens(150)
    before = encode(model, x_short)
    with pytest.raises(RuntimeError):
        encode(model, x_long)  # longer than the table: transformers fails
    hf_posenc.patch(model, method, factor=4.0)
    extra = 2 if model_type == "roberta" else 0
    assert model.config.max_position_embeddings == 4 * N + extra
    emb = model.base_model.embeddings
    assert emb.position_embeddings.weight.shape[0] == 4 * N + extra
    assert emb.position_ids.shape[-1] == 4 * N + extra
    if hasattr(emb, "token_type_ids"):
        assert emb.token_type_ids.shape[-1] == 4 * N + extra
    assert encode(model, x_long).shape == (2, 150, model.config.hidden_size if model_type != "distilbert" else 32)
    if method == "hierarchical":  # inputs within the trained length are unchanged
        assert torch.equal(encode(model, x_short), before)
    if method == "sinusoidal":
        assert not emb.position_embeddings.weight.requires_grad
        scale, dim = hf_posenc.get_config(model).params["scale"], emb.position_embeddings.weight.shape[1]
        assert torch.allclose(emb.position_embeddings.weight[extra:], A.sinusoid_table(4 * N, dim) * scale)
    else:
        assert emb.position_embeddings.weight.requires_grad
    assert other.config.max_position_embeddings == N + extra  # the other instance is untouched
    hf_posenc.unpatch(model)
    assert model.config.max_position_embeddings == N + extra and torch.equal(encode(model, x_short), before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unpatch_after_a_cast_restores_the_table_in_the_current_dtype(dtype):
    model = tiny_encoder("bert")
    table = model.embeddings.position_embeddings.weight.detach().clone()
    hf_posenc.patch(model, "interpolate", factor=4.0)
    model.to(dtype)
    hf_posenc.unpatch(model)
    restored = model.embeddings.position_embeddings.weight
    assert restored.dtype == dtype and torch.equal(restored, table.to(dtype))
    assert encode(model, tokens(40)).dtype == dtype  # no "mixed dtype" failure


def test_roberta_padding_rows_are_kept():
    model = tiny_encoder("roberta")
    old = model.embeddings.position_embeddings.weight.detach().clone()
    hf_posenc.patch(model, "interpolate", factor=2.0)
    new = model.embeddings.position_embeddings.weight
    assert torch.equal(new[:2], old[:2]) and torch.equal(new[2::2], old[2:])


def test_saved_tables_load_in_plain_transformers_and_are_adopted_by_hf_posenc(tmp_path):
    model = hf_posenc.patch(tiny_encoder("bert"), "hierarchical", factor=3.0, alpha=0.3)
    model.save_pretrained(tmp_path)
    x = tokens(170)
    plain = AutoModel.from_pretrained(tmp_path).eval()
    assert torch.equal(encode(plain, x), encode(model, x))
    again = hf_posenc.from_pretrained(str(tmp_path)).eval()
    assert type(again).__name__ == "BertModel"  # the class named in config.json
    assert (hf_posenc.get_config(again) == hf_posenc.get_config(model)
            and torch.equal(encode(again, x), encode(model, x)))
    with pytest.raises(ValueError, match="cannot be unpatched"):
        hf_posenc.unpatch(again)
    again.save_pretrained(tmp_path / "twice")  # save -> load -> save -> load does not compound
    third = hf_posenc.from_pretrained(str(tmp_path / "twice")).eval()
    assert third.config.max_position_embeddings == 3 * N and torch.equal(encode(third, x), encode(model, x))
    with pytest.raises(ValueError, match="cannot be applied from the original"):
        hf_posenc.from_pretrained(str(tmp_path), posenc={"method": "interpolate", "factor": 2.0})


def test_encoder_errors_are_clear():
    model = tiny_encoder("bert")
    with pytest.raises(ValueError, match=r"at most n\^2 = 4096 positions"):
        hf_posenc.patch(model, "hierarchical", factor=65.0)
    with pytest.raises(ValueError, match="does not apply to model_type='bert'.*hierarchical"):
        hf_posenc.patch(model, "yarn", factor=2.0)
    with pytest.raises(ValueError, match="conflicts with the model's position table"):
        hf_posenc.patch(model, "interpolate", factor=2.0, original_max_position_embeddings=32)
    with pytest.raises(ValueError, match="alpha must be a number strictly between 0 and 1"):
        hf_posenc.patch(model, "hierarchical", factor=2.0, alpha=1.5)
    assert not hf_posenc.is_patched(model)


@pytest.mark.real_model
def test_minilm_runs_past_512_after_hierarchical_and_interpolate():
    from hf_posenc.checkpoints.models import resolve_source

    model = AutoModel.from_pretrained(resolve_source("all-minilm-l6-v2").path).eval()
    x512, x1500 = tokens(512, seed=5) * 100 % 30000 + 1000, tokens(1500, seed=6) * 100 % 30000 + 1000
    before = encode(model, x512)
    with pytest.raises(RuntimeError):
        encode(model, x1500)
    for method in ("hierarchical", "interpolate"):
        hf_posenc.patch(model, method, factor=4.0)
        assert model.config.max_position_embeddings == 2048
        assert encode(model, x1500).shape == (2, 1500, 384)
        if method == "hierarchical":
            assert torch.equal(encode(model, x512), before)
        hf_posenc.unpatch(model)
    assert torch.equal(encode(model, x512), before)


# -- T5 relative buckets -----------------------------------------------------------------------------
def tiny_t5(model_type: str = "t5", seed: int = 0):
    cfg = AutoConfig.for_model(model_type, vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                               num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=32,
                               relative_attention_max_distance=128, decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(seed)
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_config(cfg).eval()


@torch.no_grad()
def seq2seq_logits(model, enc_len=300, dec_len=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 100, (1, enc_len), generator=g)
    d = torch.randint(1, 100, (1, dec_len), generator=g)
    return model(input_ids=x, decoder_input_ids=d).logits


def test_bucket_reference_matches_t5s_code():
    from transformers.models.t5.modeling_t5 import T5Attention

    r = torch.arange(-700, 701)[None, :]
    for bidirectional in (True, False):
        for buckets, dist in ((32, 128), (16, 64), (32, 512)):
            ours = B.relative_position_bucket(r, bidirectional, buckets, dist)
            assert torch.equal(ours, T5Attention._relative_position_bucket(r, bidirectional, buckets, dist))
    # by hand, bidirectional, 32 buckets, max distance 128: 16 per sign, 8 exact
    hand = {0: 0, 5: 16 + 5, -5: 5, -8: 8, -127: 15, -128: 15, -5000: 15, 5000: 31}
    got = B.relative_position_bucket(torch.tensor(list(hand)), True, 32, 128).tolist()
    assert got == list(hand.values())
    assert torch.equal(B.scaled_relative_positions(torch.tensor([-7, -1, 0, 1, 7]), 2.0),
                       torch.tensor([-3, 0, 0, 0, 3]))


@pytest.mark.parametrize("model_type", ["t5", "mt5", "umt5"])
def test_bucket_scale_factor_one_is_exact_and_factor_two_divides_positions(model_type):
    model = tiny_t5(model_type)
    ref = seq2seq_logits(model)
    hf_posenc.patch(model, "bucket_scale", factor=1.0)
    assert torch.equal(seq2seq_logits(model), ref)
    hf_posenc.patch(model, "bucket_scale", factor=2.0)
    att = next(m for m in model.modules() if getattr(m, "has_relative_attention_bias", False))
    r = torch.arange(-300, 300)[None]
    expected = B.relative_position_bucket(torch.trunc(r / 2).long(), not att.is_decoder, 32, 128)
    if model_type == "umt5":
        assert torch.equal(att._relative_position_bucket(r), expected)
    else:
        assert torch.equal(att._relative_position_bucket(r, not att.is_decoder, 32, 128), expected)
    assert not torch.allclose(seq2seq_logits(model), ref)
    hf_posenc.unpatch(model)
    assert torch.equal(seq2seq_logits(model), ref) and "_relative_position_bucket" not in att.__dict__


def test_t5_saves_load_back_and_generate(tmp_path):
    model = hf_posenc.patch(tiny_t5(), "max_distance", factor=4.0)
    assert model.config.relative_attention_max_distance == 512
    model.save_pretrained(tmp_path / "md")
    plain = T5ForConditionalGeneration.from_pretrained(tmp_path / "md").eval()
    assert torch.equal(seq2seq_logits(plain), seq2seq_logits(model))  # native: a config field

    scaled = hf_posenc.patch(tiny_t5(), "bucket_scale", factor=3.0)
    scaled.save_pretrained(tmp_path / "bs")
    again = hf_posenc.from_pretrained(str(tmp_path / "bs")).eval()
    assert torch.equal(seq2seq_logits(again), seq2seq_logits(scaled))
    assert not torch.equal(seq2seq_logits(T5ForConditionalGeneration.from_pretrained(tmp_path / "bs").eval()),
                           seq2seq_logits(scaled))  # not native: plain transformers has the original buckets
    x = torch.randint(1, 100, (1, 200), generator=torch.Generator().manual_seed(1))
    out = again.generate(x, max_new_tokens=8, do_sample=False)
    assert out.shape[1] >= 2


def test_t5_methods_refuse_other_families():
    with pytest.raises(ValueError, match="does not apply to model_type='t5'"):
        hf_posenc.patch(tiny_t5(), "interpolate", factor=2.0)
    with pytest.raises(ValueError, match="does not apply to model_type='bert'"):
        hf_posenc.patch(tiny_encoder("bert"), "bucket_scale", factor=2.0)


def test_hf_posenc_methods_lists_the_encoder_families():
    out = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "methods", "--json"], capture_output=True, text=True)
    methods = __import__("json").loads(out.stdout)
    assert {"bert", "roberta", "distilbert"} <= set(methods["hierarchical"]["families"])
    assert (methods["bucket_scale"]["families"] == ["t5", "mt5", "umt5"]
            and {"llama", "bert"} <= set(methods["sinusoidal"]["families"]))
    assert {"llama", "bert", "t5"} <= set(methods["none"]["families"])


# -- moving positions into attention (alibi, rope, nope) ----------------------------------------------
@torch.no_grad()
def bert_reference(model, x, mask=None, slopes=None, rope_base=None):
    """A BERT forward written out, with the attention core re-implemented: scores + ALiBi (-m|i-j|) or
    RoPE on q/k (transformers' LLaMA rotation as the reference), padding masked."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    h = model.embeddings(input_ids=x)
    b, t, _ = h.shape
    heads = model.config.num_attention_heads
    d = model.config.hidden_size // heads
    pos = torch.arange(t)
    bias = 0.0 if slopes is None else -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs().float()
    allowed = torch.ones(b, 1, 1, t, dtype=torch.bool) if mask is None else mask[:, None, None, :].bool()
    if rope_base is not None:
        inv = rope_base ** (-torch.arange(0, d, 2).float() / d)
        emb = torch.cat([pos[:, None] * inv[None]] * 2, -1)
        cos, sin = emb.cos()[None], emb.sin()[None]
    for layer in model.encoder.layer:
        sa = layer.attention.self
        # F.linear: the projections' own forward would run the patch's hooks
        q, k, v = (torch.nn.functional.linear(h, p.weight, p.bias).view(b, t, heads, d).transpose(1, 2)
                   for p in (sa.query, sa.key, sa.value))
        if rope_base is not None:
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
        p = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(d) + bias).masked_fill(~allowed, float("-inf")), -1)
        ctx = (p @ v).transpose(1, 2).reshape(b, t, heads * d)
        a = layer.attention.output(ctx, h)
        h = layer.output(layer.intermediate(a), a)
    return h


@pytest.mark.parametrize("method", ["alibi", "rope", "nope"])
def test_bert_swaps_match_the_reference_and_run_long(method, tmp_path):
    model = tiny_encoder("bert")
    with torch.no_grad():  # sharper attention than random init gives, so that positions matter
        for layer in model.encoder.layer:
            layer.attention.self.query.weight.mul_(6)
            layer.attention.self.key.weight.mul_(6)
    before = encode(model, tokens(60))
    hf_posenc.patch(model, method, max_position_embeddings=4 * N)
    assert not model.embeddings.position_embeddings.weight.any() and model.config.max_position_embeddings == 4 * N
    x = tokens(150)
    mask = torch.ones_like(x)
    mask[1, 120:] = 0  # right padding
    kw = {"alibi": {"slopes": alibi_slopes(4)}, "rope": {"rope_base": 10000.0}, "nope": {}}[method]
    got = model(input_ids=x, attention_mask=mask).last_hidden_state
    want = bert_reference(model, x, mask, **kw)
    assert (got[0] - want[0]).abs().max().item() <= 1e-5 and (got[1, :120] - want[1, :120]).abs().max().item() <= 1e-5
    model.train()
    model(input_ids=x).last_hidden_state.pow(2).mean().backward()
    assert model.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert not model.embeddings.position_embeddings.weight.requires_grad
    model.eval().save_pretrained(tmp_path)
    again = hf_posenc.from_pretrained(str(tmp_path)).eval()
    assert torch.equal(encode(again, x), encode(model, x)) and hf_posenc.get_config(again).method == method
    with pytest.raises(ValueError, match="cannot be unpatched"):
        hf_posenc.unpatch(again)
    hf_posenc.unpatch(model)
    assert model.config._attn_implementation != "hf_posenc_alibi" and model.config.max_position_embeddings == N
    assert torch.equal(encode(model, tokens(60)), before)


def test_t5_alibi_and_rope_swaps():
    from hf_posenc.encodings.alibi import alibi_bias

    model = hf_posenc.patch(tiny_t5(), "alibi")
    att = model.encoder.block[0].layer[0].SelfAttention
    assert torch.equal(att.compute_bias(5, 7), alibi_bias(alibi_slopes(4), torch.arange(5), torch.arange(7)))
    dec = model.decoder.block[0].layer[0].SelfAttention
    assert torch.equal(dec.compute_bias(1, 9, past_seen_tokens=8)[0, :, 0],
                       alibi_bias(alibi_slopes(4), torch.tensor([8]), torch.arange(9))[0, :, 0])
    for method in ("alibi", "rope"):
        hf_posenc.patch(model, method)
        x = torch.randint(1, 100, (1, 150), generator=torch.Generator().manual_seed(2))
        out = model.generate(x, max_new_tokens=10, do_sample=False)
        full = model(input_ids=x, decoder_input_ids=out[:, :-1]).logits.argmax(-1)
        assert torch.equal(full[:, :], out[:, 1:]), method  # cached decoding = full forward (decoder positions)
    hf_posenc.unpatch(model)
    assert "compute_bias" not in att.__dict__
    assert torch.equal(seq2seq_logits(model), seq2seq_logits(tiny_t5()))


# -- encoder evaluation: needle retrieval ---------------------------------------------------------------
def test_expected_rank_with_ties():
    from hf_posenc.eval.retrieval import expected_rank_scores

    assert expected_rank_scores(torch.tensor([0.1, 0.9, 0.5]), 1) == (1.0, 1.0)
    assert expected_rank_scores(torch.tensor([0.1, 0.9, 0.5]), 2) == (0.0, 0.5)
    hit, rr = expected_rank_scores(torch.tensor([0.7, 0.7, 0.7, 0.2]), 0)
    assert hit == pytest.approx(1 / 3) and rr == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)


def test_retrieval_truncation_loses_deep_facts(tmp_path, bert_tokenizer):
    from hf_posenc.eval.run_retrieval import run_retrieval
    from hf_posenc.io.documents import read_text_file

    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.for_model(
        "bert", vocab_size=bert_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=N)).eval()
    on_loaded = __import__("helpers").on_loaded
    docs = [read_text_file(__import__("helpers").book_path("pg84.txt"))]

    def results():  # the unpatched model (the cut at N) and hierarchical x2, the same documents for both
        return on_loaded(run_retrieval, model, bert_tokenizer, methods=["none", "hierarchical"], factor=2.0,
                         docs=docs, lengths=[2 * N], depths=[0.95], trials=3, candidates=4)["results"]

    got = results()
    deep, seen = got["none"], got["hierarchical"]
    r = deep["by_length"][str(2 * N)]
    assert deep["positions"] == N and r["truncated_to"] == N
    assert r["accuracy"] == pytest.approx(0.25)  # the fact is past the cut: four identical candidates
    assert seen["positions"] == 2 * N and seen["by_length"][str(2 * N)]["truncated_to"] == 2 * N
    assert hf_posenc.get_config(model) is None  # the runner restored the model after each method
    assert results() == got  # same seed, same documents and numbers
    with pytest.raises(ValueError, match="candidates must be in"):
        on_loaded(run_retrieval, model, bert_tokenizer, docs=docs, lengths=[N], depths=[0.5], trials=1, candidates=1)


@pytest.mark.real_model
def test_cli_retrieval_on_minilm(tmp_path):
    from hf_posenc.cli import main

    rc = main(["eval", "retrieval", "--lengths", "512,1024", "--depths", "0.9", "--trials", "2",
               "--output", str(tmp_path), "--no-progress"])
    assert rc == 0
    report = __import__("json").loads((tmp_path / "retrieval.json").read_text())
    res = report["results"]
    assert res["none"]["positions"] == 512 and res["hierarchical"]["positions"] == 2048
    # hierarchical keeps the first 512 positions: identical numbers on 512-token documents
    assert res["hierarchical"]["by_length"]["512"] == res["none"]["by_length"]["512"]
    assert res["none"]["by_length"]["1024"]["accuracy"] == pytest.approx(1 / 5)  # the fact at depth 0.9 is cut
    assert (tmp_path / "retrieval_vs_length.png").stat().st_size > 1000
    only_names_a_fresh_folder_is_checked_for(tmp_path)


def test_t5_passkey_by_generation(tmp_path, bert_tokenizer):
    """The passkey machinery on an encoder-decoder: prompt into the encoder, key from the decoder."""
    from hf_posenc.cli import main
    from hf_posenc.eval.passkey import PasskeyBuilder, score_greedy, score_teacher_forced

    cfg = AutoConfig.for_model("t5", vocab_size=bert_tokenizer.vocab_size, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                               num_decoder_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(cfg).eval()
    p = PasskeyBuilder(bert_tokenizer).build(120, 0.5, "12345")
    dec = torch.cat([torch.tensor([0]), p.answer_ids[:-1]])[None]
    argmax = model(input_ids=p.input_ids[None], decoder_input_ids=dec).logits[0].argmax(-1)
    assert score_teacher_forced(model, p) == bool((argmax == p.answer_ids).all())
    ok, text = score_greedy(model, bert_tokenizer, p)
    assert isinstance(text, str) and ok == (text.strip().split(" ")[0] == "12345")
    model.save_pretrained(tmp_path / "t5")
    bert_tokenizer.save_pretrained(tmp_path / "t5")
    rc = main(["eval", "passkey", "--model", str(tmp_path / "t5"), "--methods", "none,bucket_scale", "--factor", "2",
               "--lengths", "100,200", "--depths", "0.5", "--trials", "2", "--scoring", "greedy",
               "--output", str(tmp_path / "out"), "--no-progress", "--no-plots"])
    assert rc == 0
    report = __import__("json").loads((tmp_path / "out" / "passkey.json").read_text())
    assert (set(report["results"]) == {"none", "bucket_scale"}
            and all("output" in s for s in report["results"]["none"]["samples"]))


@pytest.mark.parametrize("model_type", ["roberta", "distilbert"])
def test_encoder_alibi_attends_both_ways(model_type):
    model = hf_posenc.patch(tiny_encoder(model_type), "alibi", max_position_embeddings=4 * N)
    x = tokens(150)
    changed = x.clone()
    changed[:, 140] = 7
    first = encode(model, x)[:, 0]
    assert (encode(model, changed)[:, 0] - first).abs().max() > 0  # a late token reaches the first position
