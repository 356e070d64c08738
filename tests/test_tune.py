"""hf-posenc tune: the grid, the objective's cells, successive halving, confirmation on unseen data, resume,
best.json and the model card of a checkpoint patched from it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import ORIGINAL, tiny_model

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.config import PosEncConfig
from hf_posenc.eval.perplexity import Window, window_cell
from hf_posenc.io.documents import builtin_corpus, read_text_file
from hf_posenc.tuning import objective, space

T = 2 * ORIGINAL  # the tiny models' target: twice their 64 positions


@pytest.mark.parametrize("L, T_", [(8192, 12288), (8192, 16384), (4096, 32768), (64, 128)])
def test_every_grid_candidate_reaches_the_target(L, T_):
    cands = space.grid_candidates(["yarn", "self_extend", "string", "leaky_rerope", "dca", "pi"], L, T_)
    assert cands and len({c.label for c in cands}) == len(cands)
    for c in cands:
        p, m = c.config.params, c.method
        if m == "self_extend":  # grouped positions stay inside the trained range
            assert (T_ - p["window"]) / p["group_size"] + p["window"] < L and p["window"] % p["group_size"] == 0
        elif m == "string":
            assert T_ - p["shifted_offset"] + p["local_window"] < L and p["shifted_offset"] < L
        elif m == "leaky_rerope":
            assert p["window"] + (T_ - p["window"]) / p["leak"] < L
        elif m in ("yarn", "pi"):
            assert c.config.factor >= T_ / L
    assert space.factors(L, T_) == sorted({max(1.0, math.ceil(k * T_ / L * 2) / 2) for k in (1, 1.5, 2)})


def test_pinned_knobs_collapse_the_grid_and_bad_requests_are_refused():
    free = space.grid_candidates(["yarn"], 64, 128)
    pinned = space.grid_candidates(["yarn"], 64, 128, {"yarn": {"beta_fast": 8.0}})
    assert len(free) == 2 * len(pinned) and all(c.config.params["beta_fast"] == 8.0 for c in pinned)
    with pytest.raises(ValueError, match="within the model's original context"):
        space.grid_candidates(["yarn"], 64, 64)
    with pytest.raises(ValueError, match="no grid for method 'interpolate'"):
        space.check_methods(["interpolate"])


def test_space_files_list_candidates_or_products(tmp_path):
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(["y2=yarn:factor=2,beta_fast=16",
                                  {"label": "d", "method": "dca", "params": {"chunk_size": 32}}]))
    got = space.load_space(str(listed))
    assert [v.label for v in got] == ["y2", "d"] and got[0].config.params["beta_fast"] == 16
    product = tmp_path / "product.json"
    product.write_text(json.dumps({"yarn": {"factor": [2, 3], "attention_factor": [1.0, None]}}))
    assert len(space.load_space(str(product))) == 4
    for text, message in [("[1, 2]", "a candidate is"), ("{", "not JSON"),
                          ('{"yarn": {"factor": 2}}', "non-empty list"),
                          ('[{"label": "x", "method": "yran"}]', "yran")]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            space.load_space(str(bad))
    with pytest.raises(ValueError, match="cannot read it"):
        space.load_space(str(tmp_path / "missing.json"))


def _metrics(pk, beyond, short):
    return {"passkey": pk, "ppl_beyond": beyond, "ppl_short": short}


def test_rank_disqualifies_costly_candidates_and_orders_the_rest():
    ms = {"a": _metrics(1.0, 20, 10.2), "b": _metrics(0.6, 12, 10.0), "c": _metrics(1.0, 15, 10.05),
          "d": _metrics(0.6, 11, 10.0)}
    assert objective.rank(ms, {"ppl_short": 10.0}, 0.01) == ["c", "d", "b", "a"]
    assert ms["a"]["disqualified"] and ms["a"]["short_cost"] == pytest.approx(0.02)
    assert objective.rank(ms, {"ppl_short": 10.0}, 0.01, rank_by="ppl") == ["d", "b", "c", "a"]


def _data(tok, target=T):
    docs = builtin_corpus("python-docs")
    tokens = [torch.tensor(tok(d.text[:20000], add_special_tokens=False)["input_ids"]) for d in docs]
    return objective.plan_data(tokens, [d.name for d in docs], [f"g{i}" for i in range(len(docs))], ORIGINAL, target)


def test_calibration_and_confirmation_never_share_a_cell_and_samples_nest(bert_tokenizer):
    data = _data(bert_tokenizer)
    cal = objective.sample_keys(data, "calibration", 4, 2, objective.DEPTHS, 0, T, ORIGINAL)
    conf = objective.sample_keys(data, "confirmation", 4, 2, objective.DEPTHS, 0, T, ORIGINAL)
    spans = lambda keys: {(k[2], b) for k in keys if k[0] != "passkey" for b in range(k[4], k[4] + k[1])}  # noqa: E731
    assert not spans([k for k in cal if k[0] == "long"]) & spans([k for k in conf if k[0] == "long"])
    assert not {k[3] for k in cal if k[0] == "passkey"} & {k[3] for k in conf if k[0] == "passkey"}
    small = objective.sample_keys(data, "calibration", 2, 1, objective.DEPTHS, 0, T, ORIGINAL)
    assert all(k in cal for k in small) and len(small) == 2 + 2 + len(objective.DEPTHS)


def test_a_long_cell_splits_the_window_loss_at_the_original_context(bert_tokenizer):
    model = tiny_model("llama", vocab_size=bert_tokenizer.vocab_size)
    data = _data(bert_tokenizer)
    compute = objective.CellComputer(model, bert_tokenizer, data, ORIGINAL)
    w = data.long["calibration"][0]
    cell = compute(None, ["long", T, data.names[w.doc], data.digests[w.doc], w.begin])
    whole = window_cell(model, data.docs[w.doc], Window(w.doc, w.begin, w.end, 1))
    assert cell["beyond_cnt"] == T - ORIGINAL and cell["inside_cnt"] == ORIGINAL - 1
    assert cell["inside_sum"] + cell["beyond_sum"] == pytest.approx(whole["nll_sum"], rel=1e-9)
    assert sum(cell["bucket_sum"]) == pytest.approx(whole["nll_sum"], rel=1e-9)


def _tune(checkpoint, out, *extra):
    return ["tune", "--model", checkpoint, "--target-length", str(T), "--corpus", "python-docs", "--no-progress",
            "--output", str(out), *extra]


def test_tune_halves_confirms_writes_best_and_resumes(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "tune"
    assert main(_tune(tiny_checkpoint, out, "--methods", "yarn,dynamic_ntk,dca")) == 0
    report = json.loads((out / "tune.json").read_text())
    res = report["results"]
    sizes = [len(r["metrics"]) for r in res["rungs"]]
    assert sizes[0] == 12 + 3 + 4 and sizes == sorted(sizes, reverse=True) and sizes[-1] == 2
    assert [r["keys_per_depth"] for r in res["rungs"]] == [2 ** i for i in range(len(sizes))]
    last = res["rungs"][-1]
    assert res["best"] == last["ranking"][0] and res["runner_up"] == last["ranking"][1]
    for r in res["rungs"]:
        for m in r["metrics"].values():
            assert m["disqualified"] == (m["short_cost"] > 0.01)
            if m.get("passkey_trials"):
                assert m["passkey_trials"] == r["keys_per_depth"] * len(objective.DEPTHS)
        for label, m in r["metrics"].items():  # dynamic NTK leaves inputs of L tokens exactly as they were
            if label.startswith("dynamic_ntk"):
                assert m["short_cost"] == 0.0
    conf = res["confirmation"]["metrics"]
    ref = res["reference"]["label"]  # YaRN, default knobs, at the winner's factor (at T / L for DCA: it takes none)
    winner = res["configs"][res["best"]]
    factor = T / ORIGINAL if winner["method"] == "dca" else winner["factor"]
    assert PosEncConfig.from_dict(res["reference"]["config"]) == PosEncConfig("yarn", factor)
    assert set(conf) == {res["best"], res["runner_up"], ref} and len(conf) in (2, 3)
    assert (f"{ref} (reference: YaRN, default knobs)" in (out / "tune.md").read_text()
            or ref in (res["best"], res["runner_up"]))
    assert conf[res["best"]]["ppl_beyond"] != last["metrics"][res["best"]]["ppl_beyond"]  # other data
    best = PosEncConfig.from_json((out / "best.json").read_text())
    assert best == PosEncConfig.from_dict(res["configs"][res["best"]])
    md = (out / "tune.md").read_text()
    assert (out / "tune_loss_by_position.png").exists() and "**best**" in md
    for r in res["rungs"]:  # the unpatched model is shown on each rung's data, beside the rows of that rung
        assert f"| none (unpatched) | {r['rung']}: {r['windows']} window(s), {r['keys_per_depth']} key(s)" in md
    cells = (out / "cells.jsonl").read_text()
    capsys.readouterr()
    assert main(_tune(tiny_checkpoint, out, "--methods", "yarn,dynamic_ntk,dca")) == 0
    assert "resumed" in capsys.readouterr().err and (out / "cells.jsonl").read_text() == cells  # nothing recomputed
    again = json.loads((out / "tune.json").read_text())["results"]
    assert {k: again[k] for k in ("best", "runner_up", "rungs", "confirmation")} == \
        {k: res[k] for k in ("best", "runner_up", "rungs", "confirmation")}
    compute = report["setup"]["compute"]  # every cell of the file is used, each timed once, on its line
    lines = [json.loads(line) for line in cells.splitlines()]
    assert compute["untimed"] == 0 and compute["cells"] == sum(item.get("kind") == "cell" for item in lines)
    assert compute["seconds"] == pytest.approx(sum(item.get("seconds", 0) for item in lines), abs=1e-3)
    assert all("seconds" not in item.get("result", {}) for item in lines)  # the line's, not twice
    old_release = []  # cells of earlier releases: the tune timed each inside its result, the line had no seconds
    for line in cells.splitlines():
        item = json.loads(line)
        if item.get("kind") == "cell":
            item["result"]["seconds"] = item.pop("seconds")
        old_release.append(json.dumps(item))
    (out / "cells.jsonl").write_text("\n".join(old_release) + "\n")
    assert main(_tune(tiny_checkpoint, out, "--methods", "yarn,dynamic_ntk,dca")) == 0
    resumed = json.loads((out / "tune.json").read_text())
    assert resumed["results"]["rungs"] == res["rungs"] and resumed["setup"]["compute"] == compute


def test_a_small_budget_stops_the_halving_but_still_confirms(tiny_checkpoint, tmp_path):
    out = tmp_path / "tune"
    assert main(_tune(tiny_checkpoint, out, "--methods", "yarn", "--budget-minutes", "0.0001")) == 0
    res = json.loads((out / "tune.json").read_text())["results"]
    assert res["stopped_by_budget"] and len(res["rungs"]) == 1
    assert set(res["confirmation"]["metrics"]) == {res["best"], res["runner_up"], res["reference"]["label"]} - {None}


def test_a_checkpoint_patched_from_best_json_says_how_it_was_tuned(tiny_checkpoint, tmp_path, capsys, caplog):
    out = tmp_path / "tune"
    assert main(_tune(tiny_checkpoint, out, "--methods", "dca")) == 0
    res = json.loads((out / "tune.json").read_text())["results"]  # DCA takes no factor: the reference is YaRN at T / L
    assert PosEncConfig.from_dict(res["reference"]["config"]) == PosEncConfig("yarn", T / ORIGINAL) and T / ORIGINAL > 1
    assert main(["patch", "--model", tiny_checkpoint, "--config", str(out / "best.json"), "--output",
                 str(tmp_path / "p")]) == 0
    card = (tmp_path / "p" / "README.md").read_text()
    assert "How this configuration was chosen (hf-posenc tune)" in card and f"Tuned for {T} tokens" in card
    assert "hf-posenc tune --model" in card  # the command behind the table
    model = hf_posenc.from_pretrained(str(tmp_path / "p"))
    best = PosEncConfig.from_json((out / "best.json").read_text())
    assert hf_posenc.get_config(model) == best.replace(original_max_position_embeddings=ORIGINAL)
    other = tmp_path / "other.json"
    other.write_text(PosEncConfig("dca", params={"chunk_size": 40}).to_json())
    (tmp_path / "tune.json").write_text((out / "tune.json").read_text())  # beside, but chose something else
    assert main(["patch", "--model", tiny_checkpoint, "--config", str(other), "--output", str(tmp_path / "q")]) == 0
    assert "hf-posenc tune" not in (tmp_path / "q" / "README.md").read_text()
    import shutil

    another = shutil.copytree(tiny_checkpoint, tmp_path / "another")  # best.json given to a model it did not tune
    with caplog.at_level("WARNING", logger="hf_posenc"):
        assert main(["patch", "--model", str(another), "--config", str(out / "best.json"), "--output",
                     str(tmp_path / "r")]) == 0
    assert f"was tuned on {tiny_checkpoint}, not on {another}: it is applied as given" in caplog.text
    assert "hf-posenc tune" not in (tmp_path / "r" / "README.md").read_text()


def test_tune_from_python_on_a_loaded_model(bert_tokenizer, monkeypatch):
    chunks, nll = [], objective.token_nll
    monkeypatch.setattr(objective, "token_nll", lambda *a, **k: chunks.append(k["chunk_size"]) or nll(*a, **k))
    model = tiny_model("llama", vocab_size=bert_tokenizer.vocab_size)
    report = hf_posenc.tune(model, bert_tokenizer, target_length=T, methods=["dca"],
                            docs=builtin_corpus("python-docs"), progress=False, chunk_size=7)
    assert report["results"]["best"] in report["results"]["configs"] and not hf_posenc.is_patched(model)
    assert chunks and set(chunks) == {7}  # --chunk-size reaches the LM head


def test_tune_from_python_takes_the_cli_data_keywords_and_refuses_unknown_ones(bert_tokenizer, tmp_path):
    model = tiny_model("llama", vocab_size=bert_tokenizer.vocab_size)
    book = tmp_path / "book.txt"
    book.write_text(builtin_corpus("python-docs")[0].text)
    common = dict(target_length=T, methods=["dca"], progress=False)
    by_file = hf_posenc.tune(model, bert_tokenizer, text_file=str(book), **common)  # as --text-file does
    by_docs = hf_posenc.tune(model, bert_tokenizer, docs=[read_text_file(str(book))], **common)
    assert by_file["setup"]["documents"] == by_docs["setup"]["documents"] == [read_text_file(str(book)).name]
    def ranked(report):  # the numbers, not the seconds they took
        return [(r["ranking"], {k: m["ppl_beyond"] for k, m in r["metrics"].items()})
                for r in report["results"]["rungs"]]
    assert ranked(by_file) == ranked(by_docs) and by_file["results"]["best"] == by_docs["results"]["best"]
    with pytest.raises(ValueError, match="unknown keyword.*text_flie.*text_file"):
        hf_posenc.tune(model, bert_tokenizer, text_flie=str(book), **common)
    with pytest.raises(ValueError, match="give docs or corpus, not both"):
        hf_posenc.tune(model, bert_tokenizer, docs=[read_text_file(str(book))], corpus="python-docs", **common)


@pytest.mark.parametrize("keywords, message", [
    (dict(target_length=0), "target_length is a whole number >= 1, got 0"),
    (dict(target_length="128"), "target_length is a whole number >= 1, got '128'"),
    (dict(target_length=T, methods="yarn"), "methods is a list of method names, e.g. ['yarn', 'ntk'], got 'yarn'"),
    (dict(target_length=T, dtype="float8"), "a model already loaded is used as it is: drop dtype"),
    (dict(target_length=T, device="cpu", attn_implementation="eager"), "drop device, attn_implementation"),
])
def test_tune_from_python_refuses_bad_settings_before_any_compute(keywords, message, bert_tokenizer, monkeypatch):
    import hf_posenc.tuning.search as search_module

    def refuse(*a, **k):
        raise AssertionError("the search started before the bad input was refused")

    monkeypatch.setattr(search_module, "Run", refuse)
    model = tiny_model("llama", vocab_size=bert_tokenizer.vocab_size)
    with pytest.raises(ValueError) as err:
        hf_posenc.tune(model, bert_tokenizer, corpus="python-docs", progress=False, **keywords)
    assert message in str(err.value)


@pytest.mark.parametrize("extra, message", [
    (["--target-length", "64"], "within the model's original context (64)"),
    (["--methods", "interpolate"], "no grid for method 'interpolate'"),
    (["--space", "/nowhere/space.json"], "--space /nowhere/space.json: cannot read it"),
    (["--max-short-cost", "-1"], "--max-short-cost is a fraction >= 0"),
    (["--methods", "yarn", "--space", "x.json"], "--space replaces the grid of --methods"),
])
def test_bad_tune_input_is_refused_clearly(extra, message, tiny_checkpoint, tmp_path, capsys):
    argv = _tune(tiny_checkpoint, tmp_path / "o")
    if "--target-length" in extra:
        argv[argv.index("--target-length") + 1] = extra[1]
        extra = []
    assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o" / "tune.json").exists()
