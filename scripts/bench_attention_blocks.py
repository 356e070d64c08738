"""Query rows per block of the remapped-position attention on a GPU: the forward time of each method at each block
size, beside native SDPA, on random weights of a real model's shape (bench_attention's geometries), in one run.

Each query block costs a dozen kernel launches and their Python whatever its size, so on a GPU small blocks are
launch-bound; larger ones cost a ``heads x block x block`` band per piece. ``RemapState.block`` (None: 256 on a CPU,
2,048 on a GPU, ``adapters.remapped_attention.DEFAULT_BLOCK``) is set on every patched layer for each row.
One untimed forward, then one timed, per cell; the peak is ``torch.cuda.max_memory_allocated`` so far in the run.

    python scripts/bench_attention_blocks.py
"""

from __future__ import annotations

import argparse
import sys
import time

from bench_attention import GEOMETRIES, load, tokens


def timed(model, x) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        model.model(input_ids=x, use_cache=False)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def set_block(model, block: int) -> None:
    from hf_posenc.adapters.remapped_attention import STATE_ATTR

    for module in model.modules():
        state = module.__dict__.get(STATE_ATTR)
        if state is not None:
            state.block = block


def main(argv: list[str] | None = None) -> int:
    import torch

    import hf_posenc

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--geometry", choices=sorted(GEOMETRIES), default="qwen2.5-0.5b",
                   help="random weights of this model's shape.")
    p.add_argument("--lengths", default="16384,32768", help="comma-separated tokens per forward pass.")
    p.add_argument("--methods", default="self_extend,dca,string", help="comma-separated attention-level methods.")
    p.add_argument("--blocks", default="256,1024,2048,4096,8192", help="comma-separated query rows per block.")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention_blocks measures the GPU path: torch sees no CUDA device here")
    args.device, args.dtype, args.model = "cuda", "bfloat16", None
    model = load(args)
    for n in (int(v) for v in args.lengths.split(",")):
        x = tokens(model, n).cuda()
        hf_posenc.unpatch(model)
        timed(model, x)
        print(f"{n} native {timed(model, x):.3f}s", flush=True)
        for method in args.methods.split(","):
            hf_posenc.patch(model, method)
            for block in (int(v) for v in args.blocks.split(",")):
                set_block(model, block)
                timed(model, x)
                print(f"{n} {method} block {block}: {timed(model, x):.3f}s peak "
                      f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
