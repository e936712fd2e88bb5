"""Ctrl-C held back while Orbax starts, waits for or ends a save, so that an interrupt cannot leave it half begun.

Python raises ``KeyboardInterrupt`` at whatever line the main thread runs. Inside Orbax's ``save`` (its write
threads started, its record of them not yet) or its ``wait_until_finished``, the interrupted manager no longer
knows of the write under way: its ``close`` returns without it, a ``NN.orbax-checkpoint-tmp`` directory is left,
and the write's threads meet the interpreter's teardown (pages of tracebacks, a process that never exits, or
``terminate called … FATAL: exception not rethrown``). Inside `deferred_interrupt` a first Ctrl-C is noted and
raised when the block ends (the save begun, or the write on disk); a second one is raised at once.

A Ctrl-C whose ``KeyboardInterrupt`` is raised in a callback whose errors Python only reports (JAX's
garbage-collection callback) is printed as "Exception ignored in …" and lost: the command trains on.
`raise_swallowed_interrupts` raises it again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """SIGINT's handler called at the end of the block rather than inside it (main thread only; elsewhere, and
    where SIGINT is ignored or left to the system, nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        yield
        return
    caught: list[tuple[int, object]] = []

    def note(signum, frame) -> None:
        if caught:  # a second Ctrl-C: the user will not wait
            previous(signum, frame)
        caught.append((signum, frame))

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        previous(*caught[0])


def raise_swallowed_interrupts() -> None:
    """A ``KeyboardInterrupt`` Python can only report (an unraisable exception) is raised again in the main thread,
    by a SIGINT sent once the callback is over, instead of being printed."""
    previous = sys.unraisablehook
    if getattr(previous, "raises_interrupts", False):
        return

    pending = threading.Event()  # one SIGINT for the interrupts of one collection (its start and stop callbacks)

    def interrupt() -> None:
        pending.clear()
        os.kill(os.getpid(), signal.SIGINT)

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous(unraisable)
        elif not pending.is_set():
            pending.set()
            threading.Timer(0.05, interrupt).start()

    hook.raises_interrupts = True
    sys.unraisablehook = hook
