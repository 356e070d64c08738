"""Small pieces of wording shared by messages, reports and cards."""

from __future__ import annotations

from typing import Sequence


def first_names(names: Sequence[str], shown: int = 5) -> str:
    """``a, b, c and 4 more``: the first ``shown`` of ``names``, in the order given, and how many more there are."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
