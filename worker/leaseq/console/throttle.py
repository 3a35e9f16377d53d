"""Failed sign-ins counted per client address, so a password cannot be guessed at full speed.

Memory is bounded: at most ``max_clients`` addresses are remembered (the least recently
failing one is forgotten first), each as a window start and a count.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

#: Failed sign-ins allowed per address within one window.
FAILURES = 5
#: The window, in seconds: counted from an address's first failure in it.
WINDOW_SECONDS = 60.0
#: Addresses remembered at most.
MAX_CLIENTS = 10_000


class FailedLogins:
    """Per client address: after ``limit`` failures within ``window`` seconds of the first,
    every sign-in from it is refused until the window ends."""

    def __init__(
        self,
        *,
        limit: int = FAILURES,
        window: float = WINDOW_SECONDS,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = limit
        self._window = window
        self._max = max_clients
        self._clock = clock
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def window(self) -> float:
        """Seconds an address stays blocked, counted from its first failure."""
        return self._window

    def blocked_for(self, client: str) -> float:
        """Seconds until ``client`` may try again (0: it may now)."""
        with self._lock:
            entry = self._seen.get(client)
            if entry is None:
                return 0.0
            start, count = entry
            left = start + self._window - self._clock()
            if left <= 0:
                del self._seen[client]
                return 0.0
            return left if count >= self._limit else 0.0

    def failed(self, client: str) -> bool:
        """Count one failed sign-in of ``client``; True when this one blocks it."""
        with self._lock:
            now = self._clock()
            start, count = self._seen.pop(client, (now, 0))
            if now - start >= self._window:
                start, count = now, 0
            self._seen[client] = (start, count + 1)
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)
            return count + 1 == self._limit

    def succeeded(self, client: str) -> None:
        """Forget ``client``'s failures (it signed in)."""
        with self._lock:
            self._seen.pop(client, None)

    def __len__(self) -> int:
        return len(self._seen)
