"""serve-config: the launch settings under which each engine computes a saved checkpoint or a
GGUF as hf_posenc does, or the reason it cannot. vLLM's and llama.cpp's settings are launched here (the tests
marked with their engine); SGLang's, Ollama's and TGI's are read from those engines' sources and labelled so."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import ORIGINAL, THETA, refused, tiny_config
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.encodings import rope as R
from hf_posenc.engines.launch import LAUNCHERS, sglang
from hf_posenc.engines.launch import llama_cpp as llama_cpp_launch
from hf_posenc.serving.launch_settings import describe, serve_config

METHODS = {"none": {}, "yarn": {"factor": 2.0}, "pi": {"factor": 2.0}, "ntk": {"factor": 2.0},
           "llama3": {"factor": 2.0}, "dynamic_ntk": {"factor": 2.0}, "dca": {},
           "dynamic_yarn": {"factor": 2.0}}  # (a RoPE scaling the config cannot state: native false)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny LLaMA saved once per method (original context ORIGINAL)."""
    root, out = tmp_path_factory.mktemp("serve-config"), {}
    for method, knobs in METHODS.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config("llama"))
        hf_posenc.patch(model, method, **knobs)
        out[method] = str(root / method)
        model.save_pretrained(out[method])
    return out


EXPECTED = {  # engine -> method -> what it computes (the method records' engines, and each engine's reader)
    "vllm": {"none": "same", "yarn": "same", "pi": "same", "ntk": "same", "llama3": "same",
             "dynamic_ntk": "within_original", "dca": "cannot", "dynamic_yarn": "cannot"},
    "llama.cpp": {"none": "same", "yarn": "same", "pi": "same", "ntk": "same", "llama3": "same",
                  "dynamic_ntk": "within_original", "dca": "cannot", "dynamic_yarn": "cannot"},
    "sglang": {"none": "not measured", "yarn": "not measured", "pi": "not measured", "ntk": "not measured",
               "llama3": "not measured", "dynamic_ntk": "cannot", "dca": "cannot", "dynamic_yarn": "cannot"},
    "ollama": {"none": "not measured", "yarn": "not measured", "pi": "not measured", "ntk": "not measured",
               "llama3": "not measured", "dynamic_ntk": "cannot", "dca": "cannot", "dynamic_yarn": "cannot"},
    # TGI reads rope_theta / rope_scaling as transformers 4 spelled them: the tiny models' base is not 10,000
    "tgi": {"none": "cannot", "yarn": "cannot", "pi": "cannot", "ntk": "cannot", "llama3": "cannot",
            "dynamic_ntk": "cannot", "dca": "cannot", "dynamic_yarn": "cannot"},
}


def test_a_scaling_saved_in_a_form_no_engine_reads_is_said_so_not_that_no_engine_implements_it(tiny):
    """dynamic_yarn is a RoPE scaling, saved with native: false (no rope_parameters rebuild it): each engine's reason
    says the checkpoint does not store it in a form engines read; dca's says no engine implements the method."""
    for launch in serve_config(tiny["dynamic_yarn"]):
        assert (f"{launch.engine} cannot compute this checkpoint (its `dynamic_yarn` is not stored as rope_parameters "
                "that rebuild its frequencies" in launch.reason), launch.reason
    assert all("does not implement `dca` (no engine implements it" in launch.reason
               for launch in serve_config(tiny["dca"]))


def test_every_engine_says_what_it_computes_for_every_method(tiny):
    assert set(EXPECTED) == set(LAUNCHERS)
    for method, folder in tiny.items():
        for launch in serve_config(folder):
            engine = next(e for e in LAUNCHERS if LAUNCHERS[e](describe(folder), None).engine == launch.engine)
            assert launch.computes == EXPECTED[engine][method], (engine, method, launch.reason)
            assert launch.reason and (launch.command is None) == (launch.computes == "cannot"), launch
            if launch.computes == "cannot":
                assert launch.max_length is None


def test_vllm_is_launched_for_the_context_the_checkpoint_advertises_and_no_further(tiny):
    (yarn,) = serve_config(tiny["yarn"], ["vllm"])
    assert yarn.command == ["vllm", "serve", describe(tiny["yarn"]).path, "--max-model-len", str(2 * ORIGINAL)]
    assert yarn.python["max_model_len"] == 2 * ORIGINAL and not yarn.env
    too_long, llama_cpp = serve_config(tiny["yarn"], ["vllm", "llama.cpp"], 2 * ORIGINAL + 1)
    assert too_long.computes == "cannot" and f"up to {2 * ORIGINAL:,} tokens" in too_long.reason
    assert llama_cpp.computes == "same"  # one engine's limit is its own answer, not the command's
    (none,) = serve_config(tiny["none"], ["vllm"], 2 * ORIGINAL)  # vLLM's rotary table ends at the advertised context
    assert none.computes == "cannot" and not none.env
    (dynamic,) = serve_config(tiny["dynamic_ntk"], ["vllm"])
    assert dynamic.max_length == ORIGINAL and "--freeze-at" in dynamic.reason


def test_llama_cpp_converts_a_folder_and_gives_the_flags_for_an_unpatched_gguf(tiny):
    (yarn,) = serve_config(tiny["yarn"], ["llama.cpp"])
    gguf = yarn.steps[0][yarn.steps[0].index("--outfile") + 1]
    assert yarn.steps[0][:2] == ["python", "convert_hf_to_gguf.py"] and yarn.command[:3] == ["llama-server", "-m", gguf]
    assert yarn.command[-2:] == ["--ctx-size", str(2 * ORIGINAL)]
    assert any(f"--rope-scaling yarn --rope-scale 2 --yarn-orig-ctx {ORIGINAL}" in n for n in yarn.notes)
    ntk = describe(tiny["ntk"]).llama_cpp
    cli, kw = llama_cpp_launch.flags(ntk)
    dim = tiny_config("llama").hidden_size // tiny_config("llama").num_attention_heads
    assert kw == {"rope_freq_base": pytest.approx(R.ntk_base(THETA, dim, 2.0))} and cli[0] == "--rope-freq-base"
    assert llama_cpp_launch.flags(describe(tiny["llama3"]).llama_cpp) is None  # a rope_freqs tensor: no flag says it
    assert llama_cpp_launch.flags(describe(tiny["none"]).llama_cpp) == ([], {})


def test_sglang_derives_its_context_as_its_reader_does_and_asks_for_the_override_only_past_it(tiny):
    assert sglang.derived_context(describe(tiny["yarn"])) == 2 * ORIGINAL  # original_max_position_embeddings: x1
    pi = describe(tiny["pi"])
    assert sglang.derived_context(pi) == 4 * ORIGINAL  # max_position_embeddings (2L) times the factor again
    (none,) = serve_config(tiny["none"], ["sglang"], 2 * ORIGINAL)
    assert none.env == {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    assert all("not launched here" in launch.checked for launch in serve_config(tiny["yarn"], ["sglang", "ollama",
                                                                                                 "tgi"]))


def test_the_cli_prints_text_and_json_and_refuses_bad_input(tiny, tmp_path, capsys):
    from hf_posenc.cli import main

    assert main(["serve-config", tiny["yarn"], "--engine", "vllm,llama.cpp"]) == 0
    out = capsys.readouterr().out
    assert "## vLLM: same" in out and "## llama.cpp: same" in out and f"--max-model-len {2 * ORIGINAL}" in out
    assert main(["serve-config", tiny["dca"], "--engine", "vllm", "--json"]) == 0
    (launch,) = json.loads(capsys.readouterr().out)
    assert (launch["computes"] == "cannot"
            and "vLLM does not implement `dca` (no engine implements it" in launch["reason"])
    assert "expected comma-separated names among vllm" in refused(["serve-config", tiny["yarn"], "--engine",
                                                                     "vllm,vllm"], capsys)
    assert "expected an integer >= 1, got '0'" in refused(["serve-config", tiny["yarn"], "--max-length", "0"], capsys)
    assert "no checkpoint at" in refused(["serve-config", str(tmp_path / "nowhere")], capsys)


# ---- launched: the settings printed for vLLM and llama.cpp, given to the engine, compute what hf_posenc does --------

from test_llama_cpp import needs_llama_cpp  # noqa: E402
from test_vllm import needs_vllm, save_tiny, vllm_python  # noqa: E402


def _tokens(tokenizer, n: int) -> torch.Tensor:
    from hf_posenc.io.documents import builtin_corpus, corpus_stream

    return torch.tensor([corpus_stream(tokenizer, builtin_corpus(), max_tokens=n)[:n]])


@needs_llama_cpp
def test_llama_cpp_launched_with_the_printed_settings_computes_the_patched_gguf_and_the_flags_do_the_same(tmp_path):
    import os

    from hf_posenc.checkpoints.models import resolve_source
    from hf_posenc.checkpoints.runtime import load_tokenizer
    from hf_posenc.engines.llama_cpp_engine import LlamaCppLM
    from hf_posenc.eval.scoring import token_nll
    from hf_posenc.serving.gguf_file import patch_gguf

    src = resolve_source("smollm2-135m")
    source = os.path.join(src.path, src.kwargs["gguf_file"])
    patched = str(tmp_path / "yarn.gguf")
    patch_gguf(source, patched, {"method": "yarn", "factor": 2.0, "original_max_position_embeddings": 512})
    (launch,) = serve_config(patched, ["llama.cpp"], 1000)
    kw = dict(launch.python)
    path, n = kw.pop("model_path"), kw.pop("n_ctx")
    ids = _tokens(load_tokenizer(patched), 1000)
    with LlamaCppLM(path, n_ctx=n, **kw) as served:
        got = served.token_nll(ids)[0].double()
    ref = token_nll(hf_posenc.from_pretrained(patched).eval(), ids)[0].double()
    assert abs(got.mean() - ref.mean()) / ref.mean() < 5e-3  # the Q4_1 file: the quantization's tolerance
    cli, flag_kw = llama_cpp_launch.flags(describe(patched).llama_cpp)  # the same RoPE by flags, unpatched file
    assert cli == ["--rope-scaling", "yarn", "--rope-scale", "2", "--yarn-orig-ctx", "512"]
    with LlamaCppLM(source, n_ctx=n, **flag_kw) as flagged:
        by_flags = flagged.token_nll(ids)[0].double()
    assert (by_flags - got).abs().max() < 1e-4
    with LlamaCppLM(source, n_ctx=n) as unpatched:  # and without them it is another model
        assert (unpatched.token_nll(ids)[0].double() - got).abs().max() > 0.1


@needs_vllm
@pytest.mark.vllm
def test_vllm_launched_with_the_printed_settings_computes_the_checkpoint_as_hf_posenc(tmp_path, bert_tokenizer):
    from hf_posenc.engines.vllm_engine import EngineLM, VllmEngine
    from hf_posenc.serving.check import reference_nll

    L = 256
    folder = save_tiny(tmp_path / "yarn", bert_tokenizer, "yarn", context=L, factor=2.0)
    (launch,) = serve_config(folder, ["vllm"])
    assert launch.python == {"model": describe(folder).path, "max_model_len": 2 * L}
    ids = _tokens(bert_tokenizer, 2 * L - 1)[0].tolist()
    ref, _ = reference_nll(folder, ids, [100, 2 * L - 1], "float32", "cpu", 1024, False)
    with VllmEngine(launch.python["model"], python=vllm_python(),
                    max_model_len=launch.python["max_model_len"]) as served:
        assert served.max_model_len == 2 * L
        lm = EngineLM(served, None)
        for n in (100, 2 * L - 1):
            got = lm.token_nll(torch.tensor([ids[:n]]))[0].double()
            assert abs(got.mean() - ref[n].mean()) / ref[n].mean() < 1e-4, n


def test_the_model_card_prints_each_engines_settings():
    from hf_posenc.publishing.card import build_model_card

    model = AutoModelForCausalLM.from_config(tiny_config("llama"))
    hf_posenc.patch(model, "yarn", factor=2.0)
    card = build_model_card(model, repo_id="me/tiny-yarn").content
    part = card[card.index("### Launch settings"):card.index("## How it was made")]
    assert f"vllm serve me/tiny-yarn --max-model-len {2 * ORIGINAL}" in part and "**vLLM: same.**" in part
    assert "cat > Modelfile <<'EOF'" in part and f"PARAMETER num_ctx {2 * ORIGINAL}" in part
    hf_posenc.unpatch(model)
    hf_posenc.patch(model, "dca")
    part = build_model_card(model, repo_id="me/tiny-dca").content
    assert (part.count("does not implement `dca` (no engine implements it") == len(LAUNCHERS)
            and "vllm serve" not in part)


# ---- DCA for the engines that read it: Qwen's dual_chunk_attention_config, opt-in -----------------


def _tiny_saved(folder, family: str) -> str:
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config(family)).save_pretrained(folder)
    return str(folder)


def test_a_qwen2_dca_checkpoint_saved_with_the_dual_chunk_config_loads_back_the_same_and_sglang_is_told(tmp_path):
    from hf_posenc.cli import main

    src, out = _tiny_saved(tmp_path / "qwen2", "qwen2"), str(tmp_path / "dca")
    assert main(["patch", "--model", src, "--method", "dca", "--output", out, "--dual-chunk-config"]) == 0
    from hf_posenc.methods.remapped import REMAPPED

    saved = json.loads(open(f"{out}/config.json").read())
    params = saved["hf_posenc"]["params"]
    advertised = REMAPPED["dca"].context(params, ORIGINAL)
    assert saved["dual_chunk_attention_config"] == {"chunk_size": params["chunk_size"],
                                                    "local_size": params["local_window"],
                                                    "original_max_position_embeddings": advertised}
    assert saved["max_position_embeddings"] == ORIGINAL  # the plain fields: engines that do not read it still refuse
    ids = torch.randint(0, 96, (1, 3 * ORIGINAL))
    model = AutoModelForCausalLM.from_pretrained(src)
    hf_posenc.patch(model, "dca")
    with torch.no_grad():
        want = model(ids).logits
        got = hf_posenc.from_pretrained(out)(ids).logits
    assert (got - want).abs().max() < 1e-5
    assert not hasattr(model.config, "dual_chunk_attention_config")
    launches = {launch.engine: launch for launch in serve_config(out)}
    sg = launches["SGLang"]
    assert sg.computes == "not measured" and not sg.env
    assert sg.command[-4:] == ["--context-length", str(advertised), "--json-model-override-args",
                               json.dumps({"max_position_embeddings": advertised}, separators=(",", ":"))]
    assert launches["vLLM"].computes == "cannot" and "dual-chunk" in launches["vLLM"].reason
    assert launches["llama.cpp"].computes == "cannot" and "only SGLang reads" in launches["llama.cpp"].reason
    (too_long,) = serve_config(out, ["sglang"], advertised + 1)
    assert too_long.computes == "cannot" and f"up to {advertised:,} tokens" in too_long.reason
    card = open(f"{out}/README.md").read()
    assert "| SGLang | DCA's positions, from dual_chunk_attention_config" in card
    assert "**SGLang: not measured.**" in card and "--json-model-override-args" in card


def test_the_dual_chunk_config_is_refused_for_another_method_or_family_and_nothing_is_written(tmp_path, capsys):
    llama, out = _tiny_saved(tmp_path / "llama", "llama"), tmp_path / "out"
    err = refused(["patch", "--model", llama, "--method", "yarn", "--factor", "2", "--output", str(out),
                   "--dual-chunk-config"], capsys)
    assert "use it with --method dca" in err and not out.exists()
    err = refused(["patch", "--model", llama, "--method", "dca", "--output", str(out), "--dual-chunk-config"], capsys)
    assert "for qwen2, qwen2_moe, qwen3, qwen3_moe models only, and this model is 'llama'" in err and not out.exists()
    err = refused(["patch", "--model", llama, "--method", "dca", "--gguf", str(tmp_path / "x.gguf"),
                   "--dual-chunk-config"], capsys)
    assert "drop --dual-chunk-config" in err


def test_llama_cpp_is_not_measured_where_hf_posenc_does_not_know_how_it_reads_the_checkpoint(tmp_path):
    """hf_posenc writes out llama.cpp's reading of llama, qwen2 and qwen3 GGUFs only. YaRN x2 on a gemma3_text's
    full-attention layers (per-layer-type RoPE, which those GGUFs cannot hold): 'not measured' for llama.cpp and
    Ollama, naming what hf_posenc does not know, with the conversion and launch; serve-check's pre-check leaves it
    to the engine. Self-Extend on the same model stays 'cannot' (no GGUF of any architecture holds it), as does llama3
    on a qwen2 (whose llama.cpp graph reads no rope_freqs); a plain llama whose config.json lacks hidden_size is 'not
    measured' too."""
    from hf_posenc.serving.check import _engine_cannot, read_block

    torch.manual_seed(0)
    rope = {"full_attention": {"rope_type": "default", "rope_theta": THETA},
            "sliding_attention": {"rope_type": "default", "rope_theta": 7_000.0}}
    config = tiny_config("gemma3_text", head_dim=16, sliding_window=12, rope_parameters=rope,
                         layer_types=["sliding_attention", "full_attention"])
    folders = {}
    for method, knobs in {"yarn": {"factor": 2.0}, "self_extend": {}}.items():
        model = AutoModelForCausalLM.from_config(config)
        hf_posenc.patch(model, method, **knobs)
        folders[method] = str(tmp_path / method)
        model.save_pretrained(folders[method])
    llama, ollama = serve_config(folders["yarn"], ["llama.cpp", "ollama"])
    for launch in (llama, ollama):
        assert launch.computes == "not measured", launch.reason
        assert "does not know how llama.cpp's converter writes a gemma3_text checkpoint" in launch.reason
        assert "layer_types" in launch.reason and "serve-check --engine llama.cpp" in launch.reason
    assert llama.steps and llama.steps[0][:2] == ["python", "convert_hf_to_gguf.py"]
    assert llama.python["n_ctx"] == 2 * ORIGINAL and "Modelfile" in ollama.files
    plain, block = read_block(folders["yarn"])
    assert _engine_cannot(folders["yarn"], "llama.cpp", plain, block) is None
    (attention,) = serve_config(folders["self_extend"], ["llama.cpp"])
    assert attention.computes == "cannot" and "self_extend" in attention.reason
    model = AutoModelForCausalLM.from_config(tiny_config("qwen2"))
    hf_posenc.patch(model, "llama3", factor=2.0)
    model.save_pretrained(tmp_path / "qwen2-llama3")
    (known,) = serve_config(str(tmp_path / "qwen2-llama3"), ["llama.cpp"])
    assert known.computes == "cannot" and "rope_freqs" in known.reason and "not qwen2" in known.reason
    geometry = tmp_path / "no-geometry"
    geometry.mkdir()
    cfg = tiny_config("llama").to_dict()
    del cfg["hidden_size"]
    (geometry / "config.json").write_text(json.dumps(cfg))
    (unknown,) = serve_config(str(geometry), ["llama.cpp"])
    assert unknown.computes == "not measured" and "no hidden_size" in unknown.reason


@pytest.mark.parametrize("rope, mpe, table", [
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, 64, 256),  # Qwen-style: mpe left
    ({"rope_type": "yarn", "factor": 1.5, "original_max_position_embeddings": 63}, 95, 95),  # ceil(94.5) positions
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0}, 512, 512),
    ({"rope_type": "default"}, 64, None),
])
def test_vllms_rotary_table_is_counted_as_vllm_builds_it(rope, mpe, table):
    """vLLM's YaRN table holds factor x original positions (torch.arange of their product), not
    max_position_embeddings: a Qwen-style YaRN x4 left at its pretraining length serves 4x that on vLLM."""
    from hf_posenc.serving.support import vllm_positions

    config = tiny_config("llama", max_position_embeddings=mpe, rope_parameters={"rope_theta": THETA, **rope})
    assert vllm_positions(config) == table
    if rope["rope_type"] == "yarn":
        assert len(torch.arange(rope["original_max_position_embeddings"] * rope["factor"])) == table


def test_a_qwen_style_yarn_is_launched_for_the_context_its_yarn_serves_on_every_engine(tmp_path):
    """Qwen's long-context recipe: YaRN x4 over the pretraining length, max_position_embeddings left there. vLLM
    derives 4x from the scaling; llama.cpp's converter writes 1x as the GGUF's context_length, SGLang derives 1x:
    each launch reaches 4x, with the override each engine needs, never the 1x that would shrink the model."""
    rope = {"rope_type": "yarn", "rope_theta": THETA, "factor": 4.0, "original_max_position_embeddings": ORIGINAL}
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config("qwen2", rope_parameters=rope)).save_pretrained(tmp_path)
    served = describe(str(tmp_path))
    assert (served.context, served.stated_context, served.original) == (4 * ORIGINAL, ORIGINAL, 4 * ORIGINAL)
    launches = {launch.engine: launch for launch in serve_config(str(tmp_path))}
    assert launches["vLLM"].command[-2:] == ["--max-model-len", str(4 * ORIGINAL)]
    assert launches["llama.cpp"].python["kv_overrides"] == {"qwen2.context_length": 4 * ORIGINAL}
    assert launches["SGLang"].env == {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    assert launches["SGLang"].command[-1] == str(4 * ORIGINAL)
    ollama = launches["Ollama"]
    assert ["gguf-set-metadata", f"{tmp_path}-f32.gguf", "qwen2.context_length", str(4 * ORIGINAL), "--force"] \
        in ollama.steps and f"PARAMETER num_ctx {4 * ORIGINAL}" in ollama.files["Modelfile"]
    # within what config.json states, no override is asked for
    short = {launch.engine: launch for launch in serve_config(str(tmp_path), max_length=ORIGINAL)}
    assert "kv_overrides" not in short["llama.cpp"].python and not short["SGLang"].env
    assert not any(step[0] == "gguf-set-metadata" for step in short["Ollama"].steps)


def test_vllms_rotary_table_of_per_layer_type_rope_is_the_scaled_layer_types():
    """Gemma 3 with YaRN x4 on its global layers over 64: vLLM's global table holds 256 positions, whatever
    max_position_embeddings says; the sliding layers' plain table follows max_position_embeddings. An evaluation
    must neither go past 256 on vLLM nor raise max_position_embeddings as for plain RoPE (cover_positions)."""
    from transformers import AutoConfig

    from hf_posenc.serving.support import vllm_positions

    yarn = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 64}
    config = AutoConfig.for_model("gemma3_text", max_position_embeddings=512, rope_parameters={
        "full_attention": yarn, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    assert vllm_positions(config) == 256
    plain = AutoConfig.for_model("gemma3_text", max_position_embeddings=512, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    assert vllm_positions(plain) is None


def test_cover_positions_raises_the_context_of_plain_rope_only(tmp_path):
    from hf_posenc.engines.vllm_engine import cover_positions

    for name, rope, raised in [
        ("flat", {"rope_type": "default", "rope_theta": 1e4}, True),
        ("layered_plain", {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}},
         True),
        ("gemma4_proportional", {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25},
                                 "sliding_attention": {"rope_type": "default"}}, True),  # (no factor: unscaled)
        ("layered_yarn", {"full_attention": {"rope_type": "yarn", "factor": 4.0,
                                             "original_max_position_embeddings": 64},
                          "sliding_attention": {"rope_type": "default"}}, False)]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 64, "rope_parameters": rope}))
        cover_positions(str(folder), 1000)
        assert (json.loads((folder / "config.json").read_text())["max_position_embeddings"] == 1000) is raised, name


def test_an_unpatched_longrope_checkpoint_with_two_lists_is_refused_for_llama_cpp(tmp_path):
    """Phi-3's own longrope (no hf_posenc patch) switches per input; a GGUF computes one set for every input."""
    import test_compose as C

    C.phi3().save_pretrained(tmp_path)
    launches = {launch.engine: launch for launch in serve_config(str(tmp_path), ["llama.cpp", "ollama"])}
    for engine in ("llama.cpp", "Ollama"):
        assert launches[engine].computes == "cannot", launches[engine].reason
        assert "the checkpoint's own longrope switches from its short to its long factors" in launches[engine].reason
