"""The times at which jobs handed back for later become claimable: the listener's alarm clock.

A durable sleep's hand-back notifies when its job wakes (leaseq.core.notifications); the
listener keeps those times and wakes the dispatcher at each, so a sleeping job is claimed at
its wake time instead of at some idle worker's next poll. The times are this process's
monotonic clock, each the notification's arrival plus the seconds the database computed
from its own now: a skewed wall clock on either side moves nothing.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

#: Times kept at most; past that the latest are forgotten (each is still found by a poll).
LIMIT = 1024


class WakeTimes:
    """Sorted future wake times, at most ``limit``. Not thread-safe: the listener owns it."""

    def __init__(self, limit: int = LIMIT, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._clock = clock
        self._times: list[float] = []

    def __len__(self) -> int:
        return len(self._times)

    def add(self, in_seconds: float) -> None:
        """Keep the time ``in_seconds`` from now; when more than ``limit`` are kept, the
        latest goes (the poll finds its job)."""
        bisect.insort(self._times, self._clock() + in_seconds)
        del self._times[self._limit :]

    def due(self) -> bool:
        """Whether any kept time has come; forgets every one that has, so each time wakes
        once, and many at once wake once."""
        came = bisect.bisect_right(self._times, self._clock())
        del self._times[:came]
        return came > 0

    def wait(self, longest: float) -> float:
        """Seconds until the earliest kept time (0 when it has come), at most ``longest``."""
        if not self._times:
            return longest
        return max(0.0, min(longest, self._times[0] - self._clock()))
