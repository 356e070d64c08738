"""``python -m hf_posenc ...`` is ``hf-posenc ...`` (and ``accelerate launch -m hf_posenc eval ...`` runs an
evaluation on several processes)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
