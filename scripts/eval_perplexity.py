"""Long-context perplexity, methods side by side: the same as `hf-posenc eval ppl` (see --help)."""
import sys

from hf_posenc.cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", "ppl", *sys.argv[1:]]))
