"""Signals, turned into something the worker's main thread can wait on safely.

The Python-level handler only counts (no locks: a handler that set a threading.Event could
deadlock against the very thread it interrupts); ``signal.set_wakeup_fd`` wakes the main
thread's ``select`` at once. The worker reads the count: one signal drains, two release now.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import time
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalWatch:
    """Counts SIGTERM/SIGINT (after :meth:`install`) and :meth:`trigger` calls."""

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self.count = 0
        self._previous: dict[int, object] = {}
        self._previous_fd: int | None = None

    def install(self) -> None:
        """Handle SIGTERM and SIGINT from now on (main thread only)."""
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        if self._previous_fd is not None:
            signal.set_wakeup_fd(self._previous_fd)
        self._previous.clear()

    def retire(self) -> None:
        """Uninstall, and ignore SIGTERM and SIGINT from now on (main thread only): the
        process is exiting after its clean stop, and a late signal (a supervisor's second
        SIGTERM, systemd's or a runner's) must not turn exit status 0 into 143. The
        defaults would end it, as they would not a PID 1."""
        # Straight from counting to ignoring: restoring the defaults first would leave a
        # window in which the signal kills.
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        self._previous.clear()
        self.uninstall()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1

    def trigger(self) -> None:
        """Act as if a signal arrived (for embedding the worker, and for tests)."""
        self.count += 1
        # A full socket means a wake-up is pending anyway.
        with contextlib.suppress(BlockingIOError):
            self._write.send(b"\0")

    def wait(self, seen: int, timeout: float | None) -> int:
        """Block until more than ``seen`` signals arrived or ``timeout`` passed; the count."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.count <= seen:
            remaining = None if end is None else end - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            ready, _, _ = select.select([self._read], [], [], remaining)
            if ready:
                with contextlib.suppress(BlockingIOError):
                    self._read.recv(4096)
        return self.count

    def close(self) -> None:
        self._read.close()
        self._write.close()
