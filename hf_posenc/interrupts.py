"""SIGTERM handled like Ctrl-C: a command stopped by ``kill`` (a scheduler's time limit, a container stopping)
unwinds, so that its locks are released and its staged folders removed, as on any other failure."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interruption."""


@contextmanager
def sigterm_interrupts():
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (elsewhere: nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Terminated(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
