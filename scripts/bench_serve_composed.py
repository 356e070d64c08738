"""Serving a composed checkpoint: SmolLM2-135M given llama3 x2 (a stand-in for a checkpoint that ships scaled, as
Llama 3.1 does), then YaRN x2 put on top by hf_posenc, checked on vLLM and llama.cpp with ``hf-posenc serve-check``.

1. ``hf-posenc patch --method llama3 --factor 2`` on the default model, its hf_posenc record then dropped from
   ``config.json``: a folder whose scaling is only its ``rope_parameters`` (16,384 tokens), as on the Hub.
2. ``hf-posenc patch --method yarn --factor 2`` on that folder: composed, a longrope over 16,384 (32,768 tokens) whose
   short factors are the checkpoint's own.
3. The shipped folder converted by llama.cpp's own ``convert_hf_to_gguf.py`` (f32: a ``rope_freqs`` tensor, as it
   writes Llama 3.1), and ``hf-posenc patch --gguf`` putting YaRN x2 on top of that GGUF (one list: a GGUF holds one
   set of frequencies).
4. serve-check: the composed folder on vLLM as it launches it by default (for a longrope vLLM 0.32 takes its switch,
   16,384, as the maximum length: the short factors) and with ``--max-model-len`` past the switch (the long factors
   for every input), the composed GGUF on llama.cpp, and the composed folder on llama.cpp (refused by name, or what
   it computes); with ``serve-config``'s verdict beside each.

Each step's output is kept (folders under --checkpoints-dir, reports under --output), so a second call resumes;
--write puts the section into BENCHMARKS.md.

    HF_POSENC_VLLM_PYTHON=.venv-vllm/bin/python python scripts/bench_serve_composed.py --write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

from _bench import ROOT, comma_list, rel

TITLE = "## Serving a composed checkpoint: llama3 x2 shipped, YaRN x2 on top (vLLM and llama.cpp)"
SWITCH = 16384  # the shipped checkpoint's context: the composed longrope's original_max_position_embeddings


def _cli(argv: list[str]) -> None:
    from hf_posenc.cli import main

    print("hf-posenc " + " ".join(argv), file=sys.stderr, flush=True)
    if main(argv) != 0:
        raise SystemExit(f"hf-posenc {argv[0]} failed")


def build(out: str) -> dict[str, str]:
    """The shipped folder, the composed folder, the converted GGUF and the composed GGUF (each written once)."""
    from hf_posenc.engines.llama_cpp_engine import convert

    paths = {k: os.path.join(out, k) for k in ("shipped", "composed")}
    paths.update({"shipped_gguf": os.path.join(out, "shipped-f32.gguf"),
                  "composed_gguf": os.path.join(out, "composed.gguf")})
    if not os.path.isfile(os.path.join(paths["shipped"], "config.json")):
        _cli(["patch", "--model", "smollm2-135m", "--method", "llama3", "--factor", "2", "--output", paths["shipped"],
              "--no-progress"])
        config_path = os.path.join(paths["shipped"], "config.json")
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        config.pop("hf_posenc", None)  # as from the Hub: the scaling is the rope_parameters alone
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
    if not os.path.isfile(os.path.join(paths["composed"], "config.json")):
        _cli(["patch", "--model", paths["shipped"], "--method", "yarn", "--factor", "2", "--output",
              paths["composed"], "--no-progress"])
    if not os.path.isfile(paths["shipped_gguf"]):
        convert(paths["shipped"], paths["shipped_gguf"])
    if not os.path.isfile(paths["composed_gguf"]):
        _cli(["patch", "--model", paths["shipped_gguf"], "--method", "yarn", "--factor", "2", "--gguf",
              paths["composed_gguf"], "--no-progress"])
    return paths


def checks(args, paths: dict[str, str]) -> dict[str, tuple[list[str], dict]]:
    """label: (the serve-check arguments, its report), each run once."""
    short, long = args.lengths
    vllm = ["--engine", "vllm", *(["--engine-python", args.engine_python] if args.engine_python else [])]
    plan = {"vllm-default": [paths["composed"], *vllm, "--lengths", str(short)],
            "vllm-max-model-len-long": [paths["composed"], *vllm, "--engine-arg", f"max_model_len={long + 1}",
                                        "--lengths", f"{short},{long}"],
            "llama.cpp-composed-gguf": [paths["composed_gguf"], "--engine", "llama.cpp", "--lengths",
                                        f"{short},{long}"],
            "llama.cpp-composed-folder": [paths["composed"], "--engine", "llama.cpp", "--lengths", f"{short},{long}"]}
    reports = {}
    for label, argv in plan.items():
        out = os.path.join(args.output, label)
        path = os.path.join(out, "serve_check.json")
        if not os.path.isfile(path):
            from hf_posenc.cli import main

            print(f"serve-check {label} ...", file=sys.stderr, flush=True)
            main(["serve-check", *argv, "--corpus", "python-docs", "--no-progress", "--output", out])  # 1: differs
        with open(path, encoding="utf-8") as f:
            reports[label] = (argv, json.load(f))
    return reports


def launches(paths: dict[str, str], long: int) -> dict[str, str]:
    """serve-config's verdict for each check (engine, folder or GGUF, longest input)."""
    from hf_posenc.serving.launch_settings import serve_config

    def one(path: str, engine: str, length: int | None = None) -> str:
        (launch,) = serve_config(path, [engine], max_length=length)
        return launch.computes

    return {"vllm-default": one(paths["composed"], "vllm", SWITCH),
            "vllm-max-model-len-long": one(paths["composed"], "vllm", long + 1),
            "llama.cpp-composed-gguf": one(paths["composed_gguf"], "llama.cpp"),
            "llama.cpp-composed-folder": one(paths["composed"], "llama.cpp")}


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if r["verdict"] in ("same", "differs"):
        return f"{r['verdict']} ({r['hf_posenc_nll']:.4f} / {r['engine_nll']:.4f}, {r['relative_diff']:.1e})"
    return r["verdict"]


WHAT = {"vllm-default": "composed folder, vLLM's own maximum length (for a longrope: its switch, 16,384)",
        "vllm-max-model-len-long": "composed folder, vLLM `--max-model-len` past the switch (the longest input + 1)",
        "llama.cpp-composed-gguf": "composed GGUF (f32, rope_freqs), llama.cpp",
        "llama.cpp-composed-folder": "composed folder, llama.cpp (its converter)"}


def section(args, reports: dict, computes: dict[str, str], paths: dict[str, str]) -> str:
    short, long = args.lengths
    versions = {r["setup"]["engine"]: r["setup"].get("engine_version") for _, r in reports.values()
                if r["setup"].get("engine_version")}
    with open(os.path.join(paths["composed"], "config.json"), encoding="utf-8") as f:
        composed = json.load(f)["rope_parameters"]
    lines = [TITLE, "",
             "Reproduce: `HF_POSENC_VLLM_PYTHON=.venv-vllm/bin/python python scripts/bench_serve_composed.py "
             f"--lengths {short},{long} --write` (" + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
             + f"; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; python-docs corpus, fp32).",
             "",
             "SmolLM2-135M given llama3 x2 and saved without hf_posenc's record (a checkpoint that ships scaled, as "
             "Llama 3.1 does: 16,384 tokens), then `hf-posenc patch --method yarn --factor 2` on that folder: "
             f"composed, a `{composed['rope_type']}` over {composed['original_max_position_embeddings']:,} tokens "
             "(32,768), its short factors the checkpoint's llama3 ones (inputs up to 16,384 computed as the "
             "checkpoint computes them) and its long factors YaRN x2 on top of them. For llama.cpp, the shipped "
             "folder converted by llama.cpp's own `convert_hf_to_gguf.py` (f32; llama3 as a `rope_freqs` tensor) and "
             "`hf-posenc patch --gguf` putting YaRN x2 on top of that file (one list, the long factors, for every "
             "input: a GGUF holds one set of frequencies). Per length: verdict (hf_posenc mean NLL / engine mean NLL, "
             "relative difference); same = within 1e-3. serve-config: what `hf-posenc serve-config` says of that "
             "launch before anything runs.", "",
             f"| checked | serve-config | {short:,} tokens | {long:,} tokens |", "|---|---|---|---|"]
    for label, (_, r) in reports.items():
        res = r["results"]
        lines.append(f"| {WHAT[label]} | {computes[label]} | {_cell(res.get(str(short)))} | "
                     f"{_cell(res.get(str(long)))} |")
    lines += ["", "Commands (`hf-posenc serve-check ... --corpus python-docs --output ...`):", ""]
    lines += [f"- {label}: `hf-posenc serve-check {' '.join(rel(a) if os.path.exists(a) else a for a in argv)}`"
              for label, (argv, _) in reports.items()]
    refused = {label: r["reason"] for label, (_, rep) in reports.items() for r in rep["results"].values()
               if r["verdict"] not in ("same", "differs") and r.get("reason")}
    if refused:
        lines += ["", "Not scored, in serve-check's words: " + "; ".join(
            f"{WHAT[label]}: \"{why}\"" for label, why in refused.items())]
    return "\n".join(lines + ["", reading(reports, short, long)]) + "\n"


def reading(reports: dict, short: int, long: int) -> str:
    """What the numbers say, from them: which launch matches where, and what one list costs short inputs."""
    own = reports["vllm-default"][1]["results"][str(short)]
    wide = reports["vllm-max-model-len-long"][1]["results"]
    gguf = reports["llama.cpp-composed-gguf"][1]["results"]
    same_text = (reports["llama.cpp-composed-gguf"][1]["setup"]["text"]["digest"]
                 == reports["vllm-max-model-len-long"][1]["setup"]["text"]["digest"])
    cost = gguf[str(short)]["engine_nll"] / wide[str(short)]["hf_posenc_nll"] - 1
    return (f"**Reading it.** Every engine that computes the composition computes hf_posenc's numbers where it "
            f"computes it (within {max(r['relative_diff'] for r in (own, wide[str(long)], *gguf.values())):.0e}). "
            f"vLLM takes one factor list per launch: by default (its maximum length the switch, 16,384) the "
            f"checkpoint's own short factors, {own['verdict']} at {short:,} tokens, and longer inputs refused; with "
            f"`--max-model-len` past the switch the long ones for every input, {wide[str(long)]['verdict']} at "
            f"{long:,} and {wide[str(short)]['verdict']} at {short:,} (mean NLL {wide[str(short)]['engine_nll']:.4f} "
            f"where the checkpoint gives {wide[str(short)]['hf_posenc_nll']:.4f}: "
            f"{wide[str(short)]['relative_diff']:+.1%}). Serving both lengths exactly takes two launches (serve-config "
            f"says which). The GGUF holds the long list alone, so llama.cpp and hf_posenc agree on it at both lengths, "
            f"and inputs up to 16,384 pay the long factors' cost"
            + (f": {cost:+.1%} mean NLL at {short:,} tokens against the composed folder's short factors (the same "
               "tokens)." if same_text else ".")
            + " llama.cpp's converter writes no factors for a llama-architecture longrope, so the composed folder "
            "is refused there by name before anything runs; freezing it (`--freeze-at N`) gives the one list a GGUF "
            "can hold.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--lengths", type=comma_list(int), default=[8192, 24576],
                   help="two token counts: one up to the shipped context 16,384, one past it.")
    p.add_argument("--engine-python", default=None, help="the Python that has vLLM (default: $HF_POSENC_VLLM_PYTHON).")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "serving", "composed"),
                   help="where the serve-check reports are kept (committed; a second call resumes from them).")
    p.add_argument("--checkpoints-dir", default=os.path.join(ROOT, "runs", "bench-serve-composed"),
                   help="where the folders and GGUFs are written (not committed).")
    p.add_argument("--write", action="store_true", help="put the section into BENCHMARKS.md.")
    args = p.parse_args()
    if len(args.lengths) != 2 or not 2 <= args.lengths[0] <= SWITCH < args.lengths[1]:
        raise SystemExit(f"--lengths: two token counts, the first in 2..{SWITCH}, the second past {SWITCH}; "
                         f"got {args.lengths}")
    from hf_posenc.io.reports import emit_section

    paths = build(args.checkpoints_dir)
    reports = checks(args, paths)
    text = section(args, reports, launches(paths, args.lengths[1]), paths)
    emit_section(text, args.write, os.path.join(ROOT, "BENCHMARKS.md"))
    print(f"kept under {rel(args.output)}", file=sys.stderr)


if __name__ == "__main__":
    main()
