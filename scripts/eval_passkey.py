"""Passkey retrieval, methods side by side: the same as `hf-posenc eval passkey` (see --help)."""
import sys

from hf_posenc.cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", "passkey", *sys.argv[1:]]))
