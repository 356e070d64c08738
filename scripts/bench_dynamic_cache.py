"""Decode cost and drift of ``cache="consistent"`` against ``cache="stale"`` for the length-dependent RoPE methods.

SmolLM2-135M (original context L = 8,192) is prefilled once with a prompt of L - 8 tokens of a book (random
tokens when the book is absent); from copies of that cache, each method decodes the same greedy steps past
L with each cache mode, the modes interleaved round by round, and the seconds per decoded token are compared
(the ratio decides the default: "consistent" becomes it within 1.3x of "stale"). Then the last step's logits
of each mode are compared with one forward over the whole sequence it produced (what "recomputing at every
step" gives at that step). With --write the section replaces this script's section of BENCHMARKS.md.

    python scripts/bench_dynamic_cache.py --write
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import shlex
import statistics
import sys

from _bench import ROOT, greedy_decode, prompt_ids

TITLE = "## Dynamic RoPE and the KV cache: cache=\"consistent\" vs cache=\"stale\" while decoding"
MODES = ("stale", "consistent")


def run(args) -> dict:
    import torch
    from transformers import DynamicCache

    import hf_posenc
    from hf_posenc.adapters.cache_argument import with_cache
    from hf_posenc.checkpoints.runtime import load_model_and_tokenizer

    model, tok, _ = load_model_and_tokenizer(args.model, attn_implementation="sdpa")
    L = model.config.max_position_embeddings
    ids, source = prompt_ids(tok, L - 8, model.config.vocab_size)
    prefill = DynamicCache(config=model.config)
    with torch.no_grad():
        first = model(input_ids=ids, **with_cache(model, prefill), use_cache=True).logits[:, -1:].argmax(-1)
    results = {}
    for method in args.methods:
        times = {m: [] for m in MODES}
        last = {}
        for _ in range(args.rounds):
            for mode in MODES:
                hf_posenc.patch(model, method, factor=args.factor, cache=mode)
                seconds, new, logits = greedy_decode(model, copy.deepcopy(prefill), first, ids.shape[1], args.steps)
                times[mode].append(seconds / args.steps)
                last[mode] = (new, logits)
        drift = {}
        for mode in MODES:
            hf_posenc.patch(model, method, factor=args.factor, cache=mode)
            new, logits = last[mode]
            whole = torch.cat([ids, first, new[:, :-1]], -1)
            with torch.no_grad():
                ref = model(input_ids=whole, use_cache=False, logits_to_keep=1).logits[:, -1].float()
            drift[mode] = (logits - ref).abs().max().item()
        results[method] = {"seconds_per_token": {m: statistics.median(t) for m, t in times.items()}, "drift": drift}
    hf_posenc.unpatch(model)
    return {"L": L, "prompt": ids.shape[1], "source": source, "results": results}


def section(args, argv, out) -> str:
    import torch

    from hf_posenc.io.reports import markdown_table

    rows = []
    for method, r in out["results"].items():
        s, d = r["seconds_per_token"], r["drift"]
        rows.append([method, f"{1000 * s['stale']:.1f}", f"{1000 * s['consistent']:.1f}",
                     f"{s['consistent'] / s['stale']:.2f}", f"{d['stale']:.2e}", f"{d['consistent']:.2e}"])
    table = markdown_table(["method", "stale ms/token", "consistent ms/token", "ratio consistent / stale",
                            "stale: max abs logit diff vs recompute", "consistent: same"], rows)
    return "\n".join([
        TITLE, "", f"Command: `python scripts/bench_dynamic_cache.py {shlex.join(argv)}`  ",
        f"Model {args.model}, SDPA, fp32, factor {args.factor:g}; prompt of {out['prompt']} tokens ({out['source']}, "
        f"L = {out['L']}) prefilled once, then {args.steps} greedy steps from a copy of its cache per method and "
        f"mode, median over {args.rounds} interleaved round(s); {platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads. The drift column compares the last step's logits "
        "with a forward over the whole sequence that mode produced.", "", table, ""])


def main(argv: list[str] | None = None) -> int:
    from hf_posenc.io.reports import emit_section

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, .gguf, alias).")
    p.add_argument("--methods", type=lambda s: [x for x in s.split(",") if x], default=["dynamic_ntk", "dynamic_yarn"],
                   help="comma-separated length-dependent methods.")
    p.add_argument("--factor", type=float, default=2.0, help="the methods' factor.")
    p.add_argument("--steps", type=int, default=40, help="greedy steps decoded per method and mode (from L - 8).")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds.")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    args = p.parse_args(argv)
    out = run(args)
    emit_section(section(args, argv, out), args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
