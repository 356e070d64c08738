"""``hf-posenc explain``: pictures and a short text of what a method does to positions."""

from __future__ import annotations


from .flags import method_param_flag, positive, positive_float
from ..config import PosEncConfig
from ..methods import DEFAULT_FACTOR, resolve_method
from ..config_syntax import parse_method_params
from ..explaining import explain
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
                                                  "weights; a BERT table extension reads its table) gives the geometry.")
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
    config = args.method
    if ":" in args.method and (args.factor is not None or args.method_param):
        raise ValueError(f"{args.method!r} holds its knobs already: drop --factor / --method-param, or give them in it")
    if ":" not in args.method:  # a bare name: --factor (2 when not given, for a method that takes one), --method-param
        knobs = parse_method_params(args.method_param)
        params = {**knobs.pop("*", {}), **knobs.pop(args.method, {})}
        if knobs:
            raise ValueError(f"--method-param names {sorted(knobs)}, but the method is {args.method!r}")
        takes = resolve_method(args.method).uses_factor
        config = PosEncConfig(args.method, args.factor if args.factor is not None or not takes else DEFAULT_FACTOR,
                              None, params)
    out = explain(config, args.output, model=args.model, head_dim=args.head_dim, rope_theta=args.rope_theta,
                  original=args.original_max_position, length=args.length, resolution=args.resolution)
    print(out["text"])
    print(f"\npictures: {', '.join(out['pictures'])}\ntext: {args.output}/explain.md, explain.json")
    return 0
