"""Helpers the tests import (``from helpers import ...``): tiny random decoders of each tested family built with
``from_config``, token ids, logits, written-out references, the shared books and the CLI's refusals. Fixtures are in
conftest.py."""

from __future__ import annotations

import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hf_posenc.adapters.cache_argument import returned_cache, with_cache

# the shared books beside the checkout (HF_POSENC_TEST_BOOKS: elsewhere, e.g. a missing folder to run as a fresh clone)
BOOKS = (os.environ.get("HF_POSENC_TEST_BOOKS")
         or os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "books"))
ORIGINAL = 64  # max_position_embeddings of the tiny models
THETA = 50_000.0  # deliberately not 10000: the code must read it from the config

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def tiny_config(family: str, **overrides):
    kw = dict(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=ORIGINAL,
        rope_parameters={"rope_type": "default", "rope_theta": THETA}, tie_word_embeddings=False,
    )
    if family == "qwen3":
        kw["head_dim"] = 16
    if family == "mistral":
        kw["sliding_window"] = None
    kw.update(overrides)
    cfg = AutoConfig.for_model(family, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def tiny_model(family: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), dtype=torch.float32)
    return model.eval()


def clone_with_config(model, rope_parameters: dict, max_position_embeddings: int):
    """An independent reference: the same weights, built by transformers from native rope_parameters."""
    cfg = tiny_config(model.config.model_type, rope_parameters=rope_parameters,
                      max_position_embeddings=max_position_embeddings)
    ref = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ref.load_state_dict(model.state_dict())
    return ref


def ids(n: int, seed: int = 1, batch: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 96, (batch, n), generator=g)


@torch.no_grad()
def logits(model, input_ids):
    return model(input_ids).logits.float()


STAND_INS = {"pg84.txt": 0, "pg1342.txt": 1, "pg1513.txt": 2}  # a python-docs document for each book


def on_loaded(task, model, tokenizer, methods=("none",), **keywords) -> dict:
    """An eval task's report (``task``: run_perplexity, run_passkey, ...) on a model in memory, as it is for
    ``none`` (the runner patches it for each other method and restores it), without an output folder."""
    from hf_posenc.checkpoints.models import ModelSource

    source = ModelSource("in-memory", {}, "in-memory")
    return task(model="in-memory", loaded=(model, tokenizer, source), methods=list(methods), progress=False,
                plots=False, **keywords)


def book_path(name: str = "pg84.txt") -> str:
    """A shared book beside the checkout, else (a fresh clone) a document of the built-in python-docs corpus
    written once to a file of the same name: the book-based tests run either way."""
    path = os.path.abspath(os.path.join(BOOKS, name))
    if os.path.exists(path):
        return path
    import tempfile

    from hf_posenc.io.documents import builtin_corpus

    folder = os.path.join(tempfile.gettempdir(), f"hf_posenc-stand-ins-{os.getuid()}")
    stand_in = os.path.join(folder, name)
    if not os.path.exists(stand_in):
        os.makedirs(folder, exist_ok=True)
        from hf_posenc.io.files import atomic_write_text

        atomic_write_text(stand_in, builtin_corpus()[STAND_INS[name]].text)
    return stand_in


def load_real(alias: str, **kwargs):
    """A real installed model (``hf_posenc.checkpoints.models`` alias) in fp32, eval mode, with its own tokenizer."""
    from transformers import AutoTokenizer

    import hf_posenc
    from hf_posenc.checkpoints.models import resolve_source

    model = hf_posenc.from_pretrained(alias, dtype=torch.float32, **kwargs).eval()
    src = resolve_source(alias)
    return model, AutoTokenizer.from_pretrained(src.path, **src.kwargs)


def book_tokens(tok, name: str, n: int, start: int = 0):
    """The first ``n`` tokens of a shared book from character ``start`` on (a [1, n] tensor)."""
    text = open(book_path(name), encoding="utf-8").read()
    ids = tok(text[start : start + 40 * n], return_tensors="pt").input_ids[:, :n]
    assert ids.shape[1] == n, f"{name} gave {ids.shape[1]} tokens, {n} asked"
    return ids


@torch.no_grad()
def written_out_decoder(model, input_ids, scores, embeds_add=None, allowed=None):
    """Logits of a LLaMA-style decoder written out here, independent of transformers' attention code:
    ``scores(q, k, head_dim)`` gives the attention scores from the raw (unrotated) queries and keys
    ``[b, heads, t, d]`` (grouped heads repeated); causal, and ``allowed`` ``[b, 1, 1, t]`` masks keys."""
    cfg, body = model.config, model.model
    h = body.embed_tokens(input_ids).float()
    if embeds_add is not None:
        h = h + embeds_add
    b, t, _ = h.shape
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh
    pos = torch.arange(t)
    keep = (pos[None, :] <= pos[:, None])[None, None]
    if allowed is not None:
        keep = keep & allowed
    for layer in body.layers:
        a = layer.self_attn
        x = layer.input_layernorm(h)
        q, k, v = (proj(x).view(b, t, -1, hd) for proj in (a.q_proj, a.k_proj, a.v_proj))
        if hasattr(a, "q_norm"):
            q, k = a.q_norm(q), a.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        p = torch.softmax(scores(q, k, hd).masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
        h = h + a.o_proj((p @ v).transpose(1, 2).reshape(b, t, nh * hd))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(body.norm(h))


@torch.no_grad()
def cached_last_logits(model, input_ids, prompt: int):
    """Last-position logits of a prefill of ``prompt`` tokens, then of each later token fed alone with the KV
    cache: ``[batch, steps, vocab]``, to compare with the full forward's ``[:, prompt - 1 : -1]``."""
    out = model(input_ids[:, :prompt], use_cache=True)
    steps, cache = [out.logits[:, -1]], returned_cache(out)
    for i in range(prompt, input_ids.shape[1] - 1):
        out = model(input_ids[:, i : i + 1], **with_cache(model, cache), use_cache=True)
        cache = returned_cache(out)
        steps.append(out.logits[:, -1])
    return torch.stack(steps, 1).float()


@torch.no_grad()
def greedy(model, prompt, n=12, mask=None):
    """``generate`` greedy with the KV cache for exactly ``n`` tokens: (sequences, logits ``[batch, n, vocab]``)."""
    mask = torch.ones_like(prompt) if mask is None else mask
    out = model.generate(prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         use_cache=True, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences, torch.stack(out.logits, 1).float()


def only_names_a_fresh_folder_is_checked_for(out) -> None:
    """Every file a run wrote in ``out`` (but its cells file) is one a run refuses to replace in a folder it never
    wrote into (:func:`hf_posenc.eval.common.check_reports_are_ours`)."""
    from hf_posenc.eval.common import written_by_a_run

    assert [n for n in sorted(os.listdir(out)) if not written_by_a_run(n)] == ["cells.jsonl"]


def refused(argv, capsys) -> str:
    """Run the CLI; it must exit with status 2 and one error line, no traceback. Returns stderr."""
    from hf_posenc.cli import main

    try:
        rc = main(argv)
    except SystemExit as stop:  # argparse's own refusal
        rc = stop.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    return err


def all_text(folder) -> str:
    """Every file below ``folder``, as text."""
    out = []
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                out.append(fh.read().decode("utf-8", "replace"))
    return "\n".join(out)



SMALL_WINDOW_KNOBS = {  # windows small enough that 59-90 tokens cross every boundary of the tiny models
    "self_extend": {"group_size": 4, "window": 16},
    "dca": {"chunk_size": 48, "local_window": 4},
    "string": {"shifted_offset": 21, "local_window": 5},
    "rerope": {"window": 24},
    "leaky_rerope": {"window": 16, "leak": 3.0},
    "alibi": {},
    "nope": {},
    "learned": {"factor": 2.0},
    "sinusoidal": {"factor": 2.0},
    "yarn": {"factor": 2.0},
    "longrope": {"factor": 2.0},
    "llama3": {"factor": 2.0},
    "pi": {"factor": 2.0},
}


def run_launched(prefix: list[str], argv: list[str], cwd, timeout: int = 600):
    """``prefix + argv`` run in ``cwd`` as a fresh launch (no RANK / WORLD_SIZE / LOCAL_RANK / MASTER_PORT inherited
    from a launcher around the tests); it must exit 0 (else its stderr's tail is the failure). Returns the result."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    done = subprocess.run([*prefix, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done
