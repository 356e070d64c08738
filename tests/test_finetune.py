"""Fine-tuning a patched model: packing, training through Trainer, held-out perplexity, reload."""

import json

import pytest
import torch
from helpers import book_path, ids, tiny_model

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.io.documents import read_text_file, tokenize_documents
from hf_posenc.training.finetune import heldout_perplexity, pack


def test_pack_joins_documents_with_eos_into_whole_blocks():
    blocks = pack([torch.arange(5), torch.arange(10, 17)], 4, eos=99)
    assert blocks.tolist() == [[0, 1, 2, 3], [4, 99, 10, 11], [12, 13, 14, 15]]
    with pytest.raises(ValueError, match="too little training text"):
        pack([torch.arange(3)], 8, eos=None)


def test_document_packing_never_straddles_two_documents():
    blocks = pack([torch.arange(5), torch.arange(10, 19), torch.arange(30, 33)], 4, eos=99, packing="document")
    assert blocks.tolist() == [[0, 1, 2, 3], [10, 11, 12, 13], [14, 15, 16, 17]]  # remainders and short docs dropped
    with pytest.raises(ValueError, match=r"no document holds a block of seq_len=8 tokens \(the longest has 5\)"):
        pack([torch.arange(5)], 8, eos=99, packing="document")
    with pytest.raises(ValueError, match="--packing must be one of document, stream, stream-restart, got 'docs'"):
        pack([torch.arange(5)], 4, eos=99, packing="docs")


def test_restarted_positions_start_again_after_each_eos_and_at_each_block():
    from hf_posenc.training.finetune import restarted_positions

    blocks = pack([torch.arange(5), torch.arange(10, 17)], 4, eos=99)  # [[0,1,2,3],[4,99,10,11],[12,13,14,15]]
    assert restarted_positions(blocks, 99).tolist() == [[0, 1, 2, 3], [0, 1, 0, 1], [0, 1, 2, 3]]


@pytest.mark.parametrize("method", ["alibi", "learned", "yarn"])
def test_gradient_checkpointing_keeps_the_patch(method):
    kw = {"factor": 2.0}
    grads = []
    for checkpointing in (False, True):
        model = hf_posenc.patch(tiny_model("llama"), method, **({} if method == "alibi" else kw)).train()
        model.config._attn_implementation = "sdpa"
        if checkpointing:
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        x = ids(80)
        loss = model(x, labels=x).loss
        loss.backward()
        grads.append((loss.item(), model.model.layers[0].self_attn.k_proj.weight.grad.clone()))
    assert grads[0][0] == pytest.approx(grads[1][0], abs=1e-6)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-6)


def test_cli_finetune_trains_and_saves_a_reloadable_patch(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "ft"
    rc = main(["finetune", "--model", tiny_checkpoint, "--method", "alibi", "--text-file", book_path("pg1513.txt"),
               "--eval-text-file", book_path("pg84.txt"), "--seq-len", "64", "--steps", "12", "--learning-rate",
               "3e-3", "--batch-size", "2", "--eval-windows", "4", "--output", str(out), "--no-progress"])
    assert rc == 0
    assert "held-out ppl before" in capsys.readouterr().out
    report = json.loads((out / "hf_posenc_eval" / "finetune.json").read_text())
    losses = [x["loss"] for x in report["losses"]]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3  # the training loss falls
    assert report["heldout_after"]["ppl"] < report["heldout_before"]["ppl"]  # and a book not trained on improves
    assert (report["setup"]["command"].startswith("hf-posenc finetune")
            and (out / "hf_posenc_eval" / "finetune_loss.png").exists())
    model = hf_posenc.from_pretrained(str(out), attn_implementation="sdpa").eval()
    assert hf_posenc.get_config(model).method == "alibi"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    held = tokenize_documents(tok, [read_text_file(book_path("pg84.txt"))], 64 * 4)
    again = heldout_perplexity(model, held, 64, 4)["ppl"]
    assert again == pytest.approx(report["heldout_after"]["ppl"], rel=1e-5)  # the saved model is the trained one
    card = (out / "README.md").read_text()
    assert "fine-tuned" in card and "### Fine-tuning" in card and "| alibi | 12 | 64 |" in card
    assert (out / "hf_posenc_eval" / "finetune.md").read_text().strip() == report["table"]


def test_cli_finetune_errors(tiny_checkpoint, tmp_path, capsys):
    book = book_path("pg84.txt")
    assert main(["finetune", "--model", tiny_checkpoint, "--method", "alibi", "--text-file", book,
                 "--eval-text-file", book, "--output", str(tmp_path)]) == 2
    assert "also in the training data" in capsys.readouterr().err
    assert main(["finetune", "--model", tiny_checkpoint, "--method", "alibi", "--eval-text-file", book,
                 "--output", str(tmp_path)]) == 2
    assert "needs training text" in capsys.readouterr().err


def test_the_chunked_training_loss_equals_the_models_own_with_gradient_accumulation():
    """Training never holds [tokens, vocab] logits: the chunked loss and its gradients equal the
    model's own loss, and a Trainer run with gradient accumulation logs the same losses and ends at the same weights."""
    from hf_posenc.eval.scoring import chunked_lm_loss
    from hf_posenc.training.finetune import _train
    from hf_posenc.training.settings import TrainSettings

    model = hf_posenc.patch(tiny_model("llama"), "yarn", factor=2.0).train()
    x = torch.randint(0, 96, (2, 100), generator=torch.Generator().manual_seed(1))
    model(x, labels=x).loss.backward()
    own = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    total, count = chunked_lm_loss(model, x, chunk_size=16)
    (total / count).backward()
    assert count == 2 * 99 and (total / count).item() == pytest.approx(model(x, labels=x).loss.item(), abs=1e-5)
    assert max((p.grad - own[n]).abs().max().item() for n, p in model.named_parameters()) < 1e-6
    blocks = torch.randint(0, 96, (8, 32), generator=torch.Generator().manual_seed(0))
    runs = []
    for chunked in (False, True):
        m = hf_posenc.patch(tiny_model("llama"), "yarn", factor=2.0)
        losses, _ = _train(m, blocks, None, TrainSettings(steps=3, batch_size=2, grad_accum=2, learning_rate=1e-3,
                                                          gradient_checkpointing=False, device="cpu",
                                                          chunked_loss=chunked), progress=False)
        runs.append(([x["loss"] for x in losses], dict(m.named_parameters())))
    assert runs[0][0] == pytest.approx(runs[1][0], abs=1e-5)
    assert max((runs[0][1][n] - p).abs().max().item() for n, p in runs[1][1].items()) < 1e-5


def test_cli_finetune_with_restarted_positions_feeds_them(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    from helpers import refused

    import hf_posenc.training.finetune as ft

    argv = ["finetune", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--text-file",
            book_path("pg1513.txt"), "--eval-text-file", book_path("pg84.txt"), "--seq-len", "64", "--steps", "1",
            "--eval-windows", "1", "--packing", "stream-restart", "--no-progress"]
    err = refused([*argv, "--output", str(tmp_path / "no")], capsys)  # MiniLM's WordPiece tokenizer: no EOS
    assert "the tokenizer of" in err and "has none" in err and not (tmp_path / "no").exists()
    fed = []
    real = ft._train

    def spy(lm, blocks, positions, *rest, **kw):
        fed.append((blocks, positions))
        return real(lm, blocks, positions, *rest, **kw)

    monkeypatch.setattr(ft, "_train", spy)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    monkeypatch.setattr(type(tok), "eos_token_id", property(lambda self: self.sep_token_id), raising=False)  # [SEP]
    out = tmp_path / "ft"
    assert main([*argv, "--output", str(out)]) == 0
    blocks, positions = fed[0]
    assert torch.equal(positions, ft.restarted_positions(blocks, tok.sep_token_id)) and int(positions.max()) < 64
    assert json.loads((out / "hf_posenc_eval" / "finetune.json").read_text())["setup"]["packing"] == "stream-restart"


def test_cli_finetune_on_the_builtin_corpus_needs_nothing_outside_the_package(tiny_checkpoint, tmp_path, capsys):
    """A fresh clone fine-tunes with --corpus python-docs: documents 1-2 trained on, 3 held out (or the files of
    --eval-text-file); a second training source, or no held-out text at all, refused by name before anything."""
    from helpers import refused

    from hf_posenc.io.documents import builtin_corpus

    out = tmp_path / "ft"
    argv = ["finetune", "--model", tiny_checkpoint, "--method", "yarn", "--corpus", "python-docs", "--seq-len", "64",
            "--steps", "2", "--eval-windows", "1", "--output", str(out), "--no-progress"]
    assert main(argv) == 0
    setup = json.loads((out / "hf_posenc_eval" / "finetune.json").read_text())["setup"]
    assert (setup["train_documents"], setup["eval_documents"]) == (["python-docs[1]", "python-docs[2]"],
                                                                   ["python-docs[3]"])
    held = tmp_path / "held.txt"
    held.write_text(builtin_corpus()[3].text)
    assert main(argv[:-3] + ["--eval-text-file", str(held), "--output", str(tmp_path / "files"), "--no-progress"]) == 0
    setup = json.loads((tmp_path / "files" / "hf_posenc_eval" / "finetune.json").read_text())["setup"]
    assert setup["eval_documents"] == ["held.txt"]
    capsys.readouterr()
    err = refused(argv[:-3] + ["--text-file", str(held), "--output", str(tmp_path / "both")], capsys)
    assert "--corpus python-docs is the training text; --text-file too: give one or the other" in err
    err = refused(["finetune", "--model", tiny_checkpoint, "--method", "yarn", "--text-file", str(held), "--output",
                   str(tmp_path / "none")], capsys)
    assert "finetune needs held-out text (never trained on): --eval-text-file FILE" in err
    assert not (tmp_path / "both").exists() and not (tmp_path / "none").exists()
