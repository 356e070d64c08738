"""SIGTERM handled like Ctrl-C: a command stopped by ``kill`` (a scheduler's time limit, a container stopping)
unwinds, so that its locks are released and its staged folders removed, as on any other failure.

Python drops an exception raised inside a ``__del__`` or another callback it cannot raise from ("Exception ignored
in ..."), and a signal's handler runs wherever the main thread is: a SIGTERM that lands in a finalizer (a ``regex``
object's, between two forwards) was lost, and the command computed on. A :class:`Terminated` dropped that way is
raised again, in ordinary code, a moment later (SIGALRM, armed only then)."""

from __future__ import annotations

import os
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
    """Within the block, SIGTERM and SIGINT wait; the first that came meanwhile is handled when the block ends, by
    the handler that was in place (its exception raised from there; under the default action the signal is sent
    again). For steps that must happen together: taking a lock and recording it, two renames. Done on Python's
    handlers, not the thread's signal mask: a signal sent to the process may be delivered to any of its threads
    (torch's among them), and Python runs its handler in the main thread at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (Python runs handlers in the main thread only; there nothing changes)
        return
    came: list[tuple[int, object]] = []
    kinds = [s for s in (signal.SIGTERM, signal.SIGINT) if signal.getsignal(s) is not None]  # (None: not Python's)
    before = {s: signal.signal(s, lambda signum, frame: came.append((signum, frame))) for s in kinds}
    try:
        yield
    finally:
        for kind, handler in before.items():
            signal.signal(kind, handler)
        if came:
            _handle(before[came[0][0]], *came[0])


def _handle(handler, signum: int, frame) -> None:
    """What ``handler`` (a signal's handler as :func:`signal.getsignal` gives it) does with ``signum``."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)
