"""``hf-posenc eval ppl``: compare methods by long-context perplexity, side by side on shared data."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from . import data as D
from ..files import check_output_folder
from ..runtime import load_model_and_tokenizer, seed_everything
from .common import for_each_method, method_configs, shared_setup
from .perplexity import evaluate_perplexity
from .report import finish_report, markdown_table, plot_lines


def gather_documents(text_file=None, text_dir=None, dataset=None, dataset_config=None, split="test",
                     column="text", limit=None, corpus=None, encoding="utf-8") -> list[D.Document]:
    """The documents asked for (files and folders read as ``encoding``, a dataset, a built-in corpus), else
    the default corpus."""
    docs: list[D.Document] = []
    if corpus:
        docs.extend(D.builtin_corpus(corpus))
    for path in text_file or []:
        docs.append(D.read_text_file(path, encoding))
    for path in text_dir or []:
        docs.extend(D.read_text_dir(path, encoding))
    if dataset:
        docs.extend(D.read_dataset(dataset, dataset_config, split, column, limit))
    if not docs:
        docs = D.default_corpus()
    return docs[:limit] if limit else docs


def tokenize_documents(tok, docs: list[D.Document], max_tokens: int | None = None) -> list[torch.Tensor]:
    """Token ids of each document, once for every method and length (cut to ``max_tokens`` when given)."""
    out = []
    for d in docs:
        text = d.text if max_tokens is None else d.text[: max_tokens * 12]  # ~12 chars bound a token from above
        ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        out.append(torch.tensor(ids[:max_tokens] if max_tokens else ids, dtype=torch.long))
    return out


def run_perplexity(*, model: str, methods: list[str], factor: float | None, method_params: dict[str, dict[str, Any]],
                   lengths: list[int], docs: list[D.Document], mode: str = "windows", stride: int | None = None,
                   max_windows: int | None = None, buckets: int = 32, chunk_size: int = 1024, seed: int = 0,
                   dtype: str = "float32", device: str = "cpu", attn_implementation: str | None = None,
                   output: str | None = None, progress: bool = True, plots: bool = True,
                command: str | None = None, loaded: tuple | None = None,
                tokenizer: str | None = None) -> dict[str, Any]:
    configs = method_configs(methods, factor, method_params)  # validate before the slow load
    if output:
        check_output_folder(output)  # an unwritable --output is found before the compute, not after
    if not lengths or any(n < 2 for n in lengths):
        raise ValueError(f"--lengths must be token counts >= 2, got {lengths}")
    if stride is not None and mode != "sliding":
        raise ValueError(f"--stride {stride} applies to --mode sliding; windows mode scores non-overlapping windows "
                         "(drop --stride, or add --mode sliding)")
    seed_everything(seed)
    # ``loaded``: (model, tokenizer, source) already in memory (``hf-posenc patch --eval`` reuses its model)
    lm, tok, src = loaded or load_model_and_tokenizer(model, dtype, device, attn_implementation, tokenizer)
    need = None
    if max_windows and mode == "windows":
        need = max(lengths) * max_windows
    elif max_windows:
        need = max(lengths) + (stride or max(lengths)) * max_windows
    token_docs = tokenize_documents(tok, docs, need)
    started = time.time()
    results = for_each_method(lm, configs, lambda cfg: evaluate_perplexity(
        lm, token_docs, lengths, [d.name for d in docs], mode, stride, max_windows, buckets, chunk_size,
        progress, desc=cfg.method))
    setup = {
        **shared_setup(model, src, lm, configs, seed, dtype, device, attn_implementation, command, started),
        "lengths": lengths, "mode": mode, "stride": stride, "max_windows": max_windows,
        "documents": [d.name for d in docs], "document_tokens": [len(t) for t in token_docs],
    }
    return finish_report("perplexity", setup, results, ppl_table, output, ppl_plots if plots else None)


def ppl_table(report: dict[str, Any]) -> str:
    lengths = report["setup"]["lengths"]
    rows = []
    for method, per_len in report["results"].items():
        row: list[Any] = [method]
        for n in lengths:
            r = per_len[str(n)]
            ci = r["ci95"]
            row.append(f"{r['ppl']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""))
        rows.append(row)
    note = (f"Perplexity (token-weighted; [95% interval of the per-document mean] with >= 2 documents), "
            f"{report['setup']['mode']} mode, model {report['setup']['model']} "
            f"(original context {report['setup']['original_context']}).")
    return note + "\n\n" + markdown_table(["method"] + [f"{n} tokens" for n in lengths], rows)


def ppl_plots(report: dict[str, Any], output: str) -> list[str]:
    setup, paths = report["setup"], []
    lengths = setup["lengths"]
    series = {m: (lengths, [r[str(n)]["ppl"] for n in lengths]) for m, r in report["results"].items()}
    paths.append(plot_lines(series, f"Perplexity vs context length ({setup['model']})", "context length (tokens)",
                            "perplexity", os.path.join(output, "ppl_vs_length.png"), logy=True,
                            vline=setup["original_context"]))
    for n in lengths:
        curves = {}
        for m, r in report["results"].items():
            pts = r[str(n)]["curve"]
            curves[m] = ([(p["from"] + p["to"]) / 2 for p in pts], [p["nll"] for p in pts])
        vline = setup["original_context"] if setup["original_context"] < n else None
        paths.append(plot_lines(curves, f"Loss by position, {n}-token windows", "position in window",
                                "mean NLL (nats)", os.path.join(output, f"loss_by_position_{n}.png"), vline=vline))
    return paths
