"""SIGTERM handled like Ctrl-C: a command stopped by ``kill`` (a scheduler's time limit, a container stopping)
unwinds, so that its locks are released and its staged folders removed, as on any other failure.

Python drops an exception raised inside a ``__del__`` or another callback it cannot raise from ("Exception ignored
in ..."), and a signal's handler runs wherever the main thread is: a SIGTERM that lands in a finalizer (a ``regex``
object's, between two forwards) was lost, and the command computed on. A :class:`Terminated` dropped that way is
raised again, in ordinary code, a moment later (SIGALRM, armed only then)."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

AGAIN_AFTER = 0.01  # seconds before a dropped interruption is raised again


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interruption."""


@contextmanager
def sigterm_interrupts():
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (elsewhere: nothing changes), and
    again where Python dropped it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Terminated(f"signal {int(signal.SIGTERM)}")

    def dropped(unraisable):
        if isinstance(unraisable.exc_value, Terminated):  # raised in a finalizer: Python would go on
            signal.setitimer(signal.ITIMER_REAL, AGAIN_AFTER)
            return
        hook(unraisable)

    before, alarm, hook = signal.signal(signal.SIGTERM, interrupt), signal.signal(signal.SIGALRM, interrupt), \
        sys.unraisablehook
    sys.unraisablehook = dropped
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGALRM, alarm)
        sys.unraisablehook = hook


@contextmanager
def deferred_interrupts():
    """Within the block, SIGTERM and SIGINT wait; one that came meanwhile is handled when the block ends, as the
    signals are let through again (its exception is raised from there). For steps that must happen together:
    taking a lock and recording it, two renames."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
