"""Vision-language models with multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): each RoPE scaling patches the
language model keeping its mrope_section and equals transformers' own computation of the same rope_parameters,
on text and on image+text inputs (image tokens keep their 3-D positions); saved, reloaded, unpatched, cached.
The attention-level methods remap text positions: on text they equal the same method on the text decoder with the
same weights (Qwen2 / Qwen3, whose 1-D RoPE MRoPE is when its three rows of positions are equal); a call with an
image is refused before its vision encoder runs (generate with text alone runs). Family swaps, which would replace
the 3-D positions, are refused by name before any compute."""

import pytest
import torch
from helpers import ORIGINAL, THETA, cached_last_logits
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

import hf_posenc
from hf_posenc.adapters.rope_decoder import MROPE_FAMILIES, PROVEN_SCALINGS
from hf_posenc.methods.remapped import REMAPPED

SECTION = [4, 2, 2]  # of head_dim 16: 8 frequencies, split temporal / height / width
IMAGE, VIDEO, START, END = 90, 91, 92, 93
LENGTH_DEPENDENT = ("dynamic_ntk", "longrope")
VISION = {
    "qwen2_vl": dict(depth=1, embed_dim=32, hidden_size=64, mlp_ratio=1, num_heads=4),
    "qwen2_5_vl": dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=4, out_hidden_size=64),
    "qwen3_vl": dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=4, out_hidden_size=64,
                     deepstack_visual_indexes=[0], num_position_embeddings=16),
}


def vlm_config(model_type, rope=None, max_position_embeddings=ORIGINAL):
    text = dict(model_type=f"{model_type}_text", vocab_size=96, hidden_size=64, intermediate_size=96, head_dim=16,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
                max_position_embeddings=max_position_embeddings,
                rope_parameters={"rope_theta": THETA, "mrope_section": SECTION, **(rope or {"rope_type": "default"})})
    vision = dict(patch_size=14, spatial_merge_size=1, temporal_patch_size=2, **VISION[model_type])
    cfg = AutoConfig.for_model(model_type, text_config=text, vision_config=vision, image_token_id=IMAGE,
                               video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)
    cfg._attn_implementation = "eager"
    return cfg


def build(model_type, seed=0, **kwargs):
    torch.manual_seed(seed)
    return AutoModelForImageTextToText.from_config(vlm_config(model_type, **kwargs), dtype=torch.float32).eval()


def text_input(n=150):
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(3, 89, (1, n), generator=g)}


def image_input(n=150):
    """One 2x2-patch image (4 image tokens at 3-D grid positions) after 10 text tokens, as the processor lays it out."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 89, (1, n), generator=g)
    ids[0, 10], ids[0, 11:15], ids[0, 15] = START, IMAGE, END
    kinds = torch.zeros_like(ids)
    kinds[0, 11:15] = 1  # mm_token_type_ids: 1 = image
    return {"input_ids": ids, "pixel_values": torch.randn(4, 3 * 2 * 14 * 14, generator=g),
            "image_grid_thw": torch.tensor([[1, 2, 2]]), "mm_token_type_ids": kinds}


@torch.no_grad()
def out(model, inputs):
    return model(**inputs).logits


def rope_index(model, inputs):
    keys = ("input_ids", "image_grid_thw", "mm_token_type_ids")
    return model.model.get_rope_index(**{k: inputs[k] for k in keys})[0]


def native_twin(model):
    """A fresh model built by transformers from the patched config's rope_parameters, with the same weights (fresh
    for each input: transformers' own dynamic type keeps the frequencies of the longest call it has seen)."""
    text = model.config.text_config
    twin = AutoModelForImageTextToText.from_config(
        vlm_config(model.config.model_type, dict(text.rope_parameters), text.max_position_embeddings),
        dtype=torch.float32).eval()
    twin.load_state_dict(model.state_dict())
    return twin


@pytest.mark.parametrize("method", PROVEN_SCALINGS)
@pytest.mark.parametrize("model_type", MROPE_FAMILIES)
def test_scaling_equals_transformers_on_text_and_image_inputs(model_type, method):
    model = build(model_type)
    text, image = text_input(), image_input()
    before = {"text": out(model, text), "image": out(model, image)}
    positions = rope_index(model, image)
    assert not torch.equal(positions[1], positions[2])  # the image tokens have 3-D positions (height != width)
    knobs = {"cache": "stale"} if method in LENGTH_DEPENDENT else {}
    hf_posenc.patch(model, method, factor=2.0, **knobs)
    rp = model.config.text_config.rope_parameters
    assert rp["mrope_section"] == SECTION and model.config.hf_posenc["native"]
    assert model.model.language_model.rotary_emb.mrope_section == SECTION
    assert torch.equal(rope_index(model, image), positions)  # get_rope_index as it was
    for name, inputs in (("text", text), ("image", image)):
        got = out(model, inputs)
        assert (got - before[name]).abs().max().item() > 1e-4  # it changed the model
        assert (got - out(native_twin(model), inputs)).abs().max().item() <= 1e-5
    hf_posenc.unpatch(model)
    assert torch.equal(out(model, text), before["text"]) and torch.equal(out(model, image), before["image"])


@pytest.mark.parametrize("model_type", MROPE_FAMILIES)
def test_saved_reloaded_unpatched_and_cached(model_type, tmp_path):
    model = build(model_type)
    text, image = text_input(), image_input()
    before = out(model, text)
    hf_posenc.patch(model, "yarn", factor=2.0)
    x = text["input_ids"][:, :90]  # a prefill of 50, then one token at a time past the original 64 (before any image
    full = out(model, {"input_ids": x})[:, 49:-1]  # call: the model keeps an image call's rope_deltas for decoding)
    assert (cached_last_logits(model, x, 50) - full).abs().max().item() <= 1e-5
    got = {"text": out(model, text), "image": out(model, image)}
    model.save_pretrained(tmp_path)
    plain = AutoModelForImageTextToText.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager")
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32, attn_implementation="eager")
    assert hf_posenc.get_config(again) == hf_posenc.get_config(model)
    for loaded in (plain.eval(), again.eval()):
        assert loaded.config.text_config.rope_parameters["mrope_section"] == SECTION
        for name, inputs in (("text", text), ("image", image)):
            assert (out(loaded, inputs) - got[name]).abs().max().item() <= 1e-5
    hf_posenc.unpatch(model)
    assert torch.equal(out(model, text), before)
    assert model.config.text_config.max_position_embeddings == ORIGINAL


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen3_vl"])
def test_length_dependent_frequencies_per_row_of_3d_positions(model_type):
    model = build(model_type)
    hf_posenc.patch(model, "dynamic_ntk", factor=2.0, cache="stale")
    rotary = model.model.language_model.rotary_emb
    x = torch.zeros(2, 150, 16)
    rows = torch.stack([torch.arange(150), torch.arange(150) // 3]).view(1, 2, 150).expand(3, 2, 150).clone()
    rows[1, 0, 20:24] += torch.tensor([0, 0, 1, 1])  # row 0: an image's height positions
    cos, sin = rotary(x, rows)
    for r in range(2):  # each row as it is alone
        c, s = rotary(x[r : r + 1], rows[:, r : r + 1])
        assert torch.equal(cos[r : r + 1], c) and torch.equal(sin[r : r + 1], s)
    unhooked = type(rotary).forward(rotary, x, rows)[0]  # the frequencies set at patch time: the original context's
    assert torch.equal(cos[1], unhooked[1])  # row 1 (50 positions) is within it
    assert (cos[0] - unhooked[0]).abs().max().item() > 1e-4  # row 0 (150) gets the frequencies of its own length


TEXT_TWIN = {"qwen2_vl": "qwen2", "qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3"}  # the text decoder of the same layers
KNOBS = {"self_extend": {"group_size": 4, "window": 16}, "dca": {"chunk_size": 48, "local_window": 4},
         "rerope": {"window": 16}, "leaky_rerope": {"window": 16, "leak": 4.0},
         "string": {"shifted_offset": 20, "local_window": 4}}


def text_twin(model):
    """The text decoder (Qwen2 for Qwen2-VL and Qwen2.5-VL, Qwen3 for Qwen3-VL) holding the language model's weights,
    its RoPE the 1-D one of the same theta."""
    text, kind = model.config.text_config.to_dict(), TEXT_TWIN[model.config.model_type]
    shared = set(AutoConfig.for_model(kind).to_dict()) - {"model_type", "architectures", "dtype",
                                                           "transformers_version"}
    cfg = AutoConfig.for_model(kind, **{**{k: v for k, v in text.items() if k in shared},
                                        "rope_parameters": {"rope_type": "default", "rope_theta": THETA}})
    cfg._attn_implementation = "eager"
    twin = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    weights = {k.replace("model.language_model.", "model."): v for k, v in model.state_dict().items()
               if k.startswith(("model.language_model.", "lm_head."))}
    twin.load_state_dict(weights)
    return twin


@pytest.mark.parametrize("method", list(REMAPPED))
@pytest.mark.parametrize("model_type", MROPE_FAMILIES)
def test_attention_level_methods_on_text_equal_the_text_decoders(model_type, method):
    model, text = build(model_type), text_input()
    before = out(model, text)
    reference = out(hf_posenc.patch(text_twin(model), method, **KNOBS[method]), text)
    assert (out(text_twin(model), text) - before).abs().max().item() <= 1e-5  # the twin is the model on text
    hf_posenc.patch(model, method, **KNOBS[method])
    got = out(model, text)
    assert (got - reference).abs().max().item() <= 1e-5
    assert (got - before).abs().max().item() > 1e-4  # past the window the method changes them
    x = text["input_ids"][:, :90]  # a prefill of 50, then a token at a time: the cache equals recomputing
    assert (cached_last_logits(model, x, 50) - out(model, {"input_ids": x})[:, 49:-1]).abs().max().item() <= 1e-5
    hf_posenc.unpatch(model)
    assert torch.equal(out(model, text), before)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("model_type", MROPE_FAMILIES)
def test_generate_on_text_equals_the_text_decoders(model_type, cache):
    """generate passes an empty mm_encoder_outputs with text alone: not media. Greedy decoding past the window, on
    a left-padded batch, gives the text decoder's tokens and logits."""
    model = build(model_type)
    twin = hf_posenc.patch(text_twin(model), "dca", **KNOBS["dca"])
    hf_posenc.patch(model, "dca", **KNOBS["dca"])
    x = text_input(56)["input_ids"].repeat(2, 1)
    mask = torch.ones_like(x)
    x[1, :6], mask[1, :6] = 0, 0  # the second row left-padded
    runs = [m.generate(input_ids=x, attention_mask=mask, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                       cache_implementation=cache, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            for m in (model, twin)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert (torch.stack(runs[0].logits) - torch.stack(runs[1].logits)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("model_type", MROPE_FAMILIES)
def test_an_attention_level_method_refuses_images_before_the_vision_encoder_runs(model_type):
    model = build(model_type)
    hf_posenc.patch(model, "dca", **KNOBS["dca"])
    text = text_input()
    want = out(model, text)
    calls = []
    model.model.visual.register_forward_pre_hook(lambda *a: calls.append(1))
    model.model.language_model.register_forward_pre_hook(lambda *a: calls.append(2))
    with pytest.raises(ValueError, match="dca \\(hf_posenc\\) computes causal attention over text positions; this "
                                         "call has pixel_values \\(images, videos or audio"):
        out(model, image_input())
    assert not calls and hf_posenc.is_patched(model)
    assert torch.equal(out(model, text), want)  # nothing changed by the refused call
    rows = torch.arange(150).view(1, 1, 150).repeat(3, 1, 1)
    rows[1, 0, 20:24] += 1  # an image's height positions, given by a caller to the language model itself
    with pytest.raises(ValueError, match="positions differ between temporal, height and width"):
        model.model.language_model(inputs_embeds=torch.zeros(1, 150, 64), position_ids=rows)


@pytest.mark.parametrize("model_type", MROPE_FAMILIES)
def test_an_attention_level_method_is_saved_and_loaded_back(model_type, tmp_path):
    model, text = build(model_type), text_input()
    hf_posenc.patch(model, "self_extend", **KNOBS["self_extend"])
    want = out(model, text)
    model.save_pretrained(tmp_path)
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32, attn_implementation="eager").eval()
    assert hf_posenc.get_config(again) == hf_posenc.get_config(model)
    assert (out(again, text) - want).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="this call has pixel_values"):
        out(again, image_input())


@pytest.mark.parametrize("method", ["alibi", "nope"])
@pytest.mark.parametrize("model_type", MROPE_FAMILIES)
def test_swaps_that_replace_positions_are_refused_by_name(model_type, method):
    model = build(model_type)
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match=f"'{method}' .*model_type='{model_type}'.*does not remap MRoPE's 3-D "
                                         "positions.*RoPE scalings are supported"):
        hf_posenc.patch(model, method)
    assert not hf_posenc.is_patched(model) and not calls  # refused before any compute


@pytest.mark.parametrize("method", LENGTH_DEPENDENT)
def test_length_dependent_scalings_take_the_stale_cache_only(method):
    model = build("qwen2_5_vl")
    for mode in ("consistent", "exact"):
        with pytest.raises(ValueError, match=f"{method} with cache='{mode}' on model_type='qwen2_5_vl'.*Pass "
                                             "cache='stale'"):
            hf_posenc.patch(model, method, factor=2.0, cache=mode)
    with pytest.raises(ValueError, match="cache='consistent'"):  # the default
        hf_posenc.patch(model, method, factor=2.0)
    assert not hf_posenc.is_patched(model)


def test_listed_for_the_scalings_and_the_attention_level_methods():
    listed = hf_posenc.list_methods()
    for method in [*PROVEN_SCALINGS, *REMAPPED]:
        assert set(MROPE_FAMILIES) <= set(listed[method]["families"])
    for method in ["alibi", "dynamic_yarn"]:
        assert not set(MROPE_FAMILIES) & set(listed[method]["families"])


def test_a_composition_on_a_yarn_vlm_switches_by_position_and_loads_back(tmp_path):
    """Qwen2.5-VL with YaRN x4, then yarn x2 on top: the composed longrope takes cache='stale' (re-encoding follows
    1-D token counts; MRoPE switches by position, as transformers does), so generate with an image crossing the
    checkpoint's context in tokens but not in positions equals recomputing each step; the folder loads back."""
    yarn4 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}
    model = build("qwen2_5_vl", rope=yarn4, max_position_embeddings=4 * ORIGINAL)
    hf_posenc.patch(model, "yarn", factor=2.0)
    cfg = hf_posenc.get_config(model)
    assert cfg.method == "longrope" and cfg.params["cache"] == "stale" and cfg.original_max_position_embeddings == 256
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, 89, (1, 250), generator=g)
    ids[0, 10], ids[0, 11:75], ids[0, 75] = START, IMAGE, END  # an 8 x 8 image: 64 tokens over 8 positions
    kinds = torch.zeros_like(ids)
    kinds[0, 11:75] = 1
    image = {"pixel_values": torch.randn(64, 3 * 2 * 14 * 14, generator=g), "image_grid_thw": torch.tensor([[1, 8, 8]])}
    assert int(rope_index(model, {"input_ids": ids, "mm_token_type_ids": kinds, **image}).max()) + 1 < 200
    with torch.no_grad():
        done = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=kinds, **image,
                              max_new_tokens=12, do_sample=False, output_logits=True, return_dict_in_generate=True,
                              pad_token_id=0)
        for step, got in enumerate(done.logits):  # tokens 250..261 cross 256; positions stay under 200
            x = done.sequences[:, : 250 + step]
            kinds_x = torch.cat([kinds, torch.zeros(1, step, dtype=kinds.dtype)], 1)
            want = model(input_ids=x, mm_token_type_ids=kinds_x, **image, use_cache=False).logits[:, -1]
            assert (got - want).abs().max().item() <= 1e-5, step
    hf_posenc.save_pretrained(model, tmp_path)
    again = hf_posenc.from_pretrained(str(tmp_path), dtype=torch.float32, attn_implementation="eager").eval()
    assert hf_posenc.get_config(again) == cfg
    inputs = {"input_ids": ids, "mm_token_type_ids": kinds, **image}
    assert (out(again, inputs) - out(model, inputs)).abs().max().item() <= 1e-5
