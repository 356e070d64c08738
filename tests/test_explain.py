"""hf-posenc explain: the arrays behind each picture against written-out formulas, the pictures
and text written, and bad input refused. The geometry is given (head_dim 64, rope_theta 10,000, L 512) so no
model is read, except for the BERT table, which is the local all-MiniLM-L6-v2's."""

from __future__ import annotations

import cmath
import json
import math

import pytest
import torch
from helpers import refused

from hf_posenc import explain
from hf_posenc.config import PosEncConfig
from hf_posenc.encodings.rope import RopeGeometry
from hf_posenc.explaining import arrays as A

D, THETA, L = 64, 10000.0, 512
GEOM = RopeGeometry(THETA, D, L)


def plain_wavelengths(base: float = THETA) -> torch.Tensor:
    return torch.tensor([2 * math.pi * base ** (2 * k / D) for k in range(D // 2)], dtype=torch.float64)


def test_pi_stretches_every_wavelength_by_the_factor_and_ntk_is_a_new_base():
    pi = A.rope_wavelengths(PosEncConfig("pi", 4.0), GEOM, 4 * L)
    assert torch.allclose(pi["wavelength_before"], plain_wavelengths(), rtol=1e-6)
    assert torch.allclose(pi["wavelength_after"], 4 * plain_wavelengths(), rtol=1e-6)
    assert set(pi["classes"]) == {A.INTERPOLATED} and pi["attention"] == 1.0
    ntk = A.rope_wavelengths(PosEncConfig("ntk", 4.0), GEOM, 4 * L)
    assert torch.allclose(ntk["wavelength_after"], plain_wavelengths(THETA * 4 ** (D / (D - 2))), rtol=1e-5)
    assert ntk["classes"][0] == A.UNCHANGED and ntk["classes"][-1] == A.INTERPOLATED  # k=0 and k=d/2-1 exactly
    assert set(ntk["classes"][1:-1]) == {A.BLENDED}


def test_yarn_keeps_fast_dimensions_interpolates_slow_ones_and_warms_the_attention():
    """YaRN (Peng et al. 2023): a dimension rotating more than beta_fast = 32 times within L is kept, one rotating
    less than beta_slow = 1 time is interpolated by s; temperature 0.1 ln s + 1."""
    s = 4.0
    w = A.rope_wavelengths(PosEncConfig("yarn", s), GEOM, int(s * L))
    rotations = L / plain_wavelengths()
    for k, r in enumerate(rotations.tolist()):
        if r > 2 * 32:  # clear of the floor/ceil of the ramp's ends
            assert w["classes"][k] == A.UNCHANGED, k
        elif r < 0.5:
            assert w["classes"][k] == A.INTERPOLATED, k
    assert A.BLENDED in w["classes"] and w["attention"] == pytest.approx(0.1 * math.log(s) + 1)
    assert w["rotating_before"] == int((plain_wavelengths() <= L).sum())


def test_dynamic_ntk_at_the_length_asked_is_ntk_with_its_alpha():
    """Dynamic NTK at length n > L: alpha = s n / L - (s - 1), base * alpha^(d/(d-2)) (emozilla 2023)."""
    n, s = 3 * L, 2.0
    w = A.rope_wavelengths(PosEncConfig("dynamic_ntk", s), GEOM, n)
    alpha = s * n / L - (s - 1)
    assert torch.allclose(w["wavelength_after"], plain_wavelengths(THETA * alpha ** (D / (D - 2))), rtol=1e-5)
    assert A.FURTHER in w["classes"]  # alpha = 5 > s: the slowest dimensions stretched past the factor


def test_the_decay_bound_is_rofomers_relative_upper_bound():
    """Su et al. 2021, section 3.4.3: (1/(d/2)) sum_{j=1}^{d/2} |sum_{k<j} e^{i m theta_k}|, written out."""
    theta = [THETA ** (-2 * k / D) for k in range(D // 2)]
    ms = torch.tensor([0.0, 1.0, 7.0, 100.0, 4000.0])
    got = A.decay_bound(torch.tensor(theta, dtype=torch.float64), ms)
    for m, value in zip(ms.tolist(), got.tolist()):
        partial, total = 0j, 0.0
        for t in theta:
            partial += cmath.exp(1j * m * t)
            total += abs(partial)
        assert value == pytest.approx(total / (D // 2), rel=1e-9)
    assert got[0] == pytest.approx((D // 2 + 1) / 2)  # m = 0: the mean of 1 .. d/2


def _row(method: str, i: int, **knobs):
    from hf_posenc.methods.remapped import REMAPPED

    params = REMAPPED[method].defaults(dict(PosEncConfig(method, None, None, knobs).params), L)
    return A.remapped_row(REMAPPED[method].scheme(params, L), i, 4 * L), params


def test_self_extend_rows_follow_the_papers_formula():
    """Jin et al. 2024: r = d for d < W, else floor(i/G) + W - W/G - floor(j/G)."""
    i = 3 * L + 17
    row, p = _row("self_extend", i, group_size=4, window=64)
    G, W = p["group_size"], p["window"]
    want = [i - j if i - j < W else i // G + W - W // G - j // G for j in range(i + 1)]
    assert row.tolist() == [float(x) for x in want]


def test_dca_and_rerope_rows_follow_their_formulas():
    """DCA (An et al. 2024): c = s - w; own chunk (i mod c) - (j mod c); previous chunk c + min(i mod c, w) -
    (j mod c); older chunks s - (j mod c). ReRoPE (Su 2023): min(d, w)."""
    i = 3 * L + 5
    row, p = _row("dca", i)
    s, w = p["chunk_size"], p["local_window"]
    c = s - w
    n = i // c

    def want(j):
        if j // c == n:
            return i % c - j % c
        if j // c == n - 1:
            return c + min(i % c, w) - j % c
        return s - j % c

    assert row.tolist() == [float(want(j)) for j in range(i + 1)]
    row, p = _row("rerope", i)
    assert row.tolist() == [float(min(i - j, p["window"])) for j in range(i + 1)]


def test_the_relative_position_map_and_its_largest_position():
    m = A.remapped_map(PosEncConfig("rerope"), L, 4 * L, resolution=32)
    window = m["params"]["window"]
    assert m["largest"] == window and m["map"].shape == (32, 32)
    assert math.isnan(m["map"][0, 1]) and m["map"][-1, 0] == window  # future keys NaN; the far key at the window
    none_past = A.remapped_map(PosEncConfig("string"), L, 4 * L, resolution=16)
    assert none_past["largest"] < 4 * L - 1  # STRING shifts the far positions down


def test_t5_buckets_come_from_the_patched_module():
    """bucket_scale: the bucket of trunc(r / s); max_distance: T5's buckets with max_distance x s."""
    from hf_posenc.encodings.t5_buckets import relative_position_bucket

    d = torch.arange(2000)
    scaled = A.t5_buckets(PosEncConfig("bucket_scale", 2.0), 2000)
    assert scaled["after"].tolist() == scaled["before"][d // 2].tolist()
    stretched = A.t5_buckets(PosEncConfig("max_distance", 2.0), 2000)
    assert stretched["max_distance_after"] == 256
    assert stretched["after"].tolist() == relative_position_bucket(-d, True, 32, 256).tolist()
    assert stretched["last_shared_after"] > stretched["last_shared_before"]
    assert A.t5_buckets(PosEncConfig("bucket_scale", 2.0), 3)["last_shared_after"] is None  # 3 tokens: not reached


def test_alibi_slopes_are_the_papers_geometric_sequence():
    """Press et al. 2022: for 8 heads, 1/2, 1/4, ..., 1/256; the bias -slope x distance."""
    a = A.alibi(8, 1000)
    assert a["slopes"].tolist() == [2.0 ** -(k + 1) for k in range(8)]
    assert a["bias"][2, -1].item() == pytest.approx(-a["slopes"][2].item() * a["distance"][-1].item())


def test_a_bert_table_extended_by_interpolation_keeps_its_ends(tmp_path):
    from transformers import AutoModel

    from hf_posenc.checkpoints.models import resolve_source

    model = AutoModel.from_pretrained(resolve_source("all-minilm-l6-v2").path).eval()
    t = A.absolute_tables(model, PosEncConfig("interpolate", 2.0))
    assert t["after"].shape[0] == 2 * t["before"].shape[0]
    assert torch.allclose(t["after"][0], t["before"][0]) and torch.allclose(t["after"][-1], t["before"][-1])
    assert torch.allclose(t["similarity_after"].diagonal(), torch.ones(t["after"].shape[0], dtype=torch.float64))
    assert A.position_table(model).shape[0] == t["before"].shape[0]  # unpatched again


@pytest.mark.parametrize("method,pictures", [("yarn:factor=4", ["wavelengths.png", "decay.png"]),
                                             ("dca", ["positions.png"]), ("alibi", ["alibi.png"]),
                                             ("max_distance:factor=2", ["buckets.png"])])
def test_the_cli_writes_the_pictures_the_text_and_the_numbers(method, pictures, tmp_path, capsys):
    from hf_posenc.cli import main

    out = tmp_path / "explain"
    assert main(["explain", method, "--head-dim", str(D), "--rope-theta", str(THETA), "--original-max-position",
                 str(L), "--resolution", "32", "--output", str(out)]) == 0
    for name in pictures:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    data = json.loads((out / "explain.json").read_text())
    assert data["method"] == method.split(":")[0] and data["geometry"]["original"] == L
    md = (out / "explain.md").read_text()
    assert all(f"]({name})" in md for name in pictures) and data["text"] in md
    assert data["text"] in capsys.readouterr().out


def test_bad_input_is_refused_by_name(tmp_path, capsys):
    common = ["--head-dim", "64", "--rope-theta", "10000", "--original-max-position", "512"]
    assert "explain draws no picture of 'nope' yet" in refused(["explain", "nope", *common, "--output",
                                                                  str(tmp_path / "a")], capsys)
    assert "--head-dim must be even" in refused(["explain", "pi", "--factor", "2", "--head-dim", "63", "--rope-theta",
                                                 "10000", "--original-max-position", "512", "--output",
                                                 str(tmp_path / "b")], capsys)
    (tmp_path / "file").write_text("x")
    assert "is an existing file; give a folder" in refused(["explain", "pi", "--factor", "2", *common, "--output",
                                                            str(tmp_path / "file")], capsys)
    assert "--output '/dev/null' is an existing file; give a folder" in refused(
        ["explain", "pi", "--factor", "2", *common, "--output", "/dev/null"], capsys)
    assert "holds its knobs already" in refused(["explain", "yarn:factor=2", "--factor", "2", *common, "--output",
                                                 str(tmp_path / "c")], capsys)
    assert "give --model" in refused(["explain", "interpolate", "--factor", "2", *common, "--output",
                                      str(tmp_path / "d")], capsys)
    assert "unknown method 'yarnn'" in refused(["explain", "yarnn", *common, "--output", str(tmp_path / "e")], capsys)


def test_limits_a_patched_checkpoints_trained_context_and_someone_elses_folder(tmp_path, capsys):
    from helpers import ORIGINAL, tiny_config
    from transformers import AutoModelForCausalLM

    import hf_posenc

    common = ["--head-dim", "64", "--rope-theta", "10000", "--original-max-position", "512"]
    assert "--length must be a whole number of tokens from 2 to 2,097,152" in refused(
        ["explain", "yarn:factor=2", *common, "--length", "10000000", "--output", str(tmp_path / "a")], capsys)
    assert "past the 2,097,152 tokens explain draws: give --length" in refused(
        ["explain", "pi", "--factor", "1024", "--head-dim", "64", "--rope-theta", "10000", "--original-max-position",
         "4096", "--output", str(tmp_path / "b")], capsys)
    assert "--resolution must be a whole number from 8 to 2048" in refused(
        ["explain", "dca", *common, "--resolution", "100000", "--output", str(tmp_path / "c")], capsys)
    assert "--rope-theta must be > 1" in refused(["explain", "pi", "--factor", "2", "--head-dim", "64", "--rope-theta",
                                                  "1", "--original-max-position", "512", "--output",
                                                  str(tmp_path / "d")], capsys)
    assert not any((tmp_path / x).exists() for x in "abcd")  # refused before any folder is made
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "model.safetensors").write_text("not ours")
    err = refused(["explain", "pi", "--factor", "2", *common, "--output", str(theirs)], capsys)
    assert "already holds files that hf-posenc explain did not write" in err
    model = AutoModelForCausalLM.from_config(tiny_config("llama"))
    hf_posenc.patch(model, "yarn", factor=2.0)
    model.save_pretrained(tmp_path / "patched")
    out = explain("yarn:factor=2", str(tmp_path / "e"), model=str(tmp_path / "patched"))
    # the saved yarn x2 is what that checkpoint is: yarn x2 on top extends it from its 2L, as the patch does
    on_top = hf_posenc.patch(hf_posenc.from_pretrained(str(tmp_path / "patched")), "yarn", factor=2.0)
    assert out["geometry"]["original"] == 2 * ORIGINAL and out["length"] == 4 * ORIGINAL
    assert out["data"]["composed"] == hf_posenc.get_config(on_top).to_dict()
    explain("dca", str(tmp_path / "e"), head_dim=64, rope_theta=10000.0, original=512)  # replaces the earlier one
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == [".hf_posenc-output.json", "explain.json",
                                                                    "explain.md", "positions.png"]
    short = explain("yarn:factor=2", str(tmp_path / "f"), head_dim=64, rope_theta=10000.0, original=512, length=100)
    assert "nan" not in short["text"]


@pytest.mark.parametrize("build", ["llama31", "gemma3"])
def test_on_an_already_scaled_checkpoint_explain_draws_what_the_patch_computes(build, tmp_path, capsys):
    """Before = the checkpoint's own RoPE (llama3 x8; Gemma 3's linear x8 global layers), after = the composition
    the patch applies (its long frequencies), over the context the checkpoint advertises."""
    import test_compose as C

    import hf_posenc

    model = getattr(C, build)()
    model.save_pretrained(tmp_path / "ckpt")
    rotary = model.model.rotary_emb
    own = getattr(rotary, "full_attention_inv_freq", None) if build == "gemma3" else rotary.inv_freq
    own = own.double().clone()
    out = explain("yarn:factor=2", str(tmp_path / "e"), model=str(tmp_path / "ckpt"))
    hf_posenc.patch(model, "yarn", factor=2.0)
    composed = hf_posenc.get_config(model)
    assert out["data"]["composed"] == composed.to_dict() and out["data"]["context"] == C.CONTEXT
    assert out["length"] == 2 * C.CONTEXT and out["geometry"]["original"] == C.CONTEXT
    assert torch.allclose(torch.tensor(out["data"]["wavelength_before"], dtype=torch.float64), 2 * math.pi / own,
                          rtol=1e-6)
    dim, theta = (C.GEMMA_DIM, C.GLOBAL_THETA) if build == "gemma3" else (C.DIM, C.THETA)
    base = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    long = base / torch.tensor(composed.params["long_factor"], dtype=torch.float64)
    assert torch.allclose(torch.tensor(out["data"]["wavelength_after"], dtype=torch.float64), 2 * math.pi / long,
                          rtol=1e-6)
    assert out["text"].startswith("The checkpoint's RoPE is already scaled") and "computed as longrope" in out["text"]
    assert "interpolated (x factor)" in out["data"]["classes"]  # the slow ones halved again, against its own
    assert "'dynamic_ntk' follows the sequence length" in refused(
        ["explain", "dynamic_ntk", "--model", str(tmp_path / "ckpt"), "--output", str(tmp_path / "x")], capsys)
    assert not (tmp_path / "x").exists()


def test_explain_replacing_a_checkpoints_scaling_checks_the_original_context_as_the_patch_does(tmp_path, capsys):
    """--original-max-position on a scaled checkpoint draws a replacement only from the context its scaling is
    computed from (the patch refuses any other), with the checkpoint's own RoPE as "before"."""
    import test_compose as C

    import hf_posenc

    model = C.llama31()
    model.save_pretrained(tmp_path / "ckpt")
    own = model.model.rotary_emb.inv_freq.double().clone()
    for wrong in (100, C.CONTEXT):
        assert (f"--original-max-position {wrong} conflicts with {tmp_path / 'ckpt'}, whose RoPE is already scaled "
                "(rope_type='llama3', computed from 64 tokens): give 64") in refused(
            ["explain", "yarn", "--factor", "16", "--model", str(tmp_path / "ckpt"), "--original-max-position",
             str(wrong), "--output", str(tmp_path / "x")], capsys)
        with pytest.raises(ValueError, match="conflicts with the checkpoint"):
            hf_posenc.patch(model, "yarn", factor=16.0, original_max_position_embeddings=wrong)
    with pytest.raises(ValueError, match="would advertise 256 tokens, fewer than the 512 it advertises now: give a "
                                         "factor of at least 8"):
        explain("yarn:factor=4", str(tmp_path / "x"), model=str(tmp_path / "ckpt"), original=C.PRETRAINED)
    with pytest.raises(ValueError, match="would advertise 256 tokens, fewer than the 512 it advertises now: give a "
                                         "factor of at least 8"):
        hf_posenc.patch(model, "yarn", factor=4.0, original_max_position_embeddings=C.PRETRAINED)
    assert not (tmp_path / "x").exists()
    out = explain("yarn:factor=16", str(tmp_path / "e"), model=str(tmp_path / "ckpt"), original=C.PRETRAINED)
    assert torch.allclose(torch.tensor(out["data"]["wavelength_before"], dtype=torch.float64), 2 * math.pi / own,
                          rtol=1e-6)
    hf_posenc.patch(model, "yarn", factor=16.0, original_max_position_embeddings=C.PRETRAINED)
    after = model.model.rotary_emb.inv_freq.double()
    assert torch.allclose(torch.tensor(out["data"]["wavelength_after"], dtype=torch.float64), 2 * math.pi / after,
                          rtol=1e-6)
    assert out["data"]["replaced"] and "replaces that scaling" in out["text"]
    # on a saved composition (a longrope switching at 512, over llama3 x8 from 64), factors stated per dimension may
    # switch at 512 too, as the patch takes them; a scaling from the plain frequencies only from 64
    from transformers import AutoModelForCausalLM

    composed = C.llama31()
    hf_posenc.patch(composed, "yarn", factor=2.0)
    composed.save_pretrained(tmp_path / "composed")
    lists = {"short_factor": [1.0] * (C.DIM // 2), "long_factor": [2.0] * (C.DIM // 2)}
    stated = {"method": "longrope", "factor": 2.0, "params": lists, "original_max_position_embeddings": C.CONTEXT}
    hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tmp_path / "composed"), stated)
    drawn = explain(stated, str(tmp_path / "l"), model=str(tmp_path / "composed"), original=C.CONTEXT)
    assert drawn["data"]["replaced"]
    with pytest.raises(ValueError, match="computed from 64 tokens"):
        explain("yarn:factor=4", str(tmp_path / "y"), model=str(tmp_path / "composed"), original=C.CONTEXT)


def test_on_a_longrope_checkpoint_explain_starts_from_its_long_frequencies(tmp_path):
    """Phi-3-style: a method on top acts on its long factors (past its switch), so they are the "before"."""
    import test_compose as C

    C.phi3().save_pretrained(tmp_path / "ckpt")
    out = explain("yarn:factor=2", str(tmp_path / "e"), model=str(tmp_path / "ckpt"))
    base = 1.0 / (C.THETA ** (torch.arange(0, C.DIM, 2, dtype=torch.float64) / C.DIM))
    own_long = base / torch.tensor(C.LONGROPE["long_factor"], dtype=torch.float64)
    assert torch.allclose(torch.tensor(out["data"]["wavelength_before"], dtype=torch.float64), 2 * math.pi / own_long,
                          rtol=1e-6)


def test_on_per_layer_type_rope_explain_draws_the_layer_types_asked(tmp_path):
    import test_compose as C

    C.gemma3().save_pretrained(tmp_path / "ckpt")
    out = explain('pi:factor=2,layer_types=["sliding_attention"]', str(tmp_path / "e"), model=str(tmp_path / "ckpt"))
    assert out["geometry"]["rope_theta"] == C.LOCAL_THETA  # the sliding layers' base, not the global layers'


def test_explain_never_deletes_a_file_it_did_not_write_and_an_interrupted_one_leaves_the_earlier_output(
        tmp_path, capsys, monkeypatch):
    from hf_posenc.explaining import pictures

    common = ["--head-dim", "64", "--rope-theta", "10000", "--original-max-position", "512"]
    theirs = tmp_path / "theirs"  # an explain.json of someone else's naming their files
    theirs.mkdir()
    (theirs / "explain.json").write_text('{"pictures": ["README.md", "results.json"]}')
    (theirs / "README.md").write_text("# mine")
    (theirs / "results.json").write_text("{}")
    assert "did not write" in refused(["explain", "yarn:factor=2", *common, "--output", str(theirs)], capsys)
    assert sorted(p.name for p in theirs.iterdir()) == ["README.md", "explain.json", "results.json"]
    out = tmp_path / "e"
    explain("yarn:factor=2", str(out), head_dim=64, rope_theta=10000.0, original=512)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / "notes.txt").write_text("mine")  # a file put beside an earlier explain's: it is not replaced
    assert "notes.txt" in refused(["explain", "pi:factor=2", *common, "--output", str(out)], capsys)
    (out / "notes.txt").unlink()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pictures, "remapped", killed)  # interrupted while drawing the new method
    with pytest.raises(KeyboardInterrupt):
        explain("dca", str(out), head_dim=64, rope_theta=10000.0, original=512)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier output, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".e.")] == []  # no staged folder left


def test_on_a_model_with_nope_and_sliding_layers_explain_and_the_card_name_the_layers_left_alone(tmp_path):
    """SmolLM3 (a NoPE layer every fourth) with a sliding window on two layers: an attention-level method computes
    the full-attention layers with RoPE only; explain and the card list the others by index, from the config."""
    from helpers import tiny_model

    import hf_posenc
    from hf_posenc.publishing.card import build_model_card

    model = tiny_model("smollm3", num_hidden_layers=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                       use_sliding_window=True, sliding_window=16, layer_types=["sliding_attention"] * 2
                       + ["full_attention"] * 6)
    assert model.config.no_rope_layers == [1, 1, 1, 0, 1, 1, 1, 0]  # transformers' own default: every fourth
    model.save_pretrained(tmp_path / "ckpt")
    note = ("it computes 4 of the 8 layers (the full-attention layers with RoPE); the model's own attention runs the "
            "others, as they are: 2 sliding-window layers (0, 1) and 2 NoPE (no RoPE) layers (3, 7)")
    out = explain("self_extend:group_size=4,window=16", str(tmp_path / "e"), model=str(tmp_path / "ckpt"))
    assert out["data"]["layers"] == note and out["text"].startswith(f"On {tmp_path / 'ckpt'}, {note}. ")
    assert note in (tmp_path / "e" / "explain.md").read_text()
    card = build_model_card(hf_posenc.patch(model, "self_extend", group_size=4, window=16)).text
    assert f"| layers | I{note[1:]} |" in card
    tiny_model("smollm3", num_hidden_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               no_rope_layers=[0, 0]).save_pretrained(tmp_path / "nope")
    refused = explain("self_extend:group_size=4,window=16", str(tmp_path / "n"), model=str(tmp_path / "nope"))
    assert "it would compute none of the 2 layers (2 NoPE (no RoPE) layers (0, 1)): hf_posenc.patch refuses it" in \
        refused["text"]
    plain = explain("self_extend:group_size=4,window=16", str(tmp_path / "p"), head_dim=16, rope_theta=1e4,
                    original=64)
    assert plain["data"]["layers"] is None and build_model_card(
        hf_posenc.patch(tiny_model("llama"), "self_extend", group_size=4, window=16)).text.count("| layers |") == 0


@pytest.mark.parametrize("family", ["exaone4", "cohere2"])
def test_explain_finds_global_nope_layers_no_config_field_declares(family, tmp_path):
    """EXAONE 4 and Cohere 2 with a sliding window rotate their sliding layers only (their modeling code skips RoPE
    on the full-attention ones; no config field says so): explain runs a narrow twin of the config and says what
    the patch does, refusing, instead of counting the full layers as computed. Without the window EXAONE 4 rotates
    every layer, and explain says the method computes the full one (Cohere 2's full layers never rotate). The
    caller's random state is kept."""
    from transformers import AutoConfig

    sizes = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                 eos_token_id=2, layer_types=["sliding_attention", "full_attention"],
                 rope_parameters={"rope_type": "default", "rope_theta": 50_000.0})
    AutoConfig.for_model(family, sliding_window=12, **sizes).save_pretrained(tmp_path / "hybrid")
    state = torch.get_rng_state()
    out = explain("self_extend:group_size=4,window=16", str(tmp_path / "e"), model=str(tmp_path / "hybrid"))
    assert torch.equal(torch.get_rng_state(), state)
    assert out["data"]["layers"] == ("it would compute none of the 2 layers (1 sliding-window layer (0) and 1 NoPE "
                                     "(no RoPE) layer (1)): hf_posenc.patch refuses it on this model, which has no "
                                     "full-attention layer with RoPE")
    AutoConfig.for_model(family, sliding_window=None, **sizes).save_pretrained(tmp_path / "full")
    out = explain("self_extend:group_size=4,window=16", str(tmp_path / "f"), model=str(tmp_path / "full"))
    assert out["data"]["layers"].startswith({"exaone4": "it computes 1 of the 2 layers", "cohere2": "it would compute "
                                             "none of the 2 layers"}[family])


@pytest.mark.parametrize("family", ["falcon", "biogpt", "kimi_linear", "blt"])
def test_explain_on_configs_whose_twin_cannot_be_narrowed_falls_back_to_the_config(family, tmp_path):
    """Falcon's head_dim is a read-only property, BioGPT and Kimi Linear's twins have no rotary module found, BLT's
    would keep 3 billion parameters of hash embeddings the narrowing does not reach: explain says what the config
    declares instead of failing or building a large model (the twin is counted on the meta device first)."""
    from transformers import AutoConfig

    from hf_posenc.adapters.narrow_twin import narrow_twin
    from hf_posenc.adapters.remapped_layers import declared_computed, layers_note, probed_computed

    config = AutoConfig.for_model(family)
    config = getattr(config, "text_config", None) or config
    assert probed_computed(config) == declared_computed(config)
    if family == "blt":
        assert narrow_twin(config) is None
    if family == "kimi_linear":  # its full (MLA) layers state no RoPE: what hf_posenc.patch refuses, said so
        assert layers_note(*probed_computed(config)) == (
            "it would compute none of the 27 layers (6 NoPE (no RoPE) layers (4, 8, 12, 16, 20, 24) and 21 "
            "position-free (linear-attention, convolution) layers (0, 1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, "
            "19, 21, 22, 23, 25, 26)): hf_posenc.patch refuses it on this model, which has no full-attention layer "
            "with RoPE")


def test_explain_on_a_multimodal_config_says_the_method_runs_on_text(tmp_path):
    """Gemma 3 as a vision-language model: the sliding layers left alone, and that a call with images is refused
    (patch computes causal attention over text positions only)."""
    from transformers import AutoConfig

    text = dict(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, sliding_window=8, max_position_embeddings=64,
                layer_types=["sliding_attention", "full_attention"], model_type="gemma3_text")
    vision = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    AutoConfig.for_model("gemma3", text_config=text, vision_config=vision).save_pretrained(tmp_path / "vlm")
    out = explain("dca", str(tmp_path / "e"), model=str(tmp_path / "vlm"))
    assert out["data"]["layers"] == ("it computes 1 of the 2 layers (the full-attention layers with RoPE); the model's "
                                     "own attention runs the others, as they are: 1 sliding-window layer (0); on text "
                                     "inputs: a call with images, videos or audio is refused before its language "
                                     "model runs")
