"""Publishing: save with a model card, `hf-posenc patch`, and upload/download against a loopback Hub (a misbehaving
one too)."""

import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch
from helpers import all_text, book_path, ids, logits, tiny_model
from hub_server import HubServer
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.publishing.card import BaseModel, build_model_card, describe_base, template_path
from hf_posenc.publishing.hub import save_pretrained

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "hf_testSECRETtoken0123456789"


def test_card_metadata_parses_back_and_the_checkpoint_reloads(tmp_path, bert_tokenizer):
    model = tiny_model("llama", vocab_size=bert_tokenizer.vocab_size)
    hf_posenc.patch(model, "yarn", factor=4.0, beta_fast=16)
    report = {"task": "perplexity", "table": "| method | 64 tokens |\n|---|---|\n| yarn | 11.00 |",
              "setup": {"lengths": [64, 128], "documents": ["a.txt"], "command": "hf-posenc eval ppl ..."},
              "results": {"none": {"64": {"ppl": 10.0}, "128": {"ppl": 30.0}},
                          "yarn": {"64": {"ppl": 11.0}, "128": {"ppl": 12.5}}}}
    base = BaseModel("org/base-model", "apache-2.0")
    card = build_model_card(model, repo_id="me/tiny-yarn", base=base, eval_reports=[report], command="make it")
    save_pretrained(model, tmp_path, bert_tokenizer, eval_results=[report], base_model=base, repo_id="me/tiny-yarn",
                    command="make it")
    loaded = ModelCard.load(tmp_path / "README.md")
    assert loaded.data.to_dict() == card.data.to_dict()
    meta = loaded.data.to_dict()
    assert meta["base_model"] == "org/base-model" and meta["library_name"] == "transformers"
    assert meta["license"] == "apache-2.0" and {"hf_posenc", "yarn", "long-context"} <= set(meta["tags"])
    metrics = meta["model-index"][0]["results"][0]["metrics"]
    assert [(m["name"], m["value"]) for m in metrics] == [("perplexity @ 64 tokens", 11.0),
                                                          ("perplexity @ 128 tokens", 12.5)]
    text = loaded.text
    for needed in ("`beta_fast` | 16", "original context (tokens) | 64", "new `max_position_embeddings` | 256",
                   "LlamaForCausalLM.from_pretrained(\"me/tiny-yarn\")", "make it", "| yarn | 11.00 |"):
        assert needed in text, needed
    assert (json.loads((tmp_path / "hf_posenc_eval" / "perplexity.json").read_text())["results"]["yarn"]["64"]["ppl"]
            == 11.0)
    back = hf_posenc.from_pretrained(str(tmp_path), attn_implementation="eager")  # as the tiny model
    x = ids(150)
    assert torch.equal(logits(back, x), logits(model, x))
    assert (tmp_path / "tokenizer.json").exists() or (tmp_path / "vocab.txt").exists()


def test_card_of_a_non_native_method_says_to_load_with_hf_posenc(tmp_path):
    model = hf_posenc.patch(tiny_model("qwen2"), "dynamic_yarn", factor=2.0)
    text = build_model_card(model, repo_id="me/q").text
    assert 'hf_posenc.from_pretrained("me/q")' in text and "Plain transformers would load the original" in text
    assert "None was run" in text
    with pytest.raises(ValueError, match="not patched by hf_posenc"):
        build_model_card(tiny_model("qwen2"))


def test_base_model_facts_from_the_local_checkpoints():
    smol = describe_base("smollm2-135m")
    assert smol.repo_id == "HuggingFaceTB/SmolLM2-135M-Instruct" and smol.license == "apache-2.0"  # GGUF metadata
    minilm = describe_base("all-minilm-l6-v2")
    assert minilm.repo_id == "sentence-transformers/all-MiniLM-L6-v2" and minilm.license == "apache-2.0"  # README


def test_cli_patch_evaluates_and_writes_the_card(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "patched"
    rc = main(["patch", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--method-param",
               "beta_fast=16", "--output", str(out), "--eval", "ppl,passkey", "--text-file", book_path("pg1513.txt"),
               "--ppl-lengths", "64,128", "--passkey-lengths", "100", "--trials", "1", "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| yarn |" in printed and "saved:" in printed
    ppl = json.loads((out / "hf_posenc_eval" / "perplexity.json").read_text())
    pk = json.loads((out / "hf_posenc_eval" / "passkey.json").read_text())
    baseline = ppl["setup"]["truncated_baseline"]["label"]  # 128 is past the original 64: the truncated baseline
    assert (set(ppl["results"]) == {"none", "yarn", baseline}
            and ppl["setup"]["variants"]["yarn"]["params"]["beta_fast"] == 16)
    assert "context_gain" in ppl["results"]["yarn"]["128"] and "| 128: past L |" in (out / "README.md").read_text()
    card = ModelCard.load(out / "README.md")
    metrics = {m["name"]: m["value"] for r in card.data.to_dict()["model-index"][0]["results"] for m in r["metrics"]}
    assert metrics["perplexity @ 128 tokens"] == round(ppl["results"]["yarn"]["128"]["ppl"], 4)
    assert metrics["passkey accuracy @ 100 tokens"] == pk["results"]["yarn"]["by_length"]["100"]
    assert "hf-posenc patch --model" in card.text and "--eval ppl,passkey" in card.text
    # the saved folder evaluated as it is (reloaded patched) gives the same number as the patched run did
    again = hf_posenc.from_pretrained(str(out))
    assert hf_posenc.get_config(again).params["beta_fast"] == 16
    assert again.config.max_position_embeddings == 128


def test_cli_patch_errors(tiny_checkpoint, tmp_path, capsys):
    assert main(["patch", "--model", tiny_checkpoint, "--method", "yran", "--factor", "2", "--output",
                 str(tmp_path)]) == 2
    assert "Did you mean 'yarn'" in capsys.readouterr().err
    assert main(["patch", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--eval", "bleu",
                 "--output", str(tmp_path)]) == 2
    assert ("--eval takes ppl, passkey, retrieval, harness:TASK (TASK: an lm-eval task"
            in (err := capsys.readouterr().err))
    assert "got 'bleu'" in err


def _run_cli(args, hub_url, home):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=hub_url, HF_TOKEN=TOKEN, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "hf_posenc.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.fixture
def hub_download(monkeypatch, tmp_path):
    """Point huggingface_hub (already imported in this process) at a loopback server for downloads."""
    from huggingface_hub import constants

    def use(url):
        monkeypatch.setattr(constants, "ENDPOINT", url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    return use


def test_push_to_hub_end_to_end_on_a_loopback_hub(tiny_checkpoint, tmp_path, hub_download):
    with HubServer(TOKEN) as hub:
        out = tmp_path / "saved"
        res = _run_cli(["patch", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--output", str(out),
                        "--push-to-hub", "me/tiny-yarn", "--revision", "v1", "--private", "--no-progress"],
                       hub.url, tmp_path / "home")
        assert res.returncode == 0, res.stderr[-3000:]
        assert "uploaded: " + hub.url + "/me/tiny-yarn/commit/" in res.stdout
        repo = hub.state.repos["me/tiny-yarn"]
        assert repo.private and set(repo.branches) == {"main", "v1"}
        files = repo.commits[repo.branches["v1"]]
        assert {"config.json", "model.safetensors", "README.md"} <= set(files)
        assert repo.commits[repo.branches["main"]] == {}  # the commit went to the branch asked for
        # every write carried the token; it appears nowhere in the output, the saved folder or the card
        writes = [h for m, _, h in hub.state.requests if m == "POST"]
        assert writes and all(h.get("authorization") == f"Bearer {TOKEN}" for h in writes)
        assert TOKEN not in res.stdout + res.stderr and TOKEN not in all_text(out)
        assert TOKEN.encode() not in b"".join(files.values())

        hub_download(hub.url)
        local = hf_posenc.from_pretrained(str(out))
        remote = hf_posenc.from_pretrained("me/tiny-yarn", revision="v1", token=TOKEN)
        plain = AutoModelForCausalLM.from_pretrained("me/tiny-yarn", revision="v1", token=TOKEN)  # native: yarn
        x = ids(120)
        assert torch.equal(logits(remote, x), logits(local, x)) and torch.equal(logits(plain, x), logits(local, x))
        assert hf_posenc.get_config(remote).method == "yarn"


def test_a_failed_upload_keeps_the_save_and_says_what_to_rerun(tiny_checkpoint, tmp_path):
    with HubServer(TOKEN) as hub:
        hub.state.fail_commits = 10  # more than huggingface_hub's retries
        out = tmp_path / "saved"
        res = _run_cli(["patch", "--model", tiny_checkpoint, "--method", "pi", "--factor", "2", "--output", str(out),
                        "--push-to-hub", "me/tiny-pi", "--no-progress"], hub.url, tmp_path / "home")
        assert res.returncode == 1
        assert f"The local save in {out} is complete; rerun: hf-posenc upload {out} me/tiny-pi" in res.stderr
        assert TOKEN not in res.stdout + res.stderr
        assert (out / "config.json").exists() and (out / "README.md").exists() and (out / "model.safetensors").exists()
        hub.state.fail_commits = 0
        again = _run_cli(["upload", str(out), "me/tiny-pi"], hub.url, tmp_path / "home")
        assert again.returncode == 0, again.stderr[-2000:]
        repo = hub.state.repos["me/tiny-pi"]
        assert repo.commits[repo.branches["main"]]["config.json"] == (out / "config.json").read_bytes()


def test_a_wrong_token_is_a_clear_error_without_the_token(tiny_checkpoint, tmp_path):
    with HubServer("hf_the_right_one") as hub:
        out = tmp_path / "saved"
        res = _run_cli(["patch", "--model", tiny_checkpoint, "--method", "pi", "--factor", "2", "--output", str(out),
                        "--push-to-hub", "me/x", "--no-progress"], hub.url, tmp_path / "home")
        assert res.returncode == 1 and "upload of" in res.stderr and "401" in res.stderr
        assert TOKEN not in res.stderr and (out / "model.safetensors").exists()


def test_the_card_template_ships_in_the_wheel(tmp_path):
    assert template_path().endswith(os.path.join("model_cards", "model_card.md"))
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ROOT,
                          "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    wheel = next(p for p in os.listdir(tmp_path) if p.endswith(".whl"))
    names = zipfile.ZipFile(tmp_path / wheel).namelist()
    assert "hf_posenc/model_cards/model_card.md" in names and "hf_posenc/adapters/rope_decoder.py" in names


def test_push_to_hub_from_python(tmp_path, bert_tokenizer):
    model = hf_posenc.patch(tiny_model("mistral", vocab_size=bert_tokenizer.vocab_size), "ntk", factor=2.0)
    with HubServer(TOKEN) as hub:
        url = hf_posenc.push_to_hub(model, "me/tiny-ntk", bert_tokenizer, endpoint=hub.url, token=TOKEN,
                                    local_dir=str(tmp_path / "kept"), commit_message="first", base_model="org/m")
        assert url.startswith(hub.url + "/me/tiny-ntk/commit/")
        files = hub.state.repos["me/tiny-ntk"].commits[hub.state.repos["me/tiny-ntk"].branches["main"]]
        assert files["README.md"] == (tmp_path / "kept" / "README.md").read_bytes()
        assert "base_model: org/m" in files["README.md"].decode() and "tokenizer_config.json" in files
        assert TOKEN not in all_text(tmp_path / "kept")


def test_cards_of_encoder_patches(tmp_path):
    from test_encoders import tiny_encoder, tiny_t5

    bert = hf_posenc.patch(tiny_encoder("bert"), "hierarchical", factor=2.0)
    card = build_model_card(bert, repo_id="me/bert-h")
    assert card.data.pipeline_tag == "feature-extraction" and "BertModel.from_pretrained(\"me/bert-h\")" in card.text
    t5 = hf_posenc.patch(tiny_t5(), "bucket_scale", factor=2.0)
    card = build_model_card(t5, repo_id="me/t5-b")
    assert card.data.pipeline_tag == "text2text-generation" and 'hf_posenc.from_pretrained("me/t5-b")' in card.text


def test_cli_patch_of_an_encoder_with_retrieval(tmp_path, bert_tokenizer):
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.for_model(
        "bert", vocab_size=bert_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64)).save_pretrained(tmp_path / "bert")
    bert_tokenizer.save_pretrained(tmp_path / "bert")
    out = tmp_path / "patched"
    assert main(["patch", "--model", str(tmp_path / "bert"), "--method", "hierarchical", "--factor", "2", "--output",
                 str(out), "--eval", "retrieval", "--text-file", book_path("pg84.txt"), "--trials", "2",
                 "--no-progress"]) == 0
    card = ModelCard.load(out / "README.md")
    metrics = {m["name"]: m["value"] for r in card.data.to_dict()["model-index"][0]["results"] for m in r["metrics"]}
    report = json.loads((out / "hf_posenc_eval" / "retrieval.json").read_text())
    assert set(metrics) == {"needle retrieval top-1 @ 64 tokens", "needle retrieval top-1 @ 128 tokens"}
    assert (metrics["needle retrieval top-1 @ 128 tokens"]
            == report["results"]["hierarchical"]["by_length"]["128"]["accuracy"])
    assert (card.data.pipeline_tag == "feature-extraction"
            and AutoModel.from_pretrained(out).config.max_position_embeddings == 128)


def test_an_interrupted_upload_says_what_to_rerun(tmp_path, monkeypatch, capsys):
    from huggingface_hub import HfApi

    from hf_posenc.publishing.hub import upload

    model = hf_posenc.patch(tiny_model("llama"), "pi", factor=2.0)
    save_pretrained(model, tmp_path / "saved", base_model=BaseModel("org/m"))

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(HfApi, "create_repo", interrupted)  # as if Ctrl-C arrived during the upload (test-only)
    with pytest.raises(KeyboardInterrupt):
        upload(str(tmp_path / "saved"), "me/m", revision="dev", endpoint="http://127.0.0.1:9", token=TOKEN)
    err = capsys.readouterr().err
    assert (f"the local save in {tmp_path / 'saved'} is complete. Rerun: hf-posenc upload {tmp_path / 'saved'} "
            "me/m --revision dev" in err)
    assert TOKEN not in err and (tmp_path / "saved" / "model.safetensors").exists()


def test_cli_patch_rejects_knobs_of_another_method(tiny_checkpoint, tmp_path, capsys):
    assert main(["patch", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--method-param",
                 "llama3.low_freq_factor=2", "--output", str(tmp_path)]) == 2
    assert "--method-param names ['llama3'], but --method is 'yarn'" in capsys.readouterr().err


def test_cli_patch_of_t5_needs_eval_lengths_and_retrieval_needs_an_encoder(tmp_path, tiny_checkpoint, bert_tokenizer,
                                                                          capsys):
    from transformers import AutoConfig, T5ForConditionalGeneration

    cfg = AutoConfig.for_model("t5", vocab_size=bert_tokenizer.vocab_size, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                               num_decoder_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    T5ForConditionalGeneration(cfg).save_pretrained(tmp_path / "t5")
    bert_tokenizer.save_pretrained(tmp_path / "t5")
    args = ["patch", "--model", str(tmp_path / "t5"), "--method", "bucket_scale", "--factor", "2", "--output",
            str(tmp_path / "out"), "--eval", "passkey", "--trials", "1", "--no-progress"]
    assert main(args) == 2
    assert "has no fixed context length to evaluate around; pass --passkey-lengths\n" in capsys.readouterr().err
    assert main(args + ["--passkey-lengths", "100"]) == 0
    assert json.loads((tmp_path / "out" / "hf_posenc_eval" / "passkey.json").read_text())["setup"]["lengths"] == [100]
    assert main(["patch", "--model", tiny_checkpoint, "--method", "yarn", "--factor", "2", "--output",
                 str(tmp_path / "x"), "--eval", "retrieval", "--no-progress"]) == 2
    assert ("retrieval evaluates sentence-embedding encoders (e.g. BertModel); LlamaForCausalLM is not one"
            in capsys.readouterr().err)


def test_saved_tokenizer_takes_the_extended_length(tmp_path, bert_tokenizer):
    from test_encoders import tiny_encoder
    from transformers import AutoTokenizer

    assert bert_tokenizer.model_max_length == 512
    bert = hf_posenc.patch(tiny_encoder("bert"), "interpolate", factor=16.0)  # 64 -> 1024 positions
    save_pretrained(bert, tmp_path / "b", bert_tokenizer, base_model=BaseModel("org/b"))
    assert AutoTokenizer.from_pretrained(tmp_path / "b").model_max_length == 1024
    assert bert_tokenizer.model_max_length == 512  # the caller's tokenizer is unchanged
    small = hf_posenc.patch(tiny_encoder("bert"), "interpolate", factor=2.0)  # 128 < 512: left as it was
    save_pretrained(small, tmp_path / "s", bert_tokenizer, base_model=BaseModel("org/b"))
    assert AutoTokenizer.from_pretrained(tmp_path / "s").model_max_length == 512


@pytest.mark.parametrize("method,kwargs,vllm", [
    ("yarn", {"factor": 2.0}, "| vLLM | same as hf_posenc | measured by hf-posenc serve-check on SmolLM2-135M at "
                              "4,096 and 12,288 tokens"),
    ("dynamic_ntk", {"factor": 2.0}, "| vLLM | same up to the original context; differs past it | measured by "
                                     "hf-posenc serve-check on SmolLM2-135M x2, vLLM 0.32 (CPU): same at 4,096 tokens, "
                                     "NaN log-probabilities at 12,288"),
    ("dca", {}, "| vLLM | the unpatched model, up to the original context; longer inputs refused | not computable"),
    ("alibi", {}, "| vLLM | the original positional encoding around weights meant for `alibi`: not this model |"),
])
def test_the_card_says_what_serving_engines_compute(method, kwargs, vllm):
    from hf_posenc.publishing.card import build_model_card

    model = tiny_model("llama")
    model.config._attn_implementation = "sdpa"
    hf_posenc.patch(model, method, **kwargs)
    card = build_model_card(model).content
    serving = card[card.index("## Serving"):]
    assert vllm in serving
    assert all(f"| {engine} |" in serving for engine in ("SGLang", "TGI", "llama.cpp"))
    if method == "yarn":
        assert "| SGLang | reads the `rope_parameters` transformers reads | not measured |" in serving
    if method == "dynamic_ntk":  # as its launch settings say (one base for every length)
        assert "| SGLang | cannot compute it | SGLang does not compute `dynamic_ntk` as hf_posenc does" in serving


# -- the Hub misbehaving -------------------------------------------------------------------------
HUB_TOKEN = "hf_faultTOKEN0123456789abcdef"


@pytest.fixture
def saved_folder(tmp_path):
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return str(folder)


@pytest.mark.parametrize("fault,detail", [
    ("hang", "no answer within 1 s"),
    ("drop", "Server disconnected without sending a response"),
    ("echo", "cannot parse request with Authorization: Bearer ***"),
])
def test_an_upload_to_a_faulty_hub_fails_clearly_and_says_what_to_rerun(fault, detail, saved_folder):
    from hub_server import HubServer

    from hf_posenc.publishing.hub import UploadError, upload

    with HubServer(HUB_TOKEN) as hub:
        hub.state.fault = fault
        with pytest.raises(UploadError) as err:
            upload(saved_folder, "me/x", token=HUB_TOKEN, endpoint=hub.url, timeout=1)
    message = str(err.value)
    assert detail in message and f"rerun: hf-posenc upload {saved_folder} me/x" in message
    assert HUB_TOKEN not in message


def _cli_env(hub_url: str, home) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env.update(HF_ENDPOINT=hub_url, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=os.pathsep.join([root, env.get("PYTHONPATH", "")]))
    return env


def test_the_stored_login_echoed_by_the_server_never_reaches_the_terminal(saved_folder, tmp_path):
    import subprocess

    from hub_server import HubServer

    home = tmp_path / "home"
    home.mkdir()
    (home / "token").write_text(HUB_TOKEN)  # what 'hf auth login' stores; no HF_TOKEN in the environment
    with HubServer(HUB_TOKEN) as hub:
        hub.state.fault = "echo"
        res = subprocess.run([sys.executable, "-m", "hf_posenc.cli", "upload", saved_folder, "me/x"],
                             capture_output=True, text=True, env=_cli_env(hub.url, home), timeout=120)
        sent = [h.get("authorization") for _, _, h in hub.state.requests]
    assert sent and sent[0] == f"Bearer {HUB_TOKEN}"  # the stored login was used...
    assert res.returncode == 1 and "Authorization: Bearer ***" in res.stderr  # ...and never shown
    assert HUB_TOKEN not in res.stdout + res.stderr and "Traceback" not in res.stderr


def test_sigterm_during_a_hung_upload_prints_the_rerun_command(saved_folder, tmp_path):
    import signal
    import subprocess
    import time

    from hub_server import HubServer

    with HubServer(HUB_TOKEN) as hub:
        hub.state.fault = "hang"
        env = {**_cli_env(hub.url, tmp_path / "home"), "HF_TOKEN": HUB_TOKEN}
        proc = subprocess.Popen([sys.executable, "-m", "hf_posenc.cli", "upload", saved_folder, "me/x", "--timeout",
                                 "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.time() + 120
        while not hub.state.requests and time.time() < deadline:  # wait until the upload is under way
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert hub.state.requests and proc.returncode == 143
    assert f"upload interrupted; the local save in {saved_folder} is complete. Rerun: hf-posenc upload " \
           f"{saved_folder} me/x" in err
    assert "Traceback" not in err and HUB_TOKEN not in out + err
