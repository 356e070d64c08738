"""LoRA through peft on a patched model (hf_posenc.training.lora): the patch kept under the wrapper, LongLoRA's
trainable embedding and norms, merged and adapter saves that load back to the trained model's logits, peft and TRL used
directly, and the refusals."""

import json
import os

import pytest
import torch

pytest.importorskip("peft")

from helpers import ORIGINAL, ids, logits, tiny_model  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from peft.utils.other import ModulesToSaveWrapper  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import hf_posenc  # noqa: E402
from hf_posenc.training.lora import LoraSettings, apply_lora, load_lora, save_lora, trained_in_full  # noqa: E402

N = 100  # > ORIGINAL = 64: the patch acts
METHODS = {"yarn": {"factor": 2.0}, "self_extend": {"group_size": 4}}  # a native RoPE method, an attention-level one


def patched(method: str, **overrides):
    model = tiny_model("llama", **overrides)
    return hf_posenc.patch(model, method, **METHODS[method])


def train(model, steps: int = 4, seed: int = 0) -> list[float]:
    """A few real AdamW steps on a random batch of N tokens; the model is left in eval mode."""
    x = ids(N, seed=seed + 10, batch=2)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    model.eval()
    return losses


def gap(a, b) -> float:
    return (a - b).abs().max().item()


def test_settings_defaults_and_bad_values():
    s = LoraSettings(r=4)
    assert (s.alpha, s.targets, s.dropout, s.train_embeddings_and_norms) == (
        8.0, ("q_proj", "k_proj", "v_proj", "o_proj"), 0.0, True)
    assert LoraSettings(r=2, alpha=3, targets=["q_proj"]).targets == ("q_proj",)
    for bad, match in [({"r": 0}, "r=0"), ({"r": True}, "r=True"), ({"r": 2.0}, "r=2.0"),
                       ({"r": 2, "alpha": 0}, "alpha=0"),
                       ({"r": 2, "alpha": -1.5}, "alpha=-1.5"), ({"r": 2, "dropout": 1.0}, r"dropout=1\.0"),
                       ({"r": 2, "dropout": -0.1}, r"dropout=-0\.1"), ({"r": 2, "targets": ()}, r"targets=\(\)"),
                       ({"r": 2, "targets": ("q_proj", "")}, "targets=")]:
        with pytest.raises(ValueError, match=match):
            LoraSettings(**bad)


def test_targets_matching_nothing_are_refused_before_wrapping():
    model = patched("yarn")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"\['qproj', 'attn'\] match no module of LlamaForCausalLM; its linear layers "
                                         r"are named \['down_proj', 'gate_proj', 'k_proj', 'lm_head', 'o_proj', "
                                         r"'q_proj'"):
        apply_lora(model, LoraSettings(r=2, targets=("q_proj", "qproj", "attn")))
    assert model.state_dict().keys() == before.keys()  # nothing wrapped
    assert not any(type(m).__module__.startswith("peft") for m in model.modules())
    assert hf_posenc.get_config(model).method == "yarn"


def test_a_module_the_patch_holds_is_not_replaced():
    """sinusoidal's hook calls the input embedding itself: a modules_to_save copy would never be used (trained for
    nothing), so training the embedding is refused; without it, LoRA applies."""
    model = tiny_model("llama")
    hf_posenc.patch(model, "sinusoidal", factor=2.0)
    with pytest.raises(ValueError, match=r"model\.embed_tokens .*held by the hf_posenc patch \(sinusoidal calls it "
                                         r"from a hook\).*train_embeddings_and_norms=False"):
        apply_lora(model, LoraSettings(r=2))
    lora = apply_lora(model, LoraSettings(r=2, train_embeddings_and_norms=False))
    assert not any(isinstance(m, ModulesToSaveWrapper) for m in lora.modules())


@pytest.mark.parametrize("method", sorted(METHODS))
def test_wrapping_keeps_the_patch_and_trains_lora_embeddings_and_norms(method):
    x = ids(N)
    plain = logits(tiny_model("llama"), x)
    model = patched(method)
    ref = logits(model, x)
    assert gap(ref, plain) > 1e-3  # the patch acts on these N tokens
    full = trained_in_full(model)
    lora = apply_lora(model, LoraSettings(r=4))
    assert gap(logits(lora, x), ref) <= 1e-6  # LoRA B starts at zero; the embedding and norm copies equal the originals
    assert lora.get_base_model() is model and hf_posenc.get_config(model).method == method
    assert full == ["model.embed_tokens", "model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
                    "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm", "model.norm"]
    wrapped = sorted(n.removeprefix("base_model.model.") for n, m in lora.named_modules()
                     if isinstance(m, ModulesToSaveWrapper))
    assert wrapped == sorted(full)
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n or ".modules_to_save." in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable if ".lora_" in n} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert not any(p.requires_grad for n, p in lora.named_parameters()
                   if ".base_layer." in n or ".original_module." in n)
    assert lora.peft_config["default"].lora_alpha == 8.0 and lora.peft_config["default"].r == 4


@pytest.mark.parametrize("method,tied", [("yarn", False), ("self_extend", False), ("yarn", True)])
def test_trained_lora_saved_merged_and_as_adapter_loads_back(method, tied, tmp_path):
    x = ids(N)
    model = patched(method, tie_word_embeddings=tied)
    untrained = logits(model, x)
    lora = apply_lora(model, LoraSettings(r=4, alpha=4.0))
    norm_before = model.model.norm.original_module.weight.clone()
    losses = train(lora)
    assert losses[-1] < losses[0]
    trained = logits(lora, x)
    assert gap(trained, untrained) > 1e-2
    # the LoRA weights, the embedding and the norms all changed; the originals did not
    q = model.model.layers[0].self_attn.q_proj
    assert q.lora_B["default"].weight.abs().max() > 0
    assert gap(model.model.norm.modules_to_save["default"].weight, norm_before) > 1e-3
    assert gap(model.model.norm.original_module.weight, norm_before) == 0
    emb = model.model.embed_tokens
    assert gap(emb.modules_to_save["default"].weight, emb.original_module.weight) > 1e-3
    if tied:  # the output head follows the trained embedding
        assert model.lm_head.modules_to_save["default"].weight is emb.modules_to_save["default"].weight

    adapter = tmp_path / "adapter"
    save_lora(lora, str(adapter), merged=False)
    assert {"adapter_config.json", "adapter_model.safetensors", "base"} <= set(os.listdir(adapter))
    saved = json.loads((adapter / "base" / "config.json").read_text())
    assert saved["hf_posenc"]["method"] == method
    base = hf_posenc.from_pretrained(str(adapter / "base"), attn_implementation="eager")
    assert gap(logits(base, x), untrained) <= 1e-5  # the base saved untrained, patched
    loaded = load_lora(str(adapter), attn_implementation="eager")
    assert hf_posenc.get_config(loaded.get_base_model()).method == method
    assert gap(logits(loaded, x), trained) <= 1e-5
    again = hf_posenc.from_pretrained(str(adapter), attn_implementation="eager")  # the folder as any other
    assert isinstance(again, PeftModel) and hf_posenc.get_config(again).method == method  # through the wrapper
    assert gap(logits(again, x), trained) <= 1e-5
    stored = hf_posenc.get_config(again)
    hf_posenc.unpatch(again)  # the wrapped model's patch, undone and applied again through the wrapper
    assert hf_posenc.get_config(again) is None and hf_posenc.get_config(again.get_base_model()) is None
    assert gap(logits(again, x), trained) > 1e-3  # N > L: the unpatched model computes otherwise
    assert hf_posenc.patch(again, stored) is again and gap(logits(again, x), trained) <= 1e-5
    assert gap(logits(lora, x), trained) == 0  # the adapter save left the trained model as it was

    merged = tmp_path / "merged"
    save_lora(lora, str(merged), merged=True)
    back = hf_posenc.from_pretrained(str(merged), attn_implementation="eager")
    assert hf_posenc.get_config(back).method == method
    assert not any(type(m).__module__.startswith("peft") for m in back.modules())
    assert gap(logits(back, x), trained) <= 1e-5
    if tied:
        assert back.lm_head.weight is back.model.embed_tokens.weight
    block = json.loads((merged / "config.json").read_text())["hf_posenc"]
    plain = AutoModelForCausalLM.from_pretrained(str(merged), attn_implementation="eager").eval()
    if method == "yarn":  # native: plain transformers computes the patched, trained model
        assert block["native"] is True
        assert gap(logits(plain, x), trained) <= 1e-5
    else:  # not native: plain transformers gets the original context and plain RoPE, never an extended one
        assert block["native"] is False and plain.config.max_position_embeddings == ORIGINAL
        assert gap(logits(plain, x), trained) > 1e-3


@pytest.mark.parametrize("text,message", [
    ("learned:factor=2", "'learned' adds weights .* that this peft model would leave frozen"),
    ("sinusoidal:factor=2", "'sinusoidal' cannot be applied under this peft model: .*embed_tokens.* is a module peft "
                            "wrapped"),
])
def test_a_patch_under_a_peft_model_that_lora_would_refuse_is_refused_and_the_one_before_stays(text, message):
    """apply_lora refuses these pairs when the patch comes first; a patch applied through the wrapper is refused the
    same (it reloaded wrong: the learned table frozen and not saved, the embedding hooked beside its trained copy)."""
    x = ids(N)
    lora = apply_lora(patched("yarn"), LoraSettings(r=2))
    before = logits(lora, x)
    with pytest.raises(ValueError, match=message):
        hf_posenc.patch(lora, text)
    assert hf_posenc.get_config(lora).method == "yarn" and gap(logits(lora, x), before) == 0
    assert not any("hf_posenc_" in n for n, _ in lora.named_parameters())


def test_peft_used_directly_then_hf_posenc_save_keeps_the_patch(tmp_path):
    x = ids(N)
    model = patched("self_extend")
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            modules_to_save=["norm"], task_type="CAUSAL_LM"))
    train(lora, steps=3)
    trained = logits(lora, x)
    merged = lora.merge_and_unload()
    assert merged is model and hf_posenc.get_config(merged).method == "self_extend"
    hf_posenc.save_pretrained(merged, str(tmp_path))
    back = hf_posenc.from_pretrained(str(tmp_path), attn_implementation="eager")
    assert hf_posenc.get_config(back).method == "self_extend"
    assert gap(logits(back, x), trained) <= 1e-5
    hf_posenc.unpatch(back)  # the saved patch is what makes the difference
    assert gap(logits(back, x), trained) > 1e-3


def test_trl_sft_trainer_keeps_the_patch_through_save_and_load(tmp_path, bert_tokenizer):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    x = ids(N)
    model = tiny_model("llama", vocab_size=bert_tokenizer.vocab_size)
    hf_posenc.patch(model, "yarn", factor=2.0)
    lora = apply_lora(model, LoraSettings(r=4))
    untrained = logits(lora, x)
    data = Dataset.from_dict({"input_ids": [ids(N, seed=s)[0].tolist() for s in range(4)]})
    # bf16=False: TRL's default autocasts the model's forward to bfloat16 on CPU too (and leaves it wrapped)
    args = SFTConfig(output_dir=str(tmp_path / "trl"), max_steps=2, per_device_train_batch_size=2, learning_rate=1e-2,
                     report_to=[], save_strategy="no", use_cpu=True, bf16=False, max_length=128, packing=False,
                     disable_tqdm=True)
    trainer = SFTTrainer(model=lora, args=args, train_dataset=data, processing_class=bert_tokenizer)
    trainer.train()
    lora = trainer.model
    lora.eval()
    trained = logits(lora, x)
    assert gap(trained, untrained) > 1e-3
    assert hf_posenc.get_config(lora.get_base_model()).method == "yarn"
    save_lora(lora, str(tmp_path / "adapter"), merged=False, tokenizer=bert_tokenizer)
    assert gap(logits(load_lora(str(tmp_path / "adapter"), attn_implementation="eager"), x), trained) <= 1e-5
    save_lora(lora, str(tmp_path / "merged"), merged=True, tokenizer=bert_tokenizer)
    back = hf_posenc.from_pretrained(str(tmp_path / "merged"), attn_implementation="eager")
    assert hf_posenc.get_config(back).method == "yarn"
    assert gap(logits(back, x), trained) <= 1e-5


def test_save_and_load_refuse_what_is_not_theirs(tmp_path):
    model = patched("yarn")
    with pytest.raises(ValueError, match="save_lora needs a peft model .*got LlamaForCausalLM"):
        save_lora(model, str(tmp_path / "x"), merged=True)
    hf_posenc.save_pretrained(model, str(tmp_path / "plain"))
    with pytest.raises(ValueError, match="is not a LoRA folder saved by save_lora"):
        load_lora(str(tmp_path / "plain"))
    bare = tmp_path / "bare"  # an adapter saved by peft alone: no patched base beside it
    get_peft_model(patched("yarn"), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(str(bare))
    for load in (load_lora, hf_posenc.from_pretrained):
        with pytest.raises(ValueError, match="holds a peft adapter but no patched base model in .*bare/base"):
            load(str(bare))
    lora = apply_lora(model, LoraSettings(r=2))
    with pytest.raises(ValueError, match="already a peft model"):
        apply_lora(lora, LoraSettings(r=2))
    with pytest.raises(ValueError, match="hf_posenc.save_pretrained saves a whole model, and this is a peft model "
                                         "\\(PeftModelForCausalLM\\): save it with hf_posenc.training.lora.save_lora"):
        hf_posenc.save_pretrained(lora, str(tmp_path / "whole"))
    assert not (tmp_path / "whole").exists()


# -- hf-posenc finetune --lora-r ---------------------------------------------------------------------------------
def _finetune_argv(checkpoint, out, *extra):
    from helpers import book_path

    return ["finetune", "--model", checkpoint, "--method", "yarn", "--factor", "2", "--text-file",
            book_path("pg1513.txt"), "--eval-text-file", book_path("pg84.txt"), "--seq-len", "64", "--steps", "3",
            "--learning-rate", "3e-3", "--eval-windows", "2", "--output", str(out), "--no-progress", *extra]


@pytest.mark.parametrize("merge", [False, True])
def test_cli_finetune_with_lora_and_pose_saves_what_loads_back(merge, tiny_checkpoint, tmp_path, capsys):
    from helpers import book_path, refused
    from transformers import AutoTokenizer

    from hf_posenc.cli import main
    from hf_posenc.io.documents import read_text_file, tokenize_documents
    from hf_posenc.training.finetune import heldout_perplexity

    out = tmp_path / "ft"
    argv = _finetune_argv(tiny_checkpoint, out, "--lora-r", "4", "--pose-window", "32", "--target-length", "128",
                          "--eval-needle-depths", "0.5", "--eval-needle-trials", "1")  # the long eval, kept short
    assert main(argv + (["--lora-merge"] if merge else [])) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "hf_posenc_eval" / "finetune.json").read_text())
    assert report["setup"]["lora"]["r"] == 4 and report["setup"]["lora"]["merged"] is merge
    assert report["setup"]["pose"]["target"] == 128
    assert report["long_context"]["after"]["needles"]["by_depth"]["0.5"]["trials"] == 1  # PoSE's target by default
    if merge:
        assert "load with hf_posenc.from_pretrained" in printed
        model = hf_posenc.from_pretrained(str(out)).eval()
        assert hf_posenc.get_config(model).method == "yarn"
        plain = AutoModelForCausalLM.from_pretrained(str(out)).eval()  # yarn is native: plain transformers too
        x = ids(100)
        assert (logits(plain, x) - logits(model, x)).abs().max().item() <= 1e-5
    else:
        assert "load with hf_posenc.from_pretrained -- a peft model" in printed
        adapter_config = json.loads((out / "adapter_config.json").read_text())
        assert adapter_config["base_model_name_or_path"] == str(out / "base")  # where base/ is, not the staged folder
        mask = os.umask(0o022)
        os.umask(mask)
        assert (out / "adapter_model.safetensors").stat().st_mode & 0o777 == 0o666 & ~mask  # not peft's 0600
        model = hf_posenc.from_pretrained(str(out)).eval()
        assert hf_posenc.get_config(model).method == "yarn"
        err = refused(["eval", "ppl", "--model", str(out), "--lengths", "32", "--corpus", "python-docs", "--output",
                       str(tmp_path / "ppl")], capsys)  # the commands evaluate whole models: merge it, as it says
        assert f"model folder '{out}' holds a LoRA adapter" in err and "merged=True" in err
        line = err.split("merge it once, e.g. ")[1].split(", then pass")[0]
        exec(line.replace("'merged'", repr(str(tmp_path / "m"))),
             {"hf_posenc": hf_posenc, "AutoTokenizer": AutoTokenizer})
        assert hf_posenc.get_config(hf_posenc.from_pretrained(str(tmp_path / "m"))).method == "yarn"
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    held = tokenize_documents(tok, [read_text_file(book_path("pg84.txt"))], 64 * 2)
    assert heldout_perplexity(model, held, 64, 2)["ppl"] == pytest.approx(report["heldout_after"]["ppl"], rel=1e-5)
    assert report["heldout_after"]["ppl"] != report["heldout_before"]["ppl"]  # the adapters trained


@pytest.mark.parametrize("extra,message", [
    (["--lora-alpha", "8"], "--lora-alpha apply to LoRA training: add --lora-r RANK"),
    (["--lora-r", "4", "--lora-targets", "qproj"], "LoRA targets \\['qproj'\\] match no module"),
    (["--lora-r", "4", "--lora-dropout", "1.5"], "dropout"),
])
def test_cli_lora_input_that_means_nothing_is_refused(extra, message, tiny_checkpoint, tmp_path, capsys,
                                                     monkeypatch):
    import re

    from helpers import refused

    import hf_posenc.checkpoints.loading as loading

    # before the weights load: the targets against the model built from its config on the meta device
    monkeypatch.setattr(loading, "from_pretrained", lambda *a, **k: pytest.fail("the model was loaded first"))
    err = refused(_finetune_argv(tiny_checkpoint, tmp_path / "ft", *extra), capsys)
    assert re.search(message, err), err
    assert not (tmp_path / "ft").exists()


@pytest.mark.parametrize("env", [
    {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"},
    {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "configs/deepspeed/zero3.json"},
], ids=["zero-stage", "zero3-config-file"])
def test_lora_on_sharded_weights_is_refused_from_the_launchers_environment_before_the_load(env, tiny_checkpoint,
                                                                                          tmp_path, capsys,
                                                                                          monkeypatch):
    """accelerate launch --config_file configs/accelerate/zero3.yaml: LoRA refused before any model loads (the
    Trainer's own check comes after the before-training evaluations)."""
    from helpers import refused

    import hf_posenc.checkpoints.loading as loading

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for k, v in env.items():
        monkeypatch.setenv(k, os.path.join(root, v) if v.endswith(".json") else v)
    monkeypatch.setattr(loading, "from_pretrained", lambda *a, **k: pytest.fail("the model was loaded first"))
    err = refused(_finetune_argv(tiny_checkpoint, tmp_path / "ft", "--lora-r", "4"), capsys)
    assert "LoRA (--lora-r) under deepspeed-zero3" in err and "ZeRO-2" in err


def test_lora_under_zero2_and_fsdp_on_cpu_processes_is_not_refused_early(monkeypatch):
    from hf_posenc.training.parallel import check_lora_engine, launched_sharding

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert launched_sharding("cpu") is None
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "false")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    check_lora_engine("cpu")  # accelerate trains CPU processes as DDP whatever its FSDP config says
    assert launched_sharding("cuda") == "fsdp"


def test_targets_and_patches_lora_would_train_wrongly_are_refused():
    with pytest.raises(ValueError, match="not linear layers \\(model.layers.0.mlp"):
        apply_lora(patched("yarn"), LoraSettings(r=2, targets=("mlp",)))
    with pytest.raises(ValueError, match="LM head is tied to the input embedding"):
        apply_lora(patched("yarn", tie_word_embeddings=True), LoraSettings(r=2, targets=("q_proj", "lm_head")))
    assert apply_lora(patched("yarn", tie_word_embeddings=True),  # adapters only: the head may be a target
                      LoraSettings(r=2, targets=("q_proj", "lm_head"), train_embeddings_and_norms=False))
    with pytest.raises(ValueError, match="added weights \\(model.hf_posenc_positions.weight\\) that LoRA would leave"):
        apply_lora(hf_posenc.patch(tiny_model("llama"), "learned", factor=2.0), LoraSettings(r=2))


def test_the_adapter_folder_carries_the_card_of_what_was_trained_and_the_base_that_of_the_base(tmp_path):
    lora = apply_lora(patched("yarn"), LoraSettings(r=2))
    report = {"task": "finetune", "table": "| trained |", "setup": {}}
    save_lora(lora, str(tmp_path), merged=False, eval_results=[report], trained=True)
    top, base = (tmp_path / "README.md").read_text(), (tmp_path / "base" / "README.md").read_text()
    assert 'hf_posenc.from_pretrained("path/to/model-yarn")  # a peft model' in top
    assert "Model Card for Model ID" not in top and "This folder holds a LoRA adapter" not in base
    assert "fine-tuned" in top and "fine-tuned" not in base
    assert (tmp_path / "hf_posenc_eval" / "finetune.json").exists()
    assert not (tmp_path / "base" / "hf_posenc_eval").exists()


def _code_blocks(card: str, language: str) -> list[str]:
    return [block.split("\n```", 1)[0] for block in card.split(f"```{language}\n")[1:]]


def test_an_adapter_folders_card_loads_what_hf_posenc_loads_and_launches_only_the_merged_checkpoint(
        tiny_checkpoint, tmp_path):
    """The card of save_lora(merged=False): each Python block it gives, run on this folder, loads the model
    hf_posenc.from_pretrained(folder) loads (the merge block included); no engine line names the adapter folder
    itself; and peft's own loader of the folder puts the adapter on the patched base, not on the raw model."""
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    lora = apply_lora(hf_posenc.from_pretrained(tiny_checkpoint, {"method": "yarn", "factor": 2.0}), LoraSettings(r=4))
    train(lora, steps=2)
    folder, name = tmp_path / "adapter", "me/tiny-yarn-lora"
    save_lora(lora, str(folder), merged=False, tokenizer=tok, base_model=tiny_checkpoint, repo_id=name)
    x = ids(N)
    want = logits(hf_posenc.from_pretrained(str(folder)), x)
    card = (folder / "README.md").read_text()
    blocks = _code_blocks(card, "python")
    for code in blocks:  # the merge writes NAME-merged beside the folder
        scope: dict = {}
        exec(code.replace(name, str(folder)), scope)
        assert gap(logits(scope["model"].eval(), x), want) <= 1e-5, code
    assert len(blocks) == 3 and "merged=True" in blocks[2]
    assert hf_posenc.get_config(hf_posenc.from_pretrained(f"{folder}-merged")).method == "yarn"
    shell = "\n".join(_code_blocks(card, "bash"))
    assert "vllm serve" in shell and shell.count(name) == shell.count(f"{name}-merged")  # the merged checkpoint only
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(folder / "base")
    assert gap(logits(AutoPeftModelForCausalLM.from_pretrained(str(folder)).eval(), x), want) <= 1e-5
