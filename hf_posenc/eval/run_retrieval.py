"""``hf-posenc eval retrieval``: long-document needle retrieval with sentence embeddings, methods side by side."""

from __future__ import annotations

import os
import time
from typing import Any

from . import data as D
from ..files import check_output_folder
from ..runtime import load_model_and_tokenizer, seed_everything
from .common import for_each_method, method_configs, shared_setup
from .report import finish_report, markdown_table, plot_lines
from .retrieval import evaluate_retrieval


def corpus_stream(tok, docs: list[D.Document], max_tokens: int = 300_000) -> list[int]:
    """The documents' tokens, joined (at most ``max_tokens``): the filler the needle documents are cut from."""
    stream: list[int] = []
    for d in docs:
        stream += tok(d.text[: max_tokens * 8], add_special_tokens=False, verbose=False)["input_ids"]
        if len(stream) >= max_tokens:
            break
    return stream[:max_tokens]


def run_retrieval(*, model: str, methods: list, factor: float | None, method_params: dict[str, dict[str, Any]],
                  lengths: list[int], docs: list[D.Document], depths: list[float], trials: int = 10,
                  candidates: int = 5, filler: str = "same", seed: int = 0, dtype: str = "float32", device: str = "cpu",
                  attn_implementation: str | None = None, output: str | None = None, progress: bool = True,
                  plots: bool = True, command: str | None = None, loaded: tuple | None = None,
                tokenizer: str | None = None) -> dict[str, Any]:
    configs = method_configs(methods, factor, method_params)
    if output:
        check_output_folder(output)  # an unwritable --output is found before the compute, not after
    seed_everything(seed)
    lm, tok, src = loaded or load_model_and_tokenizer(model, dtype, device, attn_implementation, tokenizer)
    if lm.get_output_embeddings() is not None:  # an LM head: not an encoder giving token states to pool
        raise ValueError(f"retrieval evaluates sentence-embedding encoders (e.g. BertModel); {type(lm).__name__} "
                         "is not one (use 'eval ppl' or 'eval passkey' for language models).")
    stream = corpus_stream(tok, docs)
    started = time.time()
    results = for_each_method(lm, configs, lambda cfg: evaluate_retrieval(
        lm, tok, stream, lengths, depths, trials, candidates, seed, progress, desc=cfg.method,
        filler=filler))
    setup = {
        **shared_setup(model, src, lm, configs, seed, dtype, device, attn_implementation, command, started),
        "lengths": lengths, "depths": depths, "trials": trials, "candidates": candidates, "filler": filler,
        "documents": [d.name for d in docs], "corpus_tokens": len(stream),
    }
    return finish_report("retrieval", setup, results, retrieval_table, output, retrieval_plots if plots else None)


def retrieval_table(report: dict[str, Any]) -> str:
    s = report["setup"]
    rows = []
    for m, r in report["results"].items():
        rows.append([m, r["positions"], *(r["by_length"][str(n)]["accuracy"] for n in s["lengths"]),
                     *(r["by_length"][str(n)]["mrr"] for n in s["lengths"])])
    note = (f"Needle retrieval, top-1 accuracy then MRR ({s['candidates']} candidate documents, {s['trials']} trials x "
            f"{len(s['depths'])} depths per length), model {s['model']}; 'positions': tokens the model reads (longer "
            "documents are truncated).")
    header = ["method", "positions", *(f"acc@{n}" for n in s["lengths"]), *(f"mrr@{n}" for n in s["lengths"])]
    return note + "\n\n" + markdown_table(header, rows)


def retrieval_plots(report: dict[str, Any], output: str) -> list[str]:
    s = report["setup"]
    series = {m: (s["lengths"], [r["by_length"][str(n)]["accuracy"] for n in s["lengths"]])
              for m, r in report["results"].items()}
    return [plot_lines(series, "Needle retrieval: top-1 accuracy vs document length", "document length (tokens)",
                       "top-1 accuracy", os.path.join(output, "retrieval_vs_length.png"),
                       vline=s["original_context"])]
