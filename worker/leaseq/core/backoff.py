"""Jittered exponential backoff for the worker's idle polling and reconnect loops."""

from __future__ import annotations

import random

# One generator for every Backoff: seeding a new one from the OS costs more than a job does.
_SHARED = random.Random()


class Backoff:
    """Delays that double from ``base`` up to ``cap``, each drawn uniformly from the upper half
    of the current step (``[d/2, d]``) so that many workers never retry in lockstep.

    Not thread-safe: each loop owns its own instance.
    """

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        if not 0 < base <= cap:
            raise ValueError("Backoff needs 0 < base <= cap")
        self.base = base
        self.cap = cap
        self._step = base
        self._rng = rng or _SHARED

    def next(self) -> float:
        """The next delay in seconds, in ``[step/2, step]``; the step then doubles up to cap."""
        step = self._step
        self._step = min(self.cap, step * 2)
        return step / 2 + self._rng.random() * step / 2

    def reset(self) -> None:
        """Start again from ``base`` (after a success)."""
        self._step = self.base
