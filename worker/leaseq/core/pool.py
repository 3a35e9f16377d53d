"""leaseq's connection pool: checked connections, made on demand in the caller's thread.

Why not psycopg_pool: its connections are handed out unchecked (a backend killed by
``pg_terminate_backend``, a PostgreSQL or PgBouncer restart, or an idle timeout hands the
next caller a dead connection, and that caller's statement fails), and it reconnects in the
background on a backoff of 1, 2, 4, 8, 16 s, so a worker stayed cut off for about half an
outage after PostgreSQL was back. Here:

* a connection is handed out only if it is open, idle (no transaction) and has nothing
  unread on its socket (a killed backend has said goodbye and closed; that is readable);
* when no idle connection is usable the caller connects itself, at once: there is no
  reconnect schedule, so the first call after PostgreSQL accepts connections again succeeds;
* a connection given back broken or inside a transaction is closed, never reused.

A connection whose peer vanished without closing (a silent network partition) still looks
usable; its statement fails after the TCP timeout and the caller's retry takes a fresh one.
"""

from __future__ import annotations

import contextlib
import logging
import select
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from leaseq.core.errors import DatabaseUnavailable

log = logging.getLogger("leaseq.pool")

Conn = psycopg.Connection[Any]


class PoolTimeout(psycopg.OperationalError):
    """Every connection of the pool stayed in use for the whole timeout."""


def usable(conn: Conn) -> bool:
    """True if ``conn`` is open, outside any transaction, and nothing arrived on it unasked
    (on a connection that does not LISTEN, unread input means the server closed it)."""
    if conn.closed or conn.broken:
        return False
    if conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError, psycopg.Error):
        return False


class Pool:
    """Up to ``max_size`` autocommit connections to ``conninfo``; ``min_size`` of them are
    opened at once when possible (failures are only logged: the pool also starts while the
    database is down). ``timeout``: how long a caller waits for a free slot, and the connect
    timeout (libpq's minimum is 2 s). ``kwargs`` go to ``psycopg.connect``; ``configure`` runs
    on each new connection before it is first handed out."""

    def __init__(
        self,
        conninfo: str,
        *,
        min_size: int = 0,
        max_size: int = 4,
        name: str = "leaseq",
        timeout: float = 10.0,
        kwargs: dict[str, Any] | None = None,
        configure: Callable[[Conn], None] | None = None,
    ) -> None:
        if not 0 <= min_size <= max_size or max_size < 1:
            raise ValueError("Pool needs 0 <= min_size <= max_size and max_size >= 1")
        self.conninfo = conninfo
        self.name = name
        self.timeout = timeout
        self.max_size = max_size
        self._kwargs = {**(kwargs or {}), "autocommit": True}
        self._configure = configure
        self._slots = threading.BoundedSemaphore(max_size)
        self._lock = threading.Lock()
        self._idle: deque[Conn] = deque()
        self._closed = False
        for _ in range(min_size):
            try:
                self._idle.append(self._connect())
            except (psycopg.Error, DatabaseUnavailable) as exc:
                # Behind a pooler (PgBouncer) the login succeeds while PostgreSQL is down,
                # and ``configure``'s first statement is what fails, already translated.
                log.warning("pool %s: could not connect yet: %s", name, exc)
                break

    def _connect(self) -> Conn:
        conn = psycopg.connect(
            self.conninfo, connect_timeout=max(2, round(self.timeout)), **self._kwargs
        )
        if self._configure is not None:
            try:
                self._configure(conn)
            except BaseException:
                conn.close()
                raise
        return conn

    def _checked_out(self) -> Conn:
        """An idle connection that passes :func:`usable`, else a new one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect()
            if usable(conn):
                return conn
            log.info("pool %s: discarding a dead connection", self.name)
            with contextlib.suppress(Exception):
                conn.close()

    def _give_back(self, conn: Conn) -> None:
        with self._lock:
            keep = not self._closed and not conn.closed and not conn.broken
            keep = keep and conn.info.transaction_status == TransactionStatus.IDLE
            if keep:
                self._idle.append(conn)
                return
        with contextlib.suppress(Exception):
            conn.close()

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[Conn]:
        """A checked connection for the block, given back after it. Raises
        :class:`PoolTimeout` when no slot frees within ``timeout`` (default: the pool's), and
        psycopg's error when a new connection cannot be made."""
        if self._closed:
            raise psycopg.OperationalError(f"the pool {self.name!r} is closed")
        wait = self.timeout if timeout is None else timeout
        if not self._slots.acquire(timeout=wait):
            raise PoolTimeout(f"no connection free in the pool {self.name!r} within {wait}s")
        try:
            conn = self._checked_out()
            try:
                yield conn
            finally:
                self._give_back(conn)
        finally:
            self._slots.release()

    def close(self) -> None:
        """Close idle connections now; connections in use are closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
