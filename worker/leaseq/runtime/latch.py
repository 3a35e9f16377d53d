"""A flag that is set once and never cleared, with :class:`threading.Event`'s ``set``,
``is_set`` and ``wait``, that costs one small object until somebody waits on it.

Every attempt carries two (its stop flag and its settled flag) and almost none is ever
waited on: a no-op job ends before anyone looks. An Event builds a Condition in Python for
each (a fifth of a worker's per-job CPU at 64 slots); a latch builds one only for a waiter.
"""

from __future__ import annotations

import threading

# One lock for every latch: it is held only to create or fetch a waiter's Event, never
# while waiting, so latches of different attempts never hold each other up for long.
_events = threading.Lock()


class Latch:
    """Set once, never cleared. Safe from any thread."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Set the flag and wake every waiter, present or about to wait."""
        self._set = True
        with _events:
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set or ``timeout`` seconds pass; returns the flag."""
        if self._set:
            return True
        with _events:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        # set() may have run between the first check and the Event's creation, and found
        # no Event to wake: the flag it wrote first is seen here.
        if self._set:
            return True
        return event.wait(timeout)
