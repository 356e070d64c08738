"""``eval ppl``, ``eval passkey`` and ``finetune`` through the CLI on tiny checkpoints beyond a plain Llama: a
sliding/full hybrid with a RoPE per layer type (gemma3_text; gemma4_text, whose head widths differ between its
layer types and whose full layers turn a proportional RoPE), a checkpoint whose RoPE is already scaled (a Llama with
llama3 x8 over 64, advertising 512) and a mixture of experts (qwen3_moe). Each saved with a real tokenizer; on the
llama3 one a RoPE scaling extends the checkpoint's own (the composed longrope), which the reports and the saved
checkpoint say, and which a reload and an unpatch give back exactly."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
import torch
from helpers import THETA, tiny_config
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.io.documents import builtin_corpus, tokenize_documents
from hf_posenc.training.finetune import heldout_perplexity

LLAMA3 = {"rope_type": "llama3", "rope_theta": THETA, "factor": 8.0, "original_max_position_embeddings": 64,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0}
GEMMA3_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": THETA},
               "sliding_attention": {"rope_type": "default", "rope_theta": 7_000.0}}
CHECKPOINTS = {  # name: (model_type, config overrides, the context L it advertises)
    "gemma3_text": ("gemma3_text", dict(head_dim=16, sliding_window=12, rope_parameters=GEMMA3_ROPE,
                                        layer_types=["sliding_attention", "full_attention"]), 64),
    "gemma4_text": ("gemma4_text", dict(  # head widths 16 sliding / 32 full, proportional RoPE on the full layers
        head_dim=16, global_head_dim=32, sliding_window=12, hidden_size_per_layer_input=16,
        layer_types=["sliding_attention", "full_attention"], rope_parameters={
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": THETA},
            "sliding_attention": {"rope_type": "default", "rope_theta": 7_000.0}}), 64),
    "llama3": ("llama", dict(max_position_embeddings=512, rope_parameters=LLAMA3), 512),
    "qwen3_moe": ("qwen3_moe", dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32), 64),
}
METHODS = ("none", "yarn", "self_extend", "dca")
TRAINED = {"gemma4_text": "pi"}  # the scaling finetune trains (yarn; on Gemma 4's proportional RoPE the native one)


@dataclass(frozen=True)
class Saved:
    name: str
    path: str
    context: int  # L: what the checkpoint advertises, the evaluations' original context


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def saved(request, tmp_path_factory, bert_tokenizer) -> Saved:
    """The tiny checkpoint ``request.param`` with MiniLM's tokenizer, in a folder of its own."""
    model_type, overrides, context = CHECKPOINTS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    config = tiny_config(model_type, vocab_size=bert_tokenizer.vocab_size, **overrides)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    return Saved(request.param, str(folder), context)


def _report(folder, name: str) -> dict:
    return json.loads((folder / f"{name}.json").read_text())


def _check_applied_yarn(saved: Saved, setup: dict) -> None:
    """The yarn x2 variant as the run applied it: on the llama3 checkpoint the composed longrope that extends its
    scaling from 512 (not yarn from the pretraining 64), elsewhere yarn itself over L."""
    applied = setup["applied"]["yarn"]
    assert applied["context"] == 2 * saved.context and setup["variants"]["yarn"]["method"] == "yarn"
    if saved.name == "llama3":
        assert applied["config"]["method"] == "longrope"
        assert applied["config"]["original_max_position_embeddings"] == 512
        assert applied["own_scaling"] == {"rope_type": "llama3", "pretrained_context": 64, "context": 512,
                                          "replaced": False}
    else:
        assert applied["config"]["method"] == "yarn" and applied["own_scaling"] is None
        assert applied["config"]["original_max_position_embeddings"] == saved.context
    if saved.name == "gemma3_text":  # the full-attention layers' RoPE scaled, the sliding ones' kept
        assert applied["config"]["params"]["layer_types"] == ["full_attention"]


def test_eval_ppl_gives_every_method_past_l_beside_the_truncated_baseline(saved, tmp_path):
    length = saved.context + 32
    out = tmp_path / "ppl"
    # on the llama3 checkpoint, also a yarn that replaces its scaling (from the pretraining context 64)
    replacing = ["--variant", "replaced=yarn:factor=16,original_max_position_embeddings=64"]
    assert main(["eval", "ppl", "--model", saved.path, "--methods", ",".join(METHODS), "--factor", "2", "--lengths",
                 str(length), "--corpus", "python-docs", "--limit", "1", "--max-windows", "1", "--no-progress",
                 "--no-plots", "--output", str(out), *(replacing if saved.name == "llama3" else [])]) == 0
    report = _report(out, "perplexity")
    setup, results = report["setup"], report["results"]
    baseline = setup["truncated_baseline"]
    assert setup["original_context"] == saved.context and baseline["context"] == saved.context
    ref = results[baseline["label"]][str(length)]["past_original"]
    assert (ref["from"], ref["tokens"]) == (saved.context, 32) and math.isfinite(ref["ppl"])
    for method in METHODS:
        cell = results[method][str(length)]
        past = cell["past_original"]
        assert math.isfinite(cell["ppl"]) and math.isfinite(past["ppl"]) and cell["windows"] == 1
        assert (past["from"], past["tokens"]) == (saved.context, 32)
        assert cell["context_gain"] == pytest.approx(ref["ppl"] / past["ppl"])
        if method != "none":  # each method changed the model past its window
            assert past["ppl"] != results["none"][str(length)]["past_original"]["ppl"]
    _check_applied_yarn(saved, setup)
    table = (out / "perplexity.md").read_text()
    assert f"| {length}: past L |" in table and f"| {baseline['label']} |" in table
    extends = "yarn: the checkpoint's RoPE is already scaled (llama3, pretrained for 64 tokens, a context of 512); " \
              "yarn extends it from 512 to 1024 tokens (computed as longrope"
    assert (extends in table) == (saved.name == "llama3")
    if saved.name == "llama3":
        assert setup["applied"]["replaced"]["own_scaling"]["replaced"] is True
        assert setup["applied"]["replaced"]["config"]["method"] == "yarn"
        assert ("replaced: the checkpoint's RoPE is already scaled (llama3, pretrained for 64 tokens, a context of "
                "512); yarn replaced that scaling, scaling from the pretraining context to 1024 tokens.") in table


def test_eval_passkey_runs_every_method_with_a_needle_beyond_l(saved, tmp_path):
    length = saved.context + 96  # the prompt's preamble puts the depth-0 needle some 50 tokens in
    out = tmp_path / "passkey"
    assert main(["eval", "passkey", "--model", saved.path, "--methods", ",".join(METHODS), "--factor", "2",
                 "--lengths", str(length), "--depths", "0,1", "--trials", "1", "--no-progress", "--no-plots",
                 "--output", str(out)]) == 0
    report = _report(out, "passkey")
    assert set(report["results"]) == set(METHODS) and report["setup"]["original_context"] == saved.context
    for method in METHODS:
        res = report["results"][method]
        assert len(res["cells"]) == 2 and len(res["samples"]) == 2 and 0.0 <= res["accuracy"] <= 1.0
        assert res["beyond_reach"][str(length)]["trials"] == 1  # the needle at depth 0 lies before the last L tokens
    _check_applied_yarn(saved, report["setup"])


def _expected_rope(saved: Saved, config: dict) -> None:
    """config.json of the fine-tuned scaling x2 (:data:`TRAINED`): native rope_parameters twice the context, the
    original in the block."""
    rope, block = config["rope_parameters"], config["hf_posenc"]
    assert config["max_position_embeddings"] == 2 * saved.context
    if saved.name == "gemma4_text":  # PI on the full layers' proportional RoPE: that type's own factor
        assert rope["full_attention"] == {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                          "rope_theta": THETA, "factor": 2.0}
        assert rope["sliding_attention"] == {"rope_type": "default", "rope_theta": 7_000.0}
    elif saved.name == "gemma3_text":
        assert rope["full_attention"]["rope_type"] == "yarn" and rope["sliding_attention"]["rope_type"] == "default"
        assert rope["sliding_attention"]["rope_theta"] == 7_000.0
    elif saved.name == "llama3":
        assert rope["rope_type"] == "longrope" and rope["original_max_position_embeddings"] == 512
        assert block["method"] == "longrope" and block["original"]["rope_parameters"] == LLAMA3
        assert block["original"]["max_position_embeddings"] == 512
    else:
        assert rope["rope_type"] == "yarn" and rope["original_max_position_embeddings"] == saved.context
    assert block["native"] is True


def test_finetune_trains_saves_and_reloads_the_trained_model(saved, tmp_path, capsys):
    seq_len = saved.context + 64
    out = tmp_path / "ft"
    assert main(["finetune", "--model", saved.path, "--method", TRAINED.get(saved.name, "yarn"), "--factor", "2",
                 "--corpus", "python-docs",
                 "--seq-len", str(seq_len), "--steps", "2", "--eval-windows", "1", "--no-long-eval", "--no-progress",
                 "--output", str(out)]) == 0
    assert "held-out ppl before" in capsys.readouterr().out
    report = json.loads((out / "hf_posenc_eval" / "finetune.json").read_text())
    assert len(report["losses"]) == 2 and all(math.isfinite(x["loss"]) for x in report["losses"])
    assert math.isfinite(report["heldout_after"]["ppl"]) and report["setup"]["eval_documents"] == ["python-docs[3]"]
    config = json.loads((out / "config.json").read_text())
    _expected_rope(saved, config)

    model = hf_posenc.from_pretrained(str(out), dtype=torch.float32).eval()
    assert hf_posenc.get_config(model).method == config["hf_posenc"]["method"]
    held = tokenize_documents(AutoTokenizer.from_pretrained(out), builtin_corpus()[3:], seq_len)
    again = heldout_perplexity(model, held, seq_len, 1)["ppl"]
    assert again == pytest.approx(report["heldout_after"]["ppl"], rel=1e-5)  # the saved model is the trained one
    plain = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()  # native: transformers alone
    x = torch.randint(5, 1000, (1, seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (plain(x).logits - model(x).logits).abs().max().item() <= 1e-5

    base = AutoModelForCausalLM.from_pretrained(saved.path, dtype=torch.float32).eval()
    hf_posenc.unpatch(model)  # the checkpoint's own RoPE again, the trained weights kept
    assert model.config.max_position_embeddings == saved.context
    assert model.config.rope_parameters == base.config.rope_parameters
    own = {n: b for n, b in base.named_buffers() if n.endswith("inv_freq")}
    assert own and all(torch.equal(dict(model.named_buffers())[n], b) for n, b in own.items())
