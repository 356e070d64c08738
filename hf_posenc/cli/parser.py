"""The argument parser of every ``hf-posenc`` command: no abbreviated flags (``--token`` is never taken for
``--tokenizer``), and no secret in its errors (``unrecognized arguments: --token hf_...`` is scrubbed)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from ..provenance import scrub


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with ``allow_abbrev=False`` always (sub-commands are built of this class too)
    and errors scrubbed of secrets."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {scrub(message)}\n")
