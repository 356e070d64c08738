"""hf-posenc tune --search evolution: per-dimension longrope factors under LongRoPE's constraints, seeded from the
static scalings, searched generation by generation in resumable cells, confirmed on unseen data, saved as a longrope
config that plain transformers computes."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from helpers import ORIGINAL, only_names_a_fresh_folder_is_checked_for, tiny_config, tiny_model
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.config import PosEncConfig
from hf_posenc.encodings import rope as R
from hf_posenc.tuning import factors as F
from hf_posenc.tuning.evolution import EvolutionSettings
from hf_posenc.tuning.needles import needle_prompt
from hf_posenc.tuning.search import TuneSettings

T = 2 * ORIGINAL


def _ok(f, free_from, cap):
    return (all(x == 1.0 for x in f[:free_from]) and all(1.0 <= x <= cap for x in f)
            and all(a <= b for a, b in zip(f, f[1:])))


def test_mutation_and_crossover_keep_longropes_constraints():
    rng = random.Random(0)
    own = R.default_inv_freq(10000.0, 64).double()
    free = F.critical_pair(own, 4096)
    assert 0 < free < 32 and 2 * math.pi / own[free - 1] <= 4096 < 2 * math.pi / own[free]
    seeds = [F.Candidate(F.constrained(F.seed_factors(m, own, 4096, 2.0)[0], free, 4.0), None, m)
             for m in F.SEED_METHODS]
    pop = list(seeds)
    for _ in range(200):
        a, b = rng.sample(pop, 2)
        child = (F.crossover(rng, a, b, free, 4.0) if rng.random() < 0.5
                 else F.mutate(rng, a, free, 4.0, 0.3, 0.2, attention=True))
        assert _ok(child.factors, free, 4.0)
        assert child.attention is None or 1.0 <= child.attention <= 1.5
        pop.append(child)
    assert len({c.label for c in pop}) > 150  # it explores: most children are new points
    moved = F.mutate(random.Random(1), seeds[0], free, 4.0, 1e-9, 0.2, attention=False)
    assert moved.factors != seeds[0].factors  # at least one pair moves, whatever the rate


def test_seed_factors_are_the_static_scalings_own():
    own = R.default_inv_freq(10000.0, 64).double()
    pi, _ = F.seed_factors("pi", own, 4096, 2.0)
    assert pi == pytest.approx([2.0] * 32)
    yarn, attention = F.seed_factors("yarn", own, 4096, 2.0)
    geom = R.RopeGeometry(10000.0, 64, 4096)
    want, mscale = R.rope_yarn(geom, 2.0, {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True})
    assert yarn == pytest.approx((own / want.double()).tolist(), rel=1e-6) and attention == pytest.approx(mscale)
    ntk, _ = F.seed_factors("ntk", own, 4096, 2.0)
    assert ntk[0] == pytest.approx(1.0) and ntk[-1] == pytest.approx(2.0, rel=1e-6)
    # a label names the numbers: the same factors, the same label; others, another
    c = F.Candidate(F.constrained(yarn, 0, 4.0), None, "yarn")
    assert c.label == F.Candidate(tuple(json.loads(json.dumps(c.factors))), None, "other").label
    assert c.label != F.Candidate(c.factors, 1.1, "yarn").label


def test_a_needle_prompt_has_its_length_and_scores_only_the_answers(bert_tokenizer):
    prose = torch.arange(1000, 1400)
    ids, answers = needle_prompt(bert_tokenizer, prose, 300, (0.1, 0.5, 0.9), seed=3)
    assert len(ids) == 300 and len(answers) >= 3
    text = bert_tokenizer.decode([ids[p] for p in answers]).replace(" ", "")
    assert text.isdigit() and len(text) == 3 * 7  # the three keys' digits, nothing else
    assert needle_prompt(bert_tokenizer, prose, 300, (0.1, 0.5, 0.9), seed=3) == (ids, answers)


def _tune(checkpoint, out, *extra):
    return ["tune", "--model", checkpoint, "--target-length", str(T), "--corpus", "python-docs", "--no-progress",
            "--methods", "longrope", "--search", "evolution", "--population", "4", "--generations", "3",
            "--finalists", "3", "--output", str(out), *extra]


def test_evolution_writes_a_longrope_best_that_transformers_loads_and_resumes(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "tune"
    assert main(_tune(tiny_checkpoint, out)) == 0
    report = json.loads((out / "tune.json").read_text())
    res = report["results"]
    assert res["search"] == "evolution" and len(res["generations"]) == 3
    best = PosEncConfig.from_json((out / "best.json").read_text())
    assert best.method == "longrope" and best == PosEncConfig.from_dict(res["configs"][res["best"]])
    long = best.params["long_factor"]
    half = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).model.rotary_emb.inv_freq.shape[0]
    assert len(long) == half and _ok(long, res["free_from"], 2 * T / ORIGINAL)
    assert best.params["short_factor"] == [1.0] * len(long)
    bests = [res["metrics"][g["best"]]["ppl_beyond"] for g in res["generations"]]
    assert bests == sorted(bests, reverse=True)  # parents survive: the best never gets worse
    assert all(not set(g["new"]) & set(h["candidates"]) for i, g in enumerate(res["generations"])
               for h in res["generations"][:i])  # a generation measures only candidates never measured before
    fin = res["finalists"]
    assert sorted(fin["ranking"]) == sorted(fin["proxy_ranking"]) and -1 <= fin["kendall_tau"] <= 1
    conf = res["confirmation"]
    assert res["best"] in conf["metrics"] and res["reference"]["label"] in conf["metrics"]
    assert conf["long_everywhere"]["short_cost"] is not None
    md = (out / "tune.md").read_text()
    assert "Best per generation" in md and "Kendall" in md and "reference: YaRN" in md
    for png in ("tune_generations.png", "tune_factors.png", "tune_loss_by_position.png"):
        assert (out / png).stat().st_size > 0
    only_names_a_fresh_folder_is_checked_for(out)

    # the same command computes nothing new and picks the same best
    cells = (out / "cells.jsonl").read_text()
    capsys.readouterr()
    assert main(_tune(tiny_checkpoint, out)) == 0
    assert "resumed" in capsys.readouterr().err and (out / "cells.jsonl").read_text() == cells
    again = json.loads((out / "tune.json").read_text())["results"]
    assert again["best"] == res["best"] and again["generations"] == res["generations"]

    # patched from best.json, the saved folder is a plain longrope checkpoint with the same logits
    saved = tmp_path / "patched"
    assert main(["patch", "--model", tiny_checkpoint, "--config", str(out / "best.json"), "--output", str(saved)]) == 0
    config = json.loads((saved / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "longrope"
    assert config["rope_parameters"]["long_factor"] == pytest.approx(long)
    ids = torch.randint(0, 1000, (1, T))
    plain = AutoModelForCausalLM.from_pretrained(saved).eval()
    ours = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval(), best)
    with torch.no_grad():
        diff = (plain(ids).logits.float() - ours(ids).logits.float()).abs().max().item()
    assert diff <= 1e-5

    # the same folder given to a grid search (--overwrite): the evolution's own plots go with its report
    grid = ["tune", "--model", tiny_checkpoint, "--target-length", str(T), "--corpus", "python-docs", "--no-progress",
            "--methods", "yarn", "--output", str(out), "--overwrite"]
    assert main(grid) == 0 and json.loads((out / "tune.json").read_text())["results"].get("search") != "evolution"
    assert not (out / "tune_generations.png").exists() and not (out / "tune_factors.png").exists()
    assert (out / "tune_loss_by_position.png").exists()


def test_the_short_cost_of_a_candidate_is_shared_by_its_attention_factor(tiny_checkpoint, tmp_path):
    """Inputs of the original length take the short factors: two candidates with one attention factor compute the
    same short windows, so the search computes them once (and they equal the candidate's own)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
    half = model.model.rotary_emb.inv_freq.shape[0]
    ids = torch.randint(0, 1000, (1, ORIGINAL))
    outs = []
    for long in ([1.0] * half, [1.5] * half, [float(1 + i / half) for i in range(half)]):
        cfg = PosEncConfig("longrope", T / ORIGINAL, params={"short_factor": [1.0] * half, "long_factor": long})
        with torch.no_grad():
            outs.append(hf_posenc.patch(model, cfg)(ids).logits)
        hf_posenc.unpatch(model)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_evolution_flags_without_the_evolution_are_refused(tiny_checkpoint, tmp_path, capsys):
    args = ["tune", "--model", tiny_checkpoint, "--target-length", str(T), "--corpus", "python-docs",
            "--population", "6", "--output", str(tmp_path / "out")]
    assert main(args) == 2
    assert "--population belong(s) to --search evolution" in capsys.readouterr().err
    at_defaults = ["--population", "8", "--generations", "4", "--hold", "critical", "--search-attention-factor"]
    assert main(args[:-4] + at_defaults + args[-2:]) == 2  # given at their defaults: still not silently ignored
    assert ("--population, --generations, --hold, --search-attention-factor belong(s) to --search evolution"
            in capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, message", [
    (["--target-length", str(ORIGINAL)], "nothing to extend"),
    (["--population", "1"], "--population is a whole number >= 2"),
    (["--methods", "yarn"], "no per-dimension factors"),
    (["--rank-by", "passkey"], "ranks by a perplexity"),
    (["--method-param", "yarn:beta_fast=16"], "yarn:beta_fast cannot be fixed"),
])
def test_bad_evolution_input_is_refused_clearly(extra, message, tiny_checkpoint, tmp_path, capsys):
    args = _tune(tiny_checkpoint, tmp_path / "out")
    if extra[0] == "--methods":
        args[args.index("--methods") + 1] = extra[1]
    elif extra[0] == "--target-length":
        args[args.index("--target-length") + 1] = extra[1]
    elif extra[0] == "--population":
        args[args.index("--population") + 1] = extra[1]
    else:
        args += extra
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out" / "cells.jsonl").exists()


def test_a_model_without_rope_is_refused_before_any_cell(tmp_path, bert_tokenizer, capsys):
    folder = tmp_path / "gpt2"
    tiny_model("gpt2", vocab_size=bert_tokenizer.vocab_size).save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    assert main(_tune(str(folder), tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert "has no rotary embedding" in err and not (tmp_path / "out" / "cells.jsonl").exists()


def test_settings_are_checked_when_made():
    with pytest.raises(ValueError, match="drop --space"):
        TuneSettings(T, space="x.json", search="evolution")
    with pytest.raises(ValueError, match="--search must be one of grid, evolution"):
        TuneSettings(T, search="random")
    with pytest.raises(ValueError, match="for --search evolution"):
        TuneSettings(T, evolution=EvolutionSettings())
    assert TuneSettings(T).rank_by == "passkey" and TuneSettings(T, search="evolution").rank_by == "ppl"


def test_on_a_scaled_checkpoint_the_factors_extend_its_own_and_needles_rank(bert_tokenizer, capsys):
    """Llama 3.1-style llama3 x4 (pretrained 16, context 64): the search starts from the checkpoint's own frequencies
    (its own factors among the seeds), ranks by the needles' answer tokens, and its winner patches as a composed
    longrope that keeps inputs up to 64 tokens as the checkpoint computed them."""
    config = tiny_config("llama", vocab_size=bert_tokenizer.vocab_size)
    theta = config.rope_parameters["rope_theta"]
    config.rope_parameters = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 16, "rope_theta": theta}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    own = model.model.rotary_emb.inv_freq.clone()
    report = hf_posenc.tune(model, bert_tokenizer, target_length=T, search="evolution", population=4, generations=2,
                            finalists=2, rank_by="needle_ppl", depths=(0.25, 0.75), corpus="python-docs",
                            progress=False)
    res = report["results"]
    assert "the checkpoint's own" in {c["origin"] for c in res["candidates"].values()}
    own_seed = next(c for c in res["candidates"].values() if c["origin"] == "the checkpoint's own")
    assert own_seed["attention"] == 1.0 and set(own_seed["factors"]) == {1.0}
    assert res["free_from"] == F.critical_pair(own.double(), ORIGINAL)
    assert all(m["needle_ppl"] is not None for m in res["metrics"].values())
    assert "already scaled" in capsys.readouterr().err
    winner = PosEncConfig.from_dict(res["configs"][res["best"]])
    ids = torch.randint(0, 1000, (1, ORIGINAL))
    with torch.no_grad():
        before = model(ids).logits
        hf_posenc.patch(model, winner.replace(params={**winner.params, "attention_factor": 1.0}))
        assert torch.allclose(model(ids).logits, before, atol=1e-5)  # inputs up to its context: its own frequencies
        assert model.config.max_position_embeddings == T
        # what an engine taking the long factors for every input computes: on a short input, the winner's logits at
        # the first positions of a long one (causal attention: they see only those tokens, at the long factors)
        hf_posenc.unpatch(model)
        hf_posenc.patch(model, winner)
        long_ids = torch.randint(0, 1000, (1, T))
        at_start = model(long_ids).logits[:, :ORIGINAL]
        hf_posenc.unpatch(model)
        everywhere = res["confirmation"]["long_everywhere"]
        hf_posenc.patch(model, PosEncConfig.from_dict(everywhere["config"]))
        assert torch.allclose(model(long_ids[:, :ORIGINAL]).logits, at_start, atol=1e-5)
        assert everywhere["short_cost"] == pytest.approx(everywhere["ppl_short"] / res["confirmation"]["baseline"][
            "ppl_short"] - 1)


def test_two_processes_share_a_generation_and_find_the_single_process_best(tiny_checkpoint, tmp_path):
    """Under torchrun the candidates of a generation are shared out (each cell computed by one process), and the
    processes, reading the same gathered numbers, draw the same next generation: the single-process search."""
    import os
    import socket
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(_tune(tiny_checkpoint, one)) == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          port, "-m", "hf_posenc", *_tune(tiny_checkpoint, two)], capture_output=True, text=True,
                         env=env, timeout=600, cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    single, double = (json.loads((d / "tune.json").read_text())["results"] for d in (one, two))
    assert double["best"] == single["best"] and double["generations"] == single["generations"]
    assert double["finalists"]["ranking"] == single["finalists"]["ranking"]
    cells = [json.loads(x) for x in (two / "cells.jsonl").read_text().splitlines()[1:]]
    keys = [json.dumps([c["variant"], c["key"]]) for c in cells]
    assert len(keys) == len(set(keys))
