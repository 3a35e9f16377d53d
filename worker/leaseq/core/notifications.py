"""Wake-ups: ``NOTIFY leaseq_jobs, '<queue>'`` is sent when a job becomes ready; a worker
LISTENs on a dedicated connection to claim promptly instead of at its next poll."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from leaseq.core._store.store import Store
from leaseq.core.db import Conn, connect
from leaseq.core.errors import translate

CHANNEL = "leaseq_jobs"


class Subscription:
    """One LISTENing connection; :meth:`receive` yields the queues named by notifications."""

    def __init__(self, conn: Conn, conninfo: str) -> None:
        self._conn = conn
        self._conninfo = conninfo

    def receive(self, timeout: float) -> Iterator[str]:
        """Queue names notified within ``timeout`` seconds; raises a leaseq error when the
        connection is lost."""
        try:
            for note in self._conn.notifies(timeout=timeout):
                yield note.payload
        except psycopg.Error as exc:
            raise translate(exc, action="listen", conninfo=self._conninfo) from exc


class Notifications:
    """Subscriptions to wake-ups, each on a connection of its own to ``conninfo``."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._store = Store()

    @contextmanager
    def subscribe(self) -> Iterator[Subscription]:
        """Open a dedicated autocommit connection, LISTEN on it, and close it after the block."""
        with connect(self._conninfo, action="listen") as conn:
            self._store.worker_listen(conn)
            yield Subscription(conn, self._conninfo)
