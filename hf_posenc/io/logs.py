"""Loggers quieted for a block: warnings a user can do nothing about, from a library or from hf_posenc's own
steps that repeat what was said once."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def errors_only(name: str) -> Iterator[None]:
    """The logger ``name`` passes errors only inside the block, then its level is as it was."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
