"""What /healthz and /readyz report: are the loops turning, and is PostgreSQL answering."""

from __future__ import annotations

import threading
import time

from leaseq.core.errors import (
    ConfigError,
    DatabaseUnavailable,
    LeaseqError,
    PermissionDenied,
    SchemaNotReady,
    SchemaTooNew,
)

#: Failed database calls after which this worker cannot take work, so it is not ready: the
#: database is gone, or it refuses this worker (its role lost a privilege, the schema moved).
NOT_READY_ERRORS = (DatabaseUnavailable, PermissionDenied, SchemaNotReady, SchemaTooNew)


class Health:
    """Loops call :meth:`tick` every turn; database calls report success or failure.

    Healthy: every registered loop turned within its allowance (a loop blocked on a slow
    database call is still alive; only a dead or wedged thread fails it). Ready: the most
    recent database call succeeded, on_startup has finished and the worker is not draining.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._allowance: dict[str, float] = {}
        self._ticks: dict[str, float] = {}
        self._db_error: str | None = "not connected yet"
        self.draining = False
        self.loading = False  # True while on_startup runs: alive, but not ready for work

    def expect(self, loop: str, allowance: float) -> None:
        """Register ``loop``: it must tick at least every ``allowance`` seconds."""
        with self._lock:
            self._allowance[loop] = allowance
            self._ticks[loop] = time.monotonic()

    def forget(self, loop: str) -> None:
        """``loop`` ended on purpose: stop expecting ticks from it."""
        with self._lock:
            self._allowance.pop(loop, None)

    def tick(self, loop: str) -> None:
        with self._lock:
            self._ticks[loop] = time.monotonic()

    def db_ok(self) -> None:
        with self._lock:
            self._db_error = None

    def db_failed(self, exc: LeaseqError) -> None:
        with self._lock:
            self._db_error = _what_failed(exc)

    def healthy(self) -> tuple[bool, str]:
        now = time.monotonic()
        with self._lock:
            stale = [
                f"{loop} loop silent for {now - self._ticks[loop]:.0f}s"
                for loop, allowance in self._allowance.items()
                if now - self._ticks[loop] > allowance
            ]
        return (not stale), ("; ".join(stale) or "ok")

    def ready(self) -> tuple[bool, str]:
        with self._lock:
            error = self._db_error
        if self.draining:
            return False, "draining"
        if error is not None:
            return False, f"database: {error}"
        if self.loading:
            return False, "loading: on_startup has not finished"
        return True, "ok"


def _what_failed(exc: LeaseqError) -> str:
    """What /readyz says about a failed database call: the kind of failure and where, never
    the server's own text (that is in the log, redacted)."""
    if isinstance(exc, DatabaseUnavailable):
        return f"unreachable at {exc.host}:{exc.port}"
    if isinstance(exc, SchemaNotReady | SchemaTooNew):
        return "schema is not at this leaseq's version (run leaseq migrate)"
    if isinstance(exc, PermissionDenied):
        return "the worker's database role lacks a privilege (see the log)"
    if isinstance(exc, ConfigError):
        return "the database URL cannot be used (see the log)"
    return f"{type(exc).__name__} (see the log)"
