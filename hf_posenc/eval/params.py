"""An eval task's parameters as data: a frozen dataclass whose fields say, beside their default, what the command
line says of them (help, how a value is read, choices, group). ``hf_posenc.cli`` makes ``hf-posenc eval NAME``'s
flags from the fields (``--max-windows`` of ``max_windows``; a bool that defaults to True is ``--no-NAME``); the
Python API takes the same names as keywords. Nothing here knows argparse.

    @dataclass(frozen=True)
    class Params:
        lengths: list[int] = param([2048, 4096], "context lengths in tokens.", read=ints)
        docs: Any = documents("test ")

A reader (``read``) turns the flag's text into the value and raises ValueError with a sentence naming what it
expected; the readers shared by the tasks are below.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

HELP, READ, CHOICES, GROUP, METAVAR, DOCUMENTS = "help", "read", "choices", "group", "metavar", "documents"


def param(default: Any, help: str, *, read: Callable[[str], Any] | None = None, choices: tuple | None = None,
          group: str = "evaluation", metavar: str | None = None) -> Any:
    """A field of a Params dataclass with its flag's facts (a list default is copied for each instance)."""
    meta = {HELP: help, READ: read, CHOICES: choices, GROUP: group, METAVAR: metavar}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def documents(purpose: str = "") -> Any:
    """The field of the documents a task reads: flags ``--text-file``, ``--text-dir``, ``--dataset``, ``--corpus``,
    ``--limit`` ... on the command line (a :class:`hf_posenc.io.documents.DocumentSource`); a list of documents, a
    source, or None (the default corpus) from Python. ``purpose`` words the flags' help ("haystack ")."""
    return dataclasses.field(default=None, metadata={DOCUMENTS: purpose, GROUP: "data", HELP: ""})


def fields(params: type) -> list[dataclasses.Field]:
    return list(dataclasses.fields(params))


def documents_field(params: type) -> str | None:
    """The name of ``params``' documents field (None: the task reads no documents)."""
    return next((f.name for f in fields(params) if DOCUMENTS in f.metadata), None)


def build(params: type, keywords: dict[str, Any], what: str, also: list[str] | None = None) -> Any:
    """``params(**keywords)``, an unknown keyword refused by name with the ones ``what`` takes (``also``: the
    other keywords it takes, said beside them)."""
    names = [f.name for f in fields(params)]
    unknown = sorted(set(keywords) - set(names))
    if unknown:
        more = f", and the run's {', '.join(also)}" if also else ""
        raise ValueError(f"{what} got unknown keyword(s) {', '.join(unknown)}; it takes {', '.join(names)}{more}")
    return params(**keywords)


# -- readers: the text of a flag -> its value, or a ValueError saying what was expected ----------------------------
def ints(text: str) -> list[int]:
    """Comma-separated integers >= 1 (lengths, ...), at least one."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"expected one or more comma-separated integers >= 1, got {text!r}")
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise ValueError(f"expected distinct values, got {text!r} ({', '.join(map(str, twice))} more than once)")
    return values


def floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise ValueError(f"expected one or more comma-separated numbers, got {text!r}")
    return values


def depths(text: str) -> list[float]:
    values = floats(text)
    if not all(0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"depths are fractions of the filler between 0 and 1, got {text!r}")
    return values


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {text!r} (leave the flag out for the default)")
    return value


MAX_SEED = 2**32 - 1  # the largest seed every generator a run seeds takes (numpy's; torch's and Python's take more)


def seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number from 0 to {MAX_SEED}, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise ValueError(f"expected a whole number from 0 to {MAX_SEED} (what numpy, torch and Python's random all "
                         f"take as a seed), got {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"expected a number > 0, got {text!r}")
    return value


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def names(text: str) -> list[str]:
    found = [x.strip() for x in text.split(",") if x.strip()]
    if not found:
        raise ValueError(f"expected one or more comma-separated names, got {text!r}")
    repeated = sorted({n for n in found if found.count(n) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} listed more than once in {text!r}")
    return found
