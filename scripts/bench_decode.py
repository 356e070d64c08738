"""Decoding speed of the attention-level methods (Self-Extend, DCA, STRING, ReRoPE, leaky ReRoPE) against the
unpatched model's SDPA, with a KV cache of each prompt length.

SmolLM2-135M (original context L = 8,192) is prefilled once per prompt length, unpatched (a book's tokens, random
tokens when the book is absent); from a copy of that cache every method decodes the same number of greedy steps,
the methods interleaved round by round, and the median seconds per decoded token is compared with the unpatched
model's (ratio = its tokens/s over the unpatched model's: > 0.8 is the target). The cache of the unpatched prefill
serves every method: the numbers are speed only (which keys a cache holds does not change the cost). Memory: the
methods keep, per key map, float32 cos and sin tables for the positions seen so far (grown by doubling), shared by
all layers, and on the KV cache object the rotated keys of earlier steps; both sizes are reported. With --write the
section replaces this script's section of BENCHMARKS.md.

    python scripts/bench_decode.py --write
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import shlex
import statistics
import sys

from _bench import ROOT, comma_list, greedy_decode, prompt_ids

TITLE = "## Decoding with the attention-level methods: tokens/s vs the unpatched model"
METHODS = ["self_extend", "dca", "string", "rerope", "leaky_rerope"]


def table_bytes(model) -> int:
    """The bytes of the rotation tables the patched model holds now."""
    from hf_posenc.adapters.remapped_attention import STATE_ATTR

    state = next(m.__dict__[STATE_ATTR] for m in model.modules() if STATE_ATTR in m.__dict__)  # one, shared
    return sum(t.numel() * t.element_size() for held in state.tables.held.values() for t in held[:2])


def kept_bytes(cache) -> tuple[int, int]:
    """(bytes of the rotated keys kept on ``cache``, bytes of its keys and values)."""
    from hf_posenc.adapters.remapped_attention import KEPT_ATTR

    kept = sum(buf.numel() * buf.element_size() for per_layer in cache.__dict__.get(KEPT_ATTR, {}).values()
               for buf, _ in per_layer.values() if buf is not None)
    kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    return kept, kv


def run_length(model, tok, n: int, args) -> dict:
    import torch
    from transformers import DynamicCache

    import hf_posenc
    from hf_posenc.adapters.cache_argument import with_cache

    ids, source = prompt_ids(tok, n, model.config.vocab_size)
    prefill = DynamicCache(config=model.config)
    with torch.no_grad():
        first = model(input_ids=ids, **with_cache(model, prefill), use_cache=True).logits[:, -1:].argmax(-1)
    labels = ["none", *args.methods]
    times: dict[str, list[float]] = {m: [] for m in labels}
    memory: dict[str, tuple[int, int, int]] = {}
    for _ in range(args.rounds):
        for method in labels:
            hf_posenc.patch(model, method)
            cache = copy.deepcopy(prefill)
            times[method].append(greedy_decode(model, cache, first, n, args.steps)[0] / args.steps)
            memory[method] = (table_bytes(model) if method != "none" else 0, *kept_bytes(cache))
    hf_posenc.unpatch(model)
    native = statistics.median(times["none"])
    return {"source": source, "results": {m: {"seconds_per_token": statistics.median(t),
                                              "ratio": native / statistics.median(t), "table_bytes": memory[m][0],
                                              "kept_bytes": memory[m][1], "kv_bytes": memory[m][2]}
                                          for m, t in times.items()}}


def section(args, argv, out) -> str:
    import torch

    from hf_posenc.io.reports import markdown_table

    lengths = list(out)
    rows = []
    for method in ["none", *args.methods]:
        row = [method]
        for n in lengths:
            r = out[n]["results"][method]
            row += [f"{1000 * r['seconds_per_token']:.1f}", f"{r['ratio']:.2f}", f"{r['table_bytes'] / 2**20:.1f}",
                    f"{r['kept_bytes'] / 2**20:.0f} ({r['kept_bytes'] / r['kv_bytes']:.2f}x)"]
        rows.append(row)
    header = ["method"] + [h for n in lengths for h in (f"{n}: ms/token", f"{n}: vs native", f"{n}: tables MiB",
                                                          f"{n}: kept keys MiB (x KV cache)")]
    worst = min(out[n]["results"][m]["ratio"] for n in lengths for m in args.methods)
    return "\n".join([
        TITLE, "", f"Command: `python scripts/bench_decode.py {shlex.join(argv)}`  ",
        f"Model {args.model}, SDPA, fp32; prompts of {', '.join(map(str, lengths))} tokens "
        f"({out[lengths[0]]['source']}) prefilled once each, unpatched; then {args.steps} greedy steps per method "
        f"from a copy of that cache, median over {args.rounds} interleaved round(s); {platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads. "
        "'vs native': the method's tokens/s over "
        "the unpatched model's (SDPA). Memory beside the KV cache: the float32 cos/sin tables per key map (positions "
        "seen so far, rounded up to a power of two; shared by all layers and calls), and the rotated keys kept on the "
        "cache object between steps (per layer and key map, in buffers grown by doubling: at most one copy of the "
        "keys per map, i.e. half the KV cache, times the buffer's slack), with their size as a multiple of the KV "
        "cache's.", "", markdown_table(header, rows), "",
        f"Slowest attention-level method: {worst:.2f}x native.", ""])


def main(argv: list[str] | None = None) -> int:
    from hf_posenc.checkpoints.runtime import load_model_and_tokenizer
    from hf_posenc.io.reports import emit_section

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, .gguf, alias).")
    p.add_argument("--lengths", type=comma_list(int), default=[4096, 12288], help="prompt lengths (tokens).")
    p.add_argument("--methods", type=comma_list(str), default=METHODS, help="comma-separated attention-level methods.")
    p.add_argument("--steps", type=int, default=16, help="greedy steps decoded per method and round.")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds.")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    args = p.parse_args(argv)
    model, tok, _ = load_model_and_tokenizer(args.model, attn_implementation="sdpa")
    out = {n: run_length(model, tok, n, args) for n in args.lengths}
    emit_section(section(args, argv, out), args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
