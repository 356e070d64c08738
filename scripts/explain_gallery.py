"""The docs' gallery of what each method does to positions (docs/explain.md and docs/explain/<method>/), drawn by
``hf-posenc explain`` on SmolLM2-135M's geometry (head_dim 64, rope_theta 100,000, L 8,192; target 16,384), T5's
default buckets, ALiBi on SmolLM2's 9 heads and all-MiniLM-L6-v2's position table. Rerun after a method changes:

    python scripts/explain_gallery.py
"""

from __future__ import annotations

import argparse
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOLLM2 = {"head_dim": 64, "rope_theta": 100000.0, "original": 8192}
GALLERY = [  # (section, config, geometry keywords)
    ("RoPE scalings", "pi:factor=2", SMOLLM2), ("RoPE scalings", "ntk:factor=2", SMOLLM2),
    ("RoPE scalings", "yarn:factor=2", SMOLLM2), ("RoPE scalings", "llama3:factor=2", SMOLLM2),
    ("RoPE scalings", "dynamic_ntk:factor=2", SMOLLM2),
    ("Attention-level methods", "self_extend", SMOLLM2), ("Attention-level methods", "dca", SMOLLM2),
    ("Attention-level methods", "string", SMOLLM2), ("Attention-level methods", "rerope", SMOLLM2),
    ("Attention-level methods", "leaky_rerope", SMOLLM2),
    ("Swaps", "alibi", {"model": "smollm2-135m"}),
    ("Encoders", "bucket_scale:factor=2", SMOLLM2), ("Encoders", "max_distance:factor=2", SMOLLM2),
    ("Encoders", "interpolate:factor=2", {"model": "all-minilm-l6-v2"}),
    ("Encoders", "hierarchical:factor=2", {"model": "all-minilm-l6-v2"}),
]
HEADER = """# What each method does to positions

Drawn by `hf-posenc explain` (`python scripts/explain_gallery.py` redraws this page) from the code that patches:
the frequencies of each RoPE scaling, the positions each attention-level method's pieces give, the bucket function
of a patched T5 module, the slopes the ALiBi swap installs and a BERT table patched by the table extension. The
RoPE and attention-level pictures use SmolLM2-135M's geometry (head_dim 64, rope_theta 100,000, original context
8,192) and a target of 16,384 tokens. Draw your own model's: `hf-posenc explain yarn --factor 4 --model MODEL
--output DIR` (see the [CLI reference](cli.md)).
"""


def main() -> None:
    from hf_posenc import explain

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--output", default=os.path.join(ROOT, "docs"), help="the docs folder (explain.md and explain/).")
    args = p.parse_args()
    lines, section = [HEADER], None
    for where, config, geometry in GALLERY:
        name = config.split(":")[0]
        out = explain(config, os.path.join(args.output, "explain", name), **geometry)
        if where != section:
            lines += [f"## {where}", ""]
            section = where
        lines += [f"### `{config}`", "", out["text"], ""]
        lines += [f"![{name} {os.path.basename(p)}](explain/{name}/{os.path.basename(p)})" for p in out["pictures"]]
        lines.append("")
        print(f"{config}: {len(out['pictures'])} picture(s)", flush=True)
    with open(os.path.join(args.output, "explain.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines).rstrip() + "\n")


if __name__ == "__main__":
    main()
