"""Speed and memory of the remapped-position attention methods against the model's own SDPA attention, side by
side in one run.

Speed: one model, loaded once; each variant (``native`` = unpatched SDPA, then each method with its default
knobs) is patched in turn onto the same instance and timed on the same token ids (the model body's forward,
no LM head), the variants interleaved within each round so that drifts of the machine hit them alike; one
warm-up of every variant at the shortest length and one untimed forward at each new length (the first there
allocates, and native is timed first); the median over rounds is kept.
Reported: tokens/s and the ratio to native (target: >= 0.7 at 8k and 12k).

Memory: at ``--memory-length`` every variant runs once more in a fresh process, which resets its peak resident
memory after loading the model and the tokens (Linux ``/proc/self/clear_refs``) and reports the peak of the
forward above that level (the attention's working memory; the activations are the same for every variant).

    python scripts/bench_attention.py --lengths 2048,4096,8192,12288 --write

On a GPU (``--device cuda``): by default random weights of Qwen2.5-0.5B's shape (24 layers, 14 heads over 2 KV
heads, head dim 64; ``--geometry``), bf16, lengths 16k, 32k and 64k; each forward timed between CUDA
synchronisations, and its peak memory (``torch.cuda.max_memory_allocated`` above what was allocated before it) taken in
the same process. Its section is "Attention-level methods on a GPU".

    python scripts/bench_attention.py --device cuda --write

A sliding/full hybrid (``--geometry gemma3-270m``: Gemma 3 270M's shape, five sliding-window layers to one full) is
timed beside its twin with every layer full attention, in one run: the methods change the full-attention layers
only, so their ratio to native on the hybrid is compared with the all-full model's. Its section is "Attention-level
methods on a sliding/full hybrid" (on a GPU: "... hybrid on a GPU").

    python scripts/bench_attention.py --geometry gemma3-270m --lengths 2048,4096,8192 --memory-length 0 --write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

from _bench import reset_peak_rss, status_mb

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TITLE = "## Remapped-position attention: speed and memory vs native SDPA"
GPU_TITLE = "## Attention-level methods on a GPU"
GEOMETRIES = {  # random weights of a real model's shape: (model_type, config keywords)
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                   tie_word_embeddings=True)),
    "llama-3-8b": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "gemma3-270m": ("gemma3_text", dict(vocab_size=262144, hidden_size=640, intermediate_size=2048,
                                        num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                                        head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
                                        max_position_embeddings=32768,
                                        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
                                        rope_parameters={"full_attention": {"rope_type": "default",
                                                                            "rope_theta": 1000000.0},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 10000.0}})),
}
METHODS = ("self_extend", "dca", "string", "rerope", "leaky_rerope")
HYBRID_TITLE = "## Attention-level methods on a sliding/full hybrid: speed vs native"
HYBRID_GPU_TITLE = "## Attention-level methods on a sliding/full hybrid on a GPU: speed vs native"


def tokens(model, length: int):
    import torch

    return torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))


def hybrid(args) -> bool:
    """Whether ``--geometry`` mixes sliding-window and full-attention layers (then its all-full twin is timed too)."""
    return bool(args.geometry) and "sliding_attention" in GEOMETRIES[args.geometry][1].get("layer_types", ())


def load(args, all_full: bool = False):
    """The model to time: ``--model``, or random weights of ``--geometry`` (on ``--device``, in ``--dtype``);
    ``all_full``: the geometry with every layer full attention (a hybrid's twin, the same weights' shapes)."""
    import torch

    from hf_posenc.checkpoints.runtime import load_model_and_tokenizer, torch_dtype

    if not args.geometry:
        model, _, _ = load_model_and_tokenizer(args.model, dtype=args.dtype, device=args.device,
                                               attn_implementation="sdpa")
        return model
    from transformers import AutoConfig, AutoModelForCausalLM

    family, keywords = GEOMETRIES[args.geometry]
    if all_full:
        keywords = {**keywords, "layer_types": ["full_attention"] * len(keywords["layer_types"])}
    config = AutoConfig.for_model(family, **keywords)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(args.device):
        return AutoModelForCausalLM.from_config(config, dtype=torch_dtype(args.dtype)).eval()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def forward(model, variant: str, x) -> float:
    import torch

    import hf_posenc

    if variant == "native":
        hf_posenc.unpatch(model)
    else:
        hf_posenc.patch(model, variant)
    device = str(x.device)
    with torch.no_grad():
        _sync(device)
        start = time.perf_counter()
        model.model(input_ids=x, use_cache=False)
        _sync(device)
        return time.perf_counter() - start


def gpu_memory(model, variant: str, x) -> dict:
    """Peak CUDA memory of one forward above what was allocated before it, and its time."""
    import torch

    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    seconds = forward(model, variant, x)
    return {"variant": variant, "increment_mb": (torch.cuda.max_memory_allocated() - before) / 2**20,
            "seconds": seconds}


def child(args) -> None:
    """One variant at one length in this fresh process: JSON with the peak RSS increment and the time."""
    model = load(args)
    x = tokens(model, args.memory_length)
    base = reset_peak_rss()  # loading (a GGUF de-quantised in memory) does not hide the forward's own peak
    seconds = forward(model, args.variant, x)
    print(json.dumps({"variant": args.variant, "increment_mb": status_mb("VmHWM") - base, "seconds": seconds}))


def speed(args, variants: list[str], all_full: bool = False) -> dict[int, dict[str, list[float]]]:
    from tqdm import tqdm

    model = load(args, all_full)
    lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
    times: dict[int, dict[str, list[float]]] = {n: {v: [] for v in variants} for n in lengths}
    for v in variants:
        forward(model, v, tokens(model, min(lengths)).to(args.device))  # warm-up
    steps = tqdm(total=len(lengths) * args.rounds * len(variants), desc="forward passes")
    for n in lengths:
        x = tokens(model, n)
        forward(model, variants[0], x.to(args.device))  # untimed: the first forward at a new length allocates
        for _ in range(args.rounds):
            for v in variants:
                times[n][v].append(forward(model, v, x.to(args.device)))
                steps.update()
    steps.close()
    if args.device.startswith("cuda") and args.memory_length:  # the same process: CUDA counts its own peaks
        x = tokens(model, args.memory_length).to(args.device)
        args.gpu_memory = {v: gpu_memory(model, v, x) for v in variants}
    return times


def memory(args, variants: list[str]) -> dict[str, dict]:
    if args.device.startswith("cuda"):
        return getattr(args, "gpu_memory", {})
    out = {}
    for v in variants:
        cmd = [sys.executable, __file__, "--variant", v, "--model", args.model,
               "--memory-length", str(args.memory_length), "--dtype", args.dtype,
               *(["--geometry", args.geometry] if args.geometry else [])]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(run.stderr[-2000:])
        out[v] = json.loads(run.stdout.strip().splitlines()[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    from hf_posenc.io.reports import emit_section, markdown_table

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--model", default="smollm2-135m", help="model (Hub id, folder, .gguf, alias); default knobs of "
                                                            "every method are derived from its context.")
    p.add_argument("--lengths", default="2048,4096,8192,12288", help="comma-separated tokens per forward pass.")
    p.add_argument("--rounds", type=int, default=1, help="timed rounds (each runs every variant once per length).")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated attention-level methods to compare.")
    p.add_argument("--memory-length", type=int, default=12288,
                   help="tokens of the fresh-process memory measurement (0: skip it).")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (then --geometry, --dtype and --lengths default to "
                   "qwen2.5-0.5b, bfloat16 and 16384,32768,65536, and the section is the GPU one).")
    p.add_argument("--geometry", choices=sorted(GEOMETRIES), default=None,
                   help="random weights of this model's shape instead of --model (default on cuda: qwen2.5-0.5b).")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on cpu, bfloat16 "
                   "on cuda).")
    p.add_argument("--write", action="store_true", help="replace this script's section of BENCHMARKS.md.")
    p.add_argument("--variant", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    if gpu and args.geometry is None and "--model" not in argv:
        args.geometry = "qwen2.5-0.5b"
    if gpu and "--lengths" not in argv:
        args.lengths = "16384,32768,65536"
    if gpu and "--memory-length" not in argv:
        args.memory_length = 32768
    if args.variant:
        child(args)
        return 0
    variants = ["native", *[m.strip() for m in args.methods.split(",") if m.strip()]]
    if hybrid(args):
        return hybrid_section(args, argv, variants)
    rows, at = ratios(speed(args, variants), variants)
    mem = memory(args, variants) if args.memory_length else {}
    command = "python scripts/bench_attention.py " + shlex.join(argv)
    where = machine(args)
    lines = [
        GPU_TITLE if gpu else TITLE, "",
        f"Command: `{command.strip()}`  ",
        f"Model {args.geometry + ' (random weights)' if args.geometry else args.model}, SDPA, the model body's "
        "forward (no LM head), batch 1, every method with its default "
        f"knobs; median of {args.rounds} interleaved round(s) after one warm-up and one untimed forward per length; "
        f"{where}.", "",
        markdown_table(["tokens", "variant", "tokens/s", "seconds", "ratio to native"], rows), "",
        "**Ratio to native: " + "; ".join(
            f"{v} " + ", ".join(f"{r:.2f} at {n}" for n, r in at[v].items()) for v in variants[1:]) + "** "
        "(target >= 0.7 at 8k and 12k).",
    ]
    if mem:
        how = "in this process (torch.cuda.max_memory_allocated)" if gpu else "one fresh process per variant"
        lines += ["", f"Peak memory above the loaded model, {how}, {args.memory_length} tokens:", "",
                  markdown_table(["variant", "peak increment (MB)", "seconds"],
                                 [[v, round(r["increment_mb"]), round(r["seconds"], 1)] for v, r in mem.items()])]
    emit_section("\n".join(lines), args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


def machine(args) -> str:
    import torch

    if args.device.startswith("cuda"):
        return (f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
                f"{args.dtype}")
    return f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"


def ratios(times: dict[int, dict[str, list[float]]], variants: list[str]) -> tuple[list[list], dict]:
    """Table rows (tokens, variant, tokens/s, seconds, ratio to native) and ``{variant: {tokens: ratio}}``."""
    rows, at = [], {}
    for n, per in times.items():
        native = statistics.median(per["native"])
        for v in variants:
            t = statistics.median(per[v])
            ratio = round(native / t, 2)  # rounded once: the table and the summary line show the same number
            rows.append([n, v, round(n / t, 1), round(t, 2), ratio])
            at.setdefault(v, {})[n] = ratio
    return rows, at


def hybrid_section(args, argv: list[str], variants: list[str]) -> int:
    """A sliding/full hybrid geometry and its all-full twin timed in one run: each method's ratio to the native
    attention of the same model, side by side (the methods change the full-attention layers only)."""
    from hf_posenc.io.reports import emit_section, markdown_table

    rows, at = [], {}
    for label, all_full in (("hybrid", False), ("all full", True)):
        got, at[label] = ratios(speed(args, variants, all_full), variants)
        rows += [[label, *r] for r in got]
    family, keywords = GEOMETRIES[args.geometry]
    full = keywords["layer_types"].count("full_attention")
    lines = [
        HYBRID_GPU_TITLE if args.device.startswith("cuda") else HYBRID_TITLE, "",
        f"Command: `python scripts/bench_attention.py {shlex.join(argv)}`  ",
        f"Random weights of {args.geometry}'s shape ({family}: {len(keywords['layer_types'])} layers, {full} of them "
        f"full attention, the others a {keywords['sliding_window']}-token sliding window), beside its twin with every "
        f"layer full attention; SDPA, the model body's forward, batch 1, every method with its default knobs (from "
        f"the {keywords['max_position_embeddings']:,}-token context); median of {args.rounds} interleaved round(s) "
        f"after one warm-up and one untimed forward per length; {machine(args)}.", "",
        markdown_table(["model", "tokens", "variant", "tokens/s", "seconds", "ratio to native"], rows), "",
        "**Ratio to native, hybrid vs all full: " + "; ".join(
            f"{v} " + ", ".join(f"{at['hybrid'][v][n]:.2f} vs {at['all full'][v][n]:.2f} at {n}"
                                for n in at["hybrid"][v]) for v in variants[1:]) + "** (a method changes the "
        "full-attention layers only; the sliding ones run the model's own attention).",
    ]
    emit_section("\n".join(lines), args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
