"""``hf-posenc eval passkey``: passkey retrieval accuracy per length and depth, methods side by side."""

from __future__ import annotations

import os
import time
from typing import Any

from ..files import check_output_folder
from ..runtime import load_model_and_tokenizer, seed_everything
from .common import for_each_method, method_configs, shared_setup
from .passkey import check_needle, FILLER, NEEDLE, PasskeyBuilder, evaluate_passkey
from .report import finish_report, markdown_table, plot_heatmap, plot_lines


def run_passkey(*, model: str, methods: list[str], factor: float | None, method_params: dict[str, dict[str, Any]],
                lengths: list[int], depths: list[float], trials: int = 5, digits: int = 5,
                scoring: str = "teacher_forced", batch_size: int = 1, filler: str = FILLER, needle: str = NEEDLE,
                seed: int = 0,
                dtype: str = "float32", device: str = "cpu", attn_implementation: str | None = None,
                output: str | None = None, progress: bool = True, plots: bool = True,
                command: str | None = None, loaded: tuple | None = None,
                tokenizer: str | None = None) -> dict[str, Any]:
    configs = method_configs(methods, factor, method_params)
    if output:
        check_output_folder(output)  # an unwritable --output is found before the compute, not after
    if any(not 0 <= d <= 1 for d in depths):
        raise ValueError(f"--depths must lie in [0, 1], got {depths}")
    check_needle(needle)
    seed_everything(seed)
    # ``loaded``: (model, tokenizer, source) already in memory (``hf-posenc patch --eval`` reuses its model)
    lm, tok, src = loaded or load_model_and_tokenizer(model, dtype, device, attn_implementation, tokenizer)
    builder = PasskeyBuilder(tok, filler=filler, needle=needle)
    started = time.time()
    results = for_each_method(lm, configs, lambda cfg: evaluate_passkey(
        lm, tok, lengths, depths, trials, seed, digits, scoring, builder, progress, desc=cfg.method,
        batch_size=batch_size))
    setup = {
        **shared_setup(model, src, lm, configs, seed, dtype, device, attn_implementation, command, started),
        "lengths": lengths, "depths": depths, "trials": trials, "digits": digits, "scoring": scoring,
        "batch_size": batch_size,
        "filler": filler, "needle": needle,
    }
    return finish_report("passkey", setup, results, passkey_table, output, passkey_plots if plots else None)


def passkey_table(report: dict[str, Any]) -> str:
    s = report["setup"]
    rows = [[m, *(r["by_length"][str(n)] for n in s["lengths"]), r["accuracy"]] for m, r in report["results"].items()]
    note = (f"Passkey accuracy ({s['scoring']}, {s['trials']} trials x {len(s['depths'])} depths per length), "
            f"model {s['model']} (original context {s['original_context']}).")
    return note + "\n\n" + markdown_table(["method", *(f"{n} tokens" for n in s["lengths"]), "overall"], rows)


def passkey_plots(report: dict[str, Any], output: str) -> list[str]:
    s, paths = report["setup"], []
    for m, r in report["results"].items():
        matrix = [[r["cells"][f"{n}@{d}"]["accuracy"] for n in s["lengths"]] for d in s["depths"]]
        paths.append(plot_heatmap(matrix, [f"{d:g}" for d in s["depths"]], [str(n) for n in s["lengths"]],
                                  f"Passkey accuracy: {m}", os.path.join(output, f"passkey_heatmap_{m}.png")))
    series = {m: (s["lengths"], [r["by_length"][str(n)] for n in s["lengths"]]) for m, r in report["results"].items()}
    paths.append(plot_lines(series, "Passkey accuracy vs length", "context length (tokens)", "accuracy",
                            os.path.join(output, "passkey_vs_length.png"), vline=s["original_context"]))
    return paths
