"""A checkpoint saved with a RoPE scaling (hf_posenc's YaRN x2 save, then fine-tuned past its original context) is what
that checkpoint is: loaded by ``hf_posenc.from_pretrained`` (which re-applies the stored block), a later patch goes on
top of it exactly as on the same folder loaded by plain transformers -- a RoPE scaling extends from its current
context (never shrinks it back to the pretraining one), an attention-level method acts on its scaled frequencies --
and ``unpatch`` returns to it, a second ``unpatch`` to the model without it."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
from helpers import ORIGINAL, cached_last_logits, greedy, ids, logits, tiny_model
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.patching import checkpoint_config, trying

CONTEXT = 2 * ORIGINAL  # what the saved YaRN x2 checkpoint advertises
LONG = 3 * ORIGINAL + 5  # past the composed x1.5 reach's half, past the checkpoint's context


def saved(tmp_path, method: str = "yarn", **knobs):
    """A tiny llama patched with ``method`` x2 over its 64 tokens, its weights then changed (as fine-tuning does:
    what the checkpoint is can no longer be told apart from its scaling), saved by hf_posenc."""
    model = hf_posenc.patch(tiny_model("llama"), method, factor=2.0, **knobs)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    model.save_pretrained(tmp_path / method)
    return str(tmp_path / method)


def plain(folder: str):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def loaded(folder: str, **kw):
    return hf_posenc.from_pretrained(folder, dtype=torch.float32, **kw).eval()


@pytest.mark.parametrize("method", ["yarn", "pi", "llama3"])
def test_a_scaling_on_a_saved_scaled_checkpoint_extends_it_as_on_the_plain_loaded_folder(tmp_path, method):
    folder = saved(tmp_path, method)
    ours = loaded(folder)
    assert ours.config.max_position_embeddings == CONTEXT and checkpoint_config(ours).method == method
    hf_posenc.patch(ours, "yarn", factor=1.5)
    reference = hf_posenc.patch(plain(folder), "yarn", factor=1.5)  # plain transformers' reading of the folder
    at_load = loaded(folder, posenc="yarn:factor=1.5")
    for model in (ours, at_load):
        cfg = hf_posenc.get_config(model)
        assert model.config.max_position_embeddings == int(1.5 * CONTEXT)  # 192: was 96 (1.5 x 64), a shrink
        assert cfg.method == "longrope" and cfg.original_max_position_embeddings == CONTEXT
        x = ids(LONG)
        assert (logits(model, x) - logits(reference, x)).abs().max().item() <= 1e-5


def test_unpatch_returns_to_the_checkpoint_as_loaded_then_to_the_model_without_its_scaling(tmp_path):
    folder = saved(tmp_path)
    model = loaded(folder)
    x = ids(LONG)
    as_loaded = logits(model, x)
    assert (as_loaded - logits(plain(folder), x)).abs().max().item() <= 1e-5
    hf_posenc.patch(model, "yarn", factor=1.5)
    hf_posenc.patch(model, "pi", factor=2.0)  # replaces the yarn on top, not the checkpoint's own
    assert model.config.max_position_embeddings == 2 * CONTEXT
    hf_posenc.unpatch(model)
    assert torch.equal(logits(model, x), as_loaded)
    assert hf_posenc.get_config(model).method == "yarn" and model.config.max_position_embeddings == CONTEXT
    hf_posenc.unpatch(model)  # the stored scaling too: the saved weights with plain RoPE over 64
    assert not hf_posenc.is_patched(model) and model.config.max_position_embeddings == ORIGINAL
    assert model.config.rope_parameters.get("rope_type", "default") == "default"


def test_a_shrink_of_the_saved_context_is_refused_unless_the_replacement_reaches_it(tmp_path):
    folder = saved(tmp_path)
    model = loaded(folder)
    x = ids(LONG)
    before = logits(model, x)
    with pytest.raises(ValueError, match=r"would advertise 96 tokens, fewer than the 128.*at least 2"):
        hf_posenc.patch(model, "yarn", factor=1.5, original_max_position_embeddings=ORIGINAL)
    assert torch.equal(logits(model, x), before) and hf_posenc.get_config(model).method == "yarn"
    hf_posenc.patch(model, "yarn", factor=3.0, original_max_position_embeddings=ORIGINAL)  # an explicit replacement
    reference = hf_posenc.patch(plain(folder), "yarn", factor=3.0, original_max_position_embeddings=ORIGINAL)
    assert model.config.max_position_embeddings == 3 * ORIGINAL
    assert (logits(model, x) - logits(reference, x)).abs().max().item() <= 1e-5


def test_an_attention_level_method_acts_on_the_saved_scaling(tmp_path):
    folder = saved(tmp_path)
    model, reference = loaded(folder), plain(folder)
    knobs = dict(group_size=4, window=32)
    inside = ids(knobs["window"])
    as_loaded = logits(model, inside)
    hf_posenc.patch(model, "self_extend", **knobs)
    hf_posenc.patch(reference, "self_extend", **knobs)
    assert hf_posenc.get_config(model).original_max_position_embeddings == CONTEXT
    x = ids(LONG)
    assert (logits(model, x) - logits(reference, x)).abs().max().item() <= 1e-5
    assert (logits(model, inside) - as_loaded).abs().max().item() <= 1e-5  # inside its window: the checkpoint


def test_a_composition_saved_again_loads_back_and_its_copies_unpatch_to_the_checkpoint(tmp_path):
    folder = saved(tmp_path)
    model = hf_posenc.patch(loaded(folder), "yarn", factor=1.5)
    x = ids(LONG)
    composed = logits(model, x)
    model.save_pretrained(tmp_path / "again")
    for again in (loaded(str(tmp_path / "again")), plain(str(tmp_path / "again"))):
        assert (logits(again, x) - composed).abs().max().item() <= 1e-5
    checkpoint = logits(loaded(folder), x)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert torch.equal(logits(twin, x), composed)
        hf_posenc.unpatch(twin)
        assert torch.equal(logits(twin, x), checkpoint) and checkpoint_config(twin).method == "yarn"
    assert torch.equal(logits(model, x), composed)  # the copies' unpatch left the model alone


def test_trying_variants_leaves_the_checkpoint_and_its_patch_as_they_were(tmp_path):
    model = hf_posenc.patch(loaded(saved(tmp_path)), "yarn", factor=1.5)
    x = ids(LONG)
    before, cfg = logits(model, x), hf_posenc.get_config(model)
    with trying(model, [hf_posenc.PosEncConfig("none"), hf_posenc.PosEncConfig("pi", 2.0)]):
        hf_posenc.patch(model, "none")
        assert model.config.max_position_embeddings == ORIGINAL  # "none": without any patch, the stored one too
    assert hf_posenc.get_config(model) == cfg and torch.equal(logits(model, x), before)
    hf_posenc.unpatch(model)
    assert hf_posenc.get_config(model).method == "yarn" and checkpoint_config(model) is not None


def test_a_variant_tried_after_none_starts_from_the_checkpoints_scaling_as_it_would_alone(tmp_path):
    """"none" takes the stored scaling off; the variants an evaluation tries after it start from that scaling again,
    so a method's numbers do not depend on whether "none" came first (nor does what is refused there)."""
    from hf_posenc.eval.variants import Variant, applied

    folder, x, yarn = saved(tmp_path), ids(LONG), hf_posenc.PosEncConfig("yarn", 1.5)
    alone = hf_posenc.patch(loaded(folder), yarn)
    model = loaded(folder)
    with trying(model, [hf_posenc.PosEncConfig("none"), yarn]) as apply:
        apply(hf_posenc.PosEncConfig("none"))
        apply(yarn)
        assert hf_posenc.get_config(model) == hf_posenc.get_config(alone)
        assert torch.equal(logits(model, x), logits(alone, x))
    with pytest.raises(ValueError, match="already scaled .*'dynamic_ntk' follows the sequence length"):
        with trying(model, [hf_posenc.PosEncConfig("none"), hf_posenc.PosEncConfig("dynamic_ntk", 2.0)]):
            pass
    both = applied(model, [Variant("none", hf_posenc.PosEncConfig("none")), Variant("yarn", yarn)])
    assert both["yarn"] == applied(model, [Variant("yarn", yarn)])["yarn"]
    assert both["yarn"]["config"]["method"] == "longrope" and not both["yarn"]["own_scaling"]["replaced"]
    assert checkpoint_config(model) is not None and model.config.max_position_embeddings == CONTEXT


def test_a_saved_composition_extended_again_grows_from_its_context_as_on_the_plain_loaded_folder(tmp_path):
    """A checkpoint that ships llama3 x8 (512 tokens), given yarn x2 by hf_posenc (a longrope over 512, 1,024 tokens)
    and saved: loaded by hf_posenc and given yarn x2 again, it advertises 2,048 (it stayed at 1,024 when the saved
    longrope was replaced from the checkpoint's llama3), the same as the plain-loaded folder given it, its own
    per-length switch standing aside under the patch on top (cached decoding across the switch equals
    recomputation); unpatch returns to it bit for bit, a second to the shipped llama3."""
    llama3 = {"rope_type": "llama3", "rope_theta": 50_000.0, "factor": 8.0, "original_max_position_embeddings": 64,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    model = hf_posenc.patch(tiny_model("llama", max_position_embeddings=512, rope_parameters=llama3), "yarn",
                            factor=2.0)
    model.save_pretrained(tmp_path / "composed")
    folder = str(tmp_path / "composed")
    ours = loaded(folder)
    assert ours.config.max_position_embeddings == 1024 and checkpoint_config(ours).method == "longrope"
    x = ids(520)  # past the saved longrope's switch at 512
    as_loaded = logits(ours, x)
    hf_posenc.patch(ours, "yarn", factor=2.0)
    reference = hf_posenc.patch(plain(folder), "yarn", factor=2.0)
    for model in (ours, loaded(folder, posenc="yarn:factor=2")):
        assert model.config.max_position_embeddings == 2048
        assert hf_posenc.get_config(model).original_max_position_embeddings == 512
        assert (logits(model, x) - logits(reference, x)).abs().max().item() <= 1e-5
    sequences, generated = greedy(ours, x[:, :508], n=10)  # the cache crosses the switch at 512 while decoding
    recomputed = torch.stack([logits(ours, sequences[:, :n])[:, -1] for n in range(508, 518)], 1)
    assert (generated - recomputed).abs().max().item() <= 1e-5
    by_hand = cached_last_logits(ours, sequences, 508)  # a hand-written cached loop: re-rotated keys at the switch,
    assert (by_hand - cached_last_logits(reference, sequences, 508)).abs().max().item() <= 1e-5  # once (not twice:
    assert (by_hand - recomputed).abs().max().item() <= 5e-4  # 1.8e-3 with the saved longrope's hook acting too)
    on_top = logits(ours, sequences)
    for twin in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):  # the copies' hooks stand aside as well
        assert torch.equal(cached_last_logits(twin, sequences, 508), by_hand)
        assert torch.equal(logits(twin, sequences), on_top)
    hf_posenc.unpatch(ours)
    assert torch.equal(logits(ours, x), as_loaded) and ours.config.max_position_embeddings == 1024
    hf_posenc.unpatch(ours)
    assert ours.config.max_position_embeddings == 512 and ours.config.rope_parameters["rope_type"] == "llama3"


def test_a_dynamic_saved_scaling_is_replaced_by_a_later_patch_from_the_model_without_it(tmp_path, caplog):
    """Its frequencies grow with every length, so it is not kept (rope_compose.kept_scaling): a patch starts from the
    saved weights without it, exactly, and from_pretrained says so."""
    method = "dynamic_ntk"
    folder = saved(tmp_path, method)
    assert checkpoint_config(loaded(folder)) is None
    reference = hf_posenc.patch(hf_posenc.unpatch(loaded(folder)), "yarn", factor=3.0)
    x = ids(LONG)
    for model in (hf_posenc.patch(loaded(folder), "yarn", factor=3.0), loaded(folder, posenc="yarn:factor=3")):
        assert torch.equal(logits(model, x), logits(reference, x))
    with caplog.at_level("INFO", logger="hf_posenc.checkpoints.loading"):
        loaded(folder, posenc="yarn:factor=3")
    assert f"replacing the stored patch {method}" in caplog.text


def test_a_record_pickled_without_the_new_fields_still_patches_and_unpatches():
    model = hf_posenc.patch(tiny_model("llama"), "yarn", factor=2.0)
    record = model.__dict__["_hf_posenc_record"]
    for name in ("checkpoint", "below"):  # as a release before them pickled it
        record.__dict__.pop(name)
    hf_posenc.patch(model, "pi", factor=2.0)
    hf_posenc.unpatch(model)
    assert not hf_posenc.is_patched(model)


def test_asked_is_not_carried_to_a_model_where_nothing_is_composed(tmp_path):
    cfg = hf_posenc.get_config(hf_posenc.patch(loaded(saved(tmp_path)), "yarn", factor=1.5))
    other = hf_posenc.patch(tiny_model("llama", max_position_embeddings=CONTEXT), cfg)  # a plain longrope here
    assert hf_posenc.get_config(other).asked is None
    assert "asked" not in other.config.hf_posenc and other.config.hf_posenc["schema"] == 2


def test_asking_for_the_checkpoints_own_scaling_keeps_it_and_none_is_the_model_without_it(tmp_path):
    folder = saved(tmp_path)
    model = hf_posenc.patch(loaded(folder), "yarn", factor=1.5)
    x = ids(LONG)
    own = checkpoint_config(model)
    hf_posenc.patch(model, own)
    assert torch.equal(logits(model, x), logits(loaded(folder), x)) and checkpoint_config(model) == own
    hf_posenc.patch(model, "none")  # the baseline of every evaluation: no patch at all
    assert checkpoint_config(model) is None and model.config.max_position_embeddings == ORIGINAL
    assert torch.equal(logits(model, x), logits(hf_posenc.unpatch(hf_posenc.unpatch(loaded(folder))), x))


def test_the_original_context_is_the_stored_scalings_pretraining_one_until_a_patch_extends_it(tmp_path):
    from hf_posenc.checkpoints.context import original_context

    model = loaded(saved(tmp_path))
    assert original_context(model) == ORIGINAL  # what eval measures past, as for the model patched in memory
    hf_posenc.patch(model, "yarn", factor=1.5)
    assert original_context(model) == CONTEXT
    hf_posenc.patch(model, "yarn", factor=3.0, original_max_position_embeddings=ORIGINAL)
    assert original_context(model) == ORIGINAL  # a replacement: from the context it names


def test_eval_ppl_on_a_saved_scaled_checkpoint_measures_past_its_context_and_composes_on_it(tmp_path, bert_tokenizer):
    """eval ppl on a folder saved with yarn x2: a scaling asked composes on it, its own restated is the checkpoint."""
    from hf_posenc.cli import main

    model = hf_posenc.patch(tiny_model("llama", vocab_size=bert_tokenizer.vocab_size), "yarn", factor=2.0)
    model.save_pretrained(tmp_path / "ckpt")
    bert_tokenizer.save_pretrained(tmp_path / "ckpt")
    out, length = tmp_path / "ppl", CONTEXT + 32
    own = str(hf_posenc.get_config(model))  # the checkpoint's own scaling, restated: the checkpoint as saved
    assert main(["eval", "ppl", "--model", str(tmp_path / "ckpt"), "--variant", "composed=yarn:factor=1.5",
                 "--variant", f"replacing=yarn:factor=3,original_max_position_embeddings={ORIGINAL}",
                 "--variant", f"checkpoint={own}", "--lengths", str(length), "--corpus", "python-docs", "--limit", "1",
                 "--max-windows", "1", "--no-progress", "--no-plots", "--output", str(out)]) == 0
    report = json.loads((out / "perplexity.json").read_text())
    setup, results = report["setup"], report["results"]
    assert setup["original_context"] == ORIGINAL and setup["truncated_baseline"]["context"] == ORIGINAL
    composed = setup["applied"]["composed"]
    assert composed["context"] == int(1.5 * CONTEXT) and composed["config"]["method"] == "longrope"
    assert setup["applied"]["replacing"]["context"] == 3 * ORIGINAL
    assert setup["applied"]["checkpoint"]["context"] == CONTEXT
    for label in ("composed", "replacing", "checkpoint"):
        assert results[label][str(length)]["past_original"]["from"] == ORIGINAL
    assert results["composed"][str(length)]["ppl"] != results["checkpoint"][str(length)]["ppl"]
    first = json.loads((out / "cells.jsonl").read_text().splitlines()[0])
    assert first["fingerprint"]["checkpoint_scaling"]["method"] == "yarn"


def test_cells_an_earlier_release_computed_after_none_on_such_a_checkpoint_are_refused(tmp_path, bert_tokenizer,
                                                                                       capsys):
    """Before 0.2.1 a variant computed after "none" on a checkpoint saved with a RoPE scaling started from the model
    without it: a cells file of such a release with that order is refused, naming why; one without "none" resumes."""
    from hf_posenc.cli import main

    model = hf_posenc.patch(tiny_model("llama", vocab_size=bert_tokenizer.vocab_size), "yarn", factor=2.0)
    model.save_pretrained(tmp_path / "ckpt")
    bert_tokenizer.save_pretrained(tmp_path / "ckpt")

    def run(methods, out):
        return main(["eval", "ppl", "--model", str(tmp_path / "ckpt"), "--methods", methods, "--lengths", "32",
                     "--corpus", "python-docs", "--limit", "1", "--max-windows", "1", "--no-progress", "--no-plots",
                     "--output", str(out)])

    for methods, out in (("none,pi", tmp_path / "after-none"), ("pi,none", tmp_path / "pi-first")):
        assert run(methods, out) == 0
        lines = (out / "cells.jsonl").read_text().splitlines()
        setup = json.loads(lines[0])
        setup["fingerprint"]["versions"]["hf_posenc"] = "0.2.0"  # as that release wrote it
        (out / "cells.jsonl").write_text("\n".join([json.dumps(setup), *lines[1:]]) + "\n")
    assert run("none,pi", tmp_path / "after-none") != 0
    assert ("holds cells of 'pi' computed after 'none' by hf_posenc 0.2.0, on a checkpoint saved with a RoPE "
            "scaling: before 0.2.1") in capsys.readouterr().err
    assert run("pi,none", tmp_path / "pi-first") == 0  # computed in an order that did not matter: resumed


def test_get_config_and_the_saved_block_say_what_was_asked_on_top_of_the_checkpoint(tmp_path):
    folder = saved(tmp_path)
    model = hf_posenc.patch(loaded(folder), "yarn", factor=1.5)
    cfg = hf_posenc.get_config(model)
    assert cfg.method == "longrope" and cfg.asked == hf_posenc.PosEncConfig("yarn", 1.5)
    assert repr(cfg).endswith("asked='yarn:factor=1.5')")
    block = model.config.hf_posenc
    assert block["asked"] == "yarn:factor=1.5" and block["schema"] == 3
    assert block["original"]["rope_parameters"]["rope_type"] == "yarn"  # what was there
    model.save_pretrained(tmp_path / "again")
    again = loaded(str(tmp_path / "again"))
    assert hf_posenc.get_config(again) == cfg and hf_posenc.get_config(again).asked.to_text() == "yarn:factor=1.5"
    plain_block = hf_posenc.patch(tiny_model("llama"), "yarn", factor=2.0).config.hf_posenc
    assert "asked" not in plain_block and plain_block["schema"] == 2  # what earlier releases read


def test_what_was_asked_stays_through_a_refused_patch_a_trial_and_a_load_saved_again(tmp_path):
    """A composition applied again -- the earlier patch after a refused one, a model after trying(), a loaded
    folder -- keeps what was asked for it in get_config and in the block it saves."""
    def said(m) -> tuple:
        return hf_posenc.get_config(m).asked.to_text(), m.config.hf_posenc.get("asked")

    model = hf_posenc.patch(loaded(saved(tmp_path)), "yarn", factor=1.5)
    with pytest.raises(ValueError, match="fewer than the 128"):
        hf_posenc.patch(model, "pi", factor=1.5, original_max_position_embeddings=ORIGINAL)
    assert said(model) == ("yarn:factor=1.5", "yarn:factor=1.5")
    with trying(model, [hf_posenc.PosEncConfig("pi", 2.0)]):
        pass
    assert said(model) == ("yarn:factor=1.5", "yarn:factor=1.5")
    model.save_pretrained(tmp_path / "composed")
    again = loaded(str(tmp_path / "composed"))
    assert said(again) == ("yarn:factor=1.5", "yarn:factor=1.5")
    again.save_pretrained(tmp_path / "resaved")
    block = json.loads((tmp_path / "resaved" / "config.json").read_text())["hf_posenc"]
    assert block["asked"] == "yarn:factor=1.5" and block["schema"] == 3


def test_a_bad_asked_in_a_saved_block_is_refused_naming_the_checkpoint(tmp_path):
    model = hf_posenc.patch(loaded(saved(tmp_path)), "yarn", factor=1.5)
    model.save_pretrained(tmp_path / "again")
    path = tmp_path / "again" / "config.json"
    data = json.loads(path.read_text())
    data["hf_posenc"]["asked"] = "yran:factor=2"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"again: the 'hf_posenc' block of its config.json: .*'yran'"):
        hf_posenc.from_pretrained(str(tmp_path / "again"))
