"""Serving parity: does vLLM compute hf_posenc's checkpoints as hf_posenc does, and does `--engine vllm` give the
transformers engine's numbers?

1. SmolLM2-135M (original context L = 8,192) is patched and saved by ``hf-posenc patch`` with each method, and each
   folder goes through ``hf-posenc serve-check --engine vllm`` at --lengths (default 4,096 and 12,288) on the
   built-in python-docs corpus; the checkpoints no engine computes (DCA, ReRoPE) with ``--confirm-refusal``.
2. The README's main job (none and YaRN x2 at 12,288 tokens, one window, with its truncated baseline) is run with
   ``--engine transformers`` and ``--engine vllm``, one after the other: the perplexities side by side and each
   engine's wall time.

With ``--engine llama.cpp`` (``scripts/setup.sh --llama-cpp``), step 1 alone, with llama.cpp: each folder
converted by llama.cpp's own converter (f32) and scored by llama-cpp-python; a section of its own.

The reports and cells are kept under --output (benchmarks/serving, committed) and the checkpoints under
--checkpoints-dir, so a second call resumes; --write puts the section into BENCHMARKS.md.

    HF_POSENC_VLLM_PYTHON=.venv-vllm/bin/python python scripts/bench_serving.py --write
    python scripts/bench_serving.py --engine llama.cpp --write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from _bench import ROOT, comma_list, rel

TITLE = "## Serving: vLLM against hf_posenc (serve-check, and --engine vllm)"
TITLE_LLAMA_CPP = "## Serving: llama.cpp against hf_posenc (serve-check --engine llama.cpp)"
# label: (method, factor, --freeze-at length or None, a GGUF patched in place (llama.cpp only) or a saved folder)
CHECKPOINTS = {"none": ("none", None, None, False), "yarn-x2": ("yarn", 2.0, None, False),
               "pi-x2": ("pi", 2.0, None, False), "ntk-x2": ("ntk", 2.0, None, False),
               "llama3-x2": ("llama3", 2.0, None, False), "dynamic_ntk-x2": ("dynamic_ntk", 2.0, None, False),
               "dynamic_ntk-x2-frozen-12288": ("dynamic_ntk", 2.0, 12288, False), "dca": ("dca", None, None, False),
               "rerope": ("rerope", None, None, False), "q4_1-gguf": ("none", None, None, True),
               "q4_1-gguf-yarn-x2": ("yarn", 2.0, None, True)}
GGUF_ONLY = [label for label, c in CHECKPOINTS.items() if c[3]]
MAIN_JOB = ["--methods", "none,yarn", "--factor", "2", "--lengths", "12288", "--max-windows", "1", "--corpus",
            "python-docs", "--limit", "1", "--no-progress"]


def checkpoint(label: str, out: str) -> str:
    """The folder (or GGUF) of ``label``, written once: ``hf-posenc patch --output`` (``--freeze-at``), or the
    default model's Q4_1 GGUF patched in place (``--gguf``; "none": the file as it ships)."""
    from hf_posenc.checkpoints.models import resolve_source
    from hf_posenc.config import PosEncConfig
    from hf_posenc.eval.settings import LoadSettings
    from hf_posenc.publishing.patch_job import PatchJob, patch_and_save
    from hf_posenc.serving.gguf_file import patch_gguf

    method, factor, freeze_at, gguf = CHECKPOINTS[label]
    if gguf:
        src = resolve_source("smollm2-135m")
        source = os.path.join(src.path, src.kwargs["gguf_file"])
        path = os.path.join(out, label + ".gguf")
        if method == "none":
            return source
        if not os.path.isfile(path):
            os.makedirs(out, exist_ok=True)
            patch_gguf(source, path, PosEncConfig(method, factor))
        return path
    folder = os.path.join(out, label)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        patch_and_save(PatchJob(LoadSettings("smollm2-135m"), PosEncConfig(method, factor), folder, progress=False,
                                freeze_at=freeze_at))
    return folder


def serve_checks(args) -> dict:
    from hf_posenc.io.documents import gather_documents
    from hf_posenc.serving.check import CheckSettings, EngineSettings, serve_check

    reports = {}
    for label in args.checkpoints:
        if args.engine == "vllm" and label in GGUF_ONLY:
            continue
        checks = "checks" if args.engine == "vllm" else f"checks-{args.engine}"
        path = os.path.join(args.output, checks, label, "serve_check.json")
        if os.path.isfile(path):
            with open(path) as f:
                reports[label] = json.load(f)
            continue
        folder = checkpoint(label, args.checkpoints_dir)
        print(f"serve-check {label} ...", file=sys.stderr, flush=True)
        engine = EngineSettings(args.engine, args.engine_python if args.engine == "vllm" else None)
        check = CheckSettings(args.lengths, confirm_refusal=CHECKPOINTS[label][0] in ("dca", "rerope"))
        reports[label] = serve_check(folder, engine, check, docs=gather_documents(corpus="python-docs"),
                                     progress=False, output=os.path.dirname(path))
    return reports


def engines(args) -> dict:
    from hf_posenc.cli import main

    runs = {}
    for engine in ("transformers", "vllm"):
        out = os.path.join(args.output, f"main-job-{engine}")
        if not os.path.isfile(os.path.join(out, "perplexity.json")):
            extra = ["--engine-python", args.engine_python] if args.engine_python and engine == "vllm" else []
            start = time.time()
            if main(["eval", "ppl", *MAIN_JOB, "--engine", engine, *extra, "--output", out]) != 0:
                raise SystemExit(f"the main job on {engine} failed")
            with open(os.path.join(out, "wall_seconds.json"), "w") as f:
                json.dump({"seconds": round(time.time() - start, 1)}, f)
        with open(os.path.join(out, "perplexity.json")) as f, open(os.path.join(out, "wall_seconds.json")) as g:
            runs[engine] = {"report": json.load(f), "seconds": json.load(g)["seconds"]}
    return runs


def _num(value, fmt: str) -> str:
    return "NaN" if value is None else format(value, fmt)  # reports write a non-finite number as null


def _cell(r: dict) -> str:
    if r["verdict"] in ("same", "differs"):
        return (f"{r['verdict']} ({_num(r['hf_posenc_nll'], '.4f')} / {_num(r['engine_nll'], '.4f')}, "
                f"{_num(r['relative_diff'], '.1e')})")
    return r["verdict"]


def section(args, checks: dict, runs: dict) -> str:
    any_check = next(iter(checks.values()))["setup"]
    version = next((c["setup"].get("engine_version") for c in checks.values() if c["setup"].get("engine_version")), "?")
    lines = [TITLE, "", "Reproduce: `HF_POSENC_VLLM_PYTHON=.venv-vllm/bin/python python scripts/bench_serving.py "
             f"--lengths {','.join(map(str, args.lengths))} --write` (vLLM {version}, CPU build, "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; python-docs corpus).", "",
             f"**serve-check.** SmolLM2-135M saved by `hf-posenc patch` with each method, scored by "
             f"`hf_posenc.from_pretrained` and by vLLM (its maximum model length derived from `config.json`), fp32; "
             f"per length: verdict (hf_posenc mean NLL / vLLM mean NLL, relative difference); same = within "
             f"{any_check['rtol']:g}. DCA and ReRoPE: `--confirm-refusal` (the engine started anyway).", ""]
    header = "| checkpoint | vLLM max length | " + " | ".join(f"{n} tokens" for n in args.lengths) + " |"
    lines += [header, "|---" * (len(args.lengths) + 2) + "|"]
    for label, c in checks.items():
        cells = [_cell(c["results"][str(n)]) for n in args.lengths]
        lines.append(f"| {label} | {c['setup'].get('engine_max_model_len', '-')} | " + " | ".join(cells) + " |")
    lines += ["", "Refusals, in vLLM's words: " + "; ".join(
        f"{label} at {n}: \"{r['reason'].split('. ')[0]}\"" for label, c in checks.items()
        for n, r in c["results"].items() if r["verdict"] == "refused"), ""]
    t, v = runs["transformers"], runs["vllm"]
    cmd = "hf-posenc eval ppl " + " ".join(MAIN_JOB)
    lines += [f"**`--engine vllm`**: the README's main job, `{cmd} --engine ENGINE`, one engine after the other "
              "(perplexity at 12,288 tokens, the tokens past L, and the truncated baseline).", "",
              "| variant | transformers | vLLM | relative difference |", "|---|---|---|---|"]
    for label, per_len in t["report"]["results"].items():
        a, b = per_len["12288"]["ppl"], v["report"]["results"][label]["12288"]["ppl"]
        lines.append(f"| {label} | {a:.4f} | {b:.4f} | {abs(b - a) / a:.1e} |")
    lines += ["", "Wall time of the whole command, load and engine starts included: transformers "
              f"{t['seconds']:.0f} s, vLLM {v['seconds']:.0f} s ({v['seconds'] / t['seconds']:.2f}x). On this CPU "
              "vLLM keeps one of the cores for its scheduler and starts an engine per configuration (about a minute "
              "each); its advantage is on GPUs and with many requests, which this run does not measure."]
    return "\n".join(lines) + "\n"


def section_llama_cpp(args, checks: dict) -> str:
    from hf_posenc.serving.check import QUANTIZED_RTOL

    any_check = next(iter(checks.values()))["setup"]
    version = next((c["setup"].get("engine_version") for c in checks.values() if c["setup"].get("engine_version")), "?")
    lines = [TITLE_LLAMA_CPP, "", "Reproduce: `python scripts/bench_serving.py --engine llama.cpp --lengths "
             f"{','.join(map(str, args.lengths))} --write` (llama-cpp-python {version}, built from source by "
             f"`scripts/setup.sh --llama-cpp`; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
             "python-docs corpus).", "",
             "SmolLM2-135M saved by `hf-posenc patch` with each method, converted by llama.cpp's own "
             "`convert_hf_to_gguf.py` to a float32 GGUF (what a user does, without quantizing) and scored by llama.cpp "
             "with a context of the longest length, against `hf_posenc.from_pretrained`; per length: verdict "
             f"(hf_posenc mean NLL / llama.cpp mean NLL, relative difference); same = within {any_check['rtol']:g}. "
             "`-frozen-12288`: saved with `--freeze-at 12288`: static NTK equal to dynamic NTK at 12,288 tokens, "
             "alpha = 2 x 12,288 / 8,192 - 1 = 2, so the same frequencies as ntk x2 (the same numbers). "
             "`q4_1-gguf`: the default model's Q4_1 GGUF as it ships, and patched in place (`hf-posenc patch --gguf`), "
             "scored by llama.cpp quantized against hf_posenc's de-quantized load; same = within "
             f"{QUANTIZED_RTOL:g} for those (llama.cpp rounds the activations to 8 bits for quantized products). "
             "`not computable` past L for dynamic_ntk comes from its method record (llama.cpp's converter writes plain "
             "RoPE for it), without scoring; DCA and ReRoPE: `--confirm-refusal` (llama.cpp started anyway: it takes "
             "any context it is given, so past L it serves the unpatched model, `served wrong`).", ""]
    lines += ["| checkpoint | " + " | ".join(f"{n} tokens" for n in args.lengths) + " |",
              "|---" * (len(args.lengths) + 1) + "|"]
    for label, c in checks.items():
        lines.append(f"| {label} | " + " | ".join(_cell(c["results"][str(n)]) for n in args.lengths) + " |")
    older = [label for label, c in checks.items() if CHECKPOINTS[label][3] and c["setup"]["rtol"] != QUANTIZED_RTOL]
    if older:
        worst = max(r.get("relative_diff") or 0 for label in older for r in checks[label]["results"].values())
        lines += ["", f"{', '.join(older)}: checked with rtol {checks[older[0]]['setup']['rtol']:g}, the quantized "
                      f"tolerance when they ran; the largest difference there, {worst:.1e}, is within "
                      f"{QUANTIZED_RTOL:g} too."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--lengths", type=comma_list(int), default=[4096, 12288], help="serve-check lengths in tokens.")
    p.add_argument("--checkpoints", type=comma_list(str), default=list(CHECKPOINTS),
                   help=f"which checkpoints to check, of {', '.join(CHECKPOINTS)} (the GGUFs with llama.cpp only).")
    p.add_argument("--engine", choices=["vllm", "llama.cpp"], default="vllm",
                   help="the engine checked (llama.cpp: the serve-check table alone, in a section of its own).")
    p.add_argument("--engine-python", default=None, help="the Python that has vLLM (default: $HF_POSENC_VLLM_PYTHON).")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "serving"),
                   help="where the reports and cells are kept (committed; a second call resumes from them).")
    p.add_argument("--checkpoints-dir", default=os.path.join(ROOT, "runs", "bench-serving-checkpoints"),
                   help="where the patched checkpoints are saved (GBs: not committed).")
    p.add_argument("--write", action="store_true", help="put the section into BENCHMARKS.md.")
    args = p.parse_args()
    unknown = sorted(set(args.checkpoints) - set(CHECKPOINTS))
    if unknown:
        raise SystemExit(f"--checkpoints: unknown {unknown}; choose from {list(CHECKPOINTS)}")
    from hf_posenc.io.reports import emit_section

    checks = serve_checks(args)
    text = section(args, checks, engines(args)) if args.engine == "vllm" else section_llama_cpp(args, checks)
    emit_section(text, args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    print(f"kept under {rel(args.output)}", file=sys.stderr)


if __name__ == "__main__":
    main()
