"""``hf-posenc explain``: pictures and a short text of what a method does to positions."""

from __future__ import annotations

from ..explaining import explain
from .flags import method_config, method_param_flag, positive, positive_float
from .parser import DefaultsShown


def add_parser(sub) -> None:
    ex = sub.add_parser("explain", allow_abbrev=False, formatter_class=DefaultsShown,
                        help="draw what a method does to positions (wavelengths and decay for RoPE scalings, the "
                             "relative-position map of attention-level methods, T5 buckets, ALiBi biases, a BERT "
                             "table's similarity) and say it in a few sentences.")
    ex.add_argument("method", help="the method, alone or in the config syntax (yarn:factor=4,beta_fast=16); see "
                                   "'hf-posenc methods'.")
    ex.add_argument("--factor", type=positive_float, default=None, help="context-extension factor (methods that "
                                                                        "take one; default: 2; or factor= in METHOD).")
    method_param_flag(ex, "a knob of the method; repeatable.")
    g = ex.add_argument_group("geometry (default: read from --model's config; without --model, the default model's "
                              "unless all three are given)")
    g.add_argument("--model", default=None, help="Hub id, local folder, .gguf file or alias whose config (no "
                                                  "weights; a BERT table extension reads its table) gives the "
                                                  "geometry.")
    g.add_argument("--head-dim", type=positive, default=None, help="rotary dimensions per head.")
    g.add_argument("--rope-theta", type=positive_float, default=None, help="RoPE base.")
    g.add_argument("--original-max-position", type=positive, default=None,
                   help="the context the model was trained on (L).")
    ex.add_argument("--length", type=positive, default=None,
                    help="the target length drawn (default: factor x L, or 2 x L for methods without a factor).")
    ex.add_argument("--resolution", type=positive, default=256,
                    help="queries and keys sampled for the relative-position map of attention-level methods.")
    ex.add_argument("--output", required=True, help="folder for the PNGs, explain.md and explain.json.")


def run(args, command: str) -> int:
    out = explain(method_config(args, named="the method"), args.output, model=args.model, head_dim=args.head_dim,
                  rope_theta=args.rope_theta, original=args.original_max_position, length=args.length,
                  resolution=args.resolution)
    print(out["text"])
    print(f"\npictures: {', '.join(out['pictures'])}\ntext: {args.output}/explain.md, explain.json")
    return 0
