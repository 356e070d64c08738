"""``hf-posenc serve-check``: does a serving engine compute a saved checkpoint as hf_posenc does?"""

from __future__ import annotations

from ..engines.registry import runnable
from ..serving.check import CheckSettings, EngineSettings, failed, serve_check
from .flags import LoadFlags, data_flags, document_source, engine_flags, ints, positive, positive_float
from .parser import DefaultsShown

# the checkpoint is the positional folder; these say how the hf_posenc side loads it
LOAD = LoadFlags(None, tokenizer_help="where the tokenizer comes from when the folder has none.",
                 dtype_help="float32, bfloat16 or float16, both ways.",
                 device_help="torch device of the hf_posenc side.")


def add_parser(sub) -> None:
    sc = sub.add_parser("serve-check", allow_abbrev=False, formatter_class=DefaultsShown,
                        help="score the same tokens with a saved checkpoint (or GGUF) in an engine (vLLM, llama.cpp) "
                             "and with hf_posenc.from_pretrained; "
                             "per length: same, differs (with the numbers), refused, or not computable.")
    sc.add_argument("folder", help="the checkpoint folder ('hf-posenc patch --output' wrote it), or a .gguf file "
                                   "('hf-posenc patch --gguf' wrote it, or an unscaled one; --engine llama.cpp).")
    e = sc.add_argument_group("engine")
    e.add_argument("--engine", choices=list(runnable()), default="vllm",
                   help="the serving engine to check (llama.cpp: through llama-cpp-python, the folder converted by "
                        "llama.cpp's own convert_hf_to_gguf.py; scripts/setup.sh --llama-cpp installs both).")
    engine_flags(e)
    c = sc.add_argument_group("check")
    c.add_argument("--lengths", type=ints, default=None,
                   help="token counts scored (default: half the original context, and the context the checkpoint "
                        "advertises, at most 32768).")
    c.add_argument("--rtol", type=positive_float, default=None,
                   help="largest relative difference of the mean NLL still called 'same' (default: 1e-3; 5e-3 for a "
                        "quantized GGUF, which llama.cpp multiplies with activations rounded to 8 bits).")
    c.add_argument("--confirm-refusal", action="store_true",
                   help="for a checkpoint no engine computes: start the engine anyway and check that it refuses the "
                        "lengths past the original context ('served wrong' if it takes one); for one serve-config says "
                        "this engine cannot compute: score it anyway (its verdicts show how far apart it is).")
    c.add_argument("--allow-long", action="store_true",
                   help="start the engine for the longest length even past the context config.json states "
                        "(VLLM_ALLOW_LONG_MAX_MODEL_LEN, as a deployment forcing --max-model-len does), to see what it "
                        "computes there.")
    LOAD.add(c)
    c.add_argument("--chunk-size", type=positive, default=1024, help="tokens per LM-head chunk on the hf_posenc side.")
    c.add_argument("--output", default=None, help="folder for serve_check.json and serve_check.md.")
    c.add_argument("--no-progress", action="store_true", help="hide the progress bars.")
    d = data_flags(sc, "test", "")
    d.add_argument("--corpus", choices=["python-docs"], default=None,
                   help="a built-in corpus (see 'hf-posenc eval ppl --help'); default: the default corpus.")
    d.add_argument("--limit", type=positive, help="use at most this many documents.")


def run(args, command: str) -> int:
    docs = document_source(args).gather()
    engine = EngineSettings(args.engine, args.engine_python, args.tensor_parallel_size, dict(args.engine_arg),
                            args.allow_long)
    load = LOAD.settings(args, args.folder)
    check = CheckSettings(args.lengths, args.rtol, args.confirm_refusal, load.dtype, load.device, args.chunk_size)
    report = serve_check(args.folder, engine, check, docs=docs, tokenizer=load.tokenizer, output=args.output,
                         progress=not args.no_progress, command=command)
    print(report["table"])
    if args.output:
        print(f"\nresults: {args.output}/serve_check.json, serve_check.md")
    bad = failed(report)
    if bad:
        print(f"\nserve-check: the engine does not compute this checkpoint as hf_posenc does at {', '.join(bad)} "
              "tokens (see the table)")
    return 1 if bad else 0
