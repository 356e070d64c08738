"""``python -m hf_posenc.cli ...`` is ``hf-posenc ...``."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
