"""Opening connections and pools, with connection failures translated to leaseq errors."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from leaseq.core.errors import DatabaseUnavailable, refusal, translate

Conn = psycopg.Connection[Any]
#: What every face runs on: one connection, or a pool it borrows one from per call.
Db = Conn | ConnectionPool[Conn]


def connect(conninfo: str, *, action: str, autocommit: bool = True, **kwargs: Any) -> Conn:
    """Open one connection (autocommit by default: every leaseq statement is its own transaction).

    Raises :class:`leaseq.core.errors.DatabaseUnavailable` naming host and port when unreachable.
    """
    try:
        return psycopg.connect(conninfo, autocommit=autocommit, **kwargs)
    except psycopg.Error as exc:
        raise translate(exc, action=action, conninfo=conninfo) from exc


class Pool(ConnectionPool[Conn]):
    """A psycopg ``ConnectionPool`` that remembers why its last attempt to connect failed
    (:attr:`connect_error`, None once a connection succeeds), so a caller waiting for a
    connection learns the cause instead of only a timeout."""

    connect_error: psycopg.Error | None = None

    def _connect(self, timeout: float | None = None) -> Conn:
        # psycopg_pool's one place that opens connections, in its background workers.
        try:
            conn = super()._connect(timeout)
        except psycopg.Error as exc:
            self.connect_error = exc
            raise
        self.connect_error = None
        return conn


def open_pool(
    conninfo: str,
    *,
    min_size: int = 1,
    max_size: int = 4,
    name: str = "leaseq",
    timeout: float = 10.0,
    configure: Callable[[Conn], None] | None = None,
) -> Pool:
    """A pool of autocommit connections. Connections are made in the background; a call that
    cannot get one within ``timeout`` seconds fails with DatabaseUnavailable saying why, and
    at once when PostgreSQL refused the login or has no such database. ``configure`` runs
    on each new connection before it is first handed out."""
    return Pool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        name=name,
        timeout=timeout,
        kwargs={"autocommit": True},
        configure=configure,
        open=True,
    )


# How often a caller waiting for a pooled connection checks whether the pool's connection
# attempts are being refused for good (a wrong password does not fix itself in 10 s).
_CHECK_EVERY = 0.2


def _checkout(pool: ConnectionPool[Conn], action: str) -> Conn:
    """A connection from ``pool`` within its timeout, else the translated reason: the pool's
    last connection error when there is one (raised at once when it is a refused login or a
    missing database), else the pool's timeout (every connection busy)."""
    info = pool.conninfo if isinstance(pool.conninfo, str) else ""
    deadline = time.monotonic() + pool.timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return pool.getconn(timeout=max(0.001, min(_CHECK_EVERY, left)))
        except PoolTimeout as exc:
            cause = getattr(pool, "connect_error", None)
            final = left <= _CHECK_EVERY
            if cause is not None and (final or refusal(cause) is not DatabaseUnavailable):
                raise translate(cause, action=action, conninfo=info) from exc
            if final:
                busy = PoolTimeout(f"no free connection in pool {pool.name!r} in {pool.timeout:g}s")
                raise translate(busy, action=action, conninfo=info) from exc
        except psycopg.Error as exc:
            raise translate(exc, action=action, conninfo=info) from exc


@contextmanager
def borrow(db: Db, action: str, conn: Conn | None = None) -> Iterator[Conn]:
    """A connection for one call: ``conn`` if given, else ``db`` itself when it is a
    connection, else one from the pool (autocommit, returned after the call).

    A given connection is used as it is: in autocommit mode each call commits on its own;
    otherwise the call joins the connection's transaction and the caller commits. A pool that
    cannot hand out a connection raises the translated leaseq error for ``action``."""
    target = conn if conn is not None else db
    if not isinstance(target, ConnectionPool):
        yield target
        return
    pooled = _checkout(target, action)
    try:
        with pooled:  # the pool's own `connection()` does the same: commit, or roll back
            yield pooled
    except psycopg.Error as exc:
        info = target.conninfo if isinstance(target.conninfo, str) else ""
        raise translate(exc, action=action, conninfo=info) from exc
    finally:
        target.putconn(pooled)


@contextmanager
def transaction(db: Db, action: str, conn: Conn | None = None) -> Iterator[Conn]:
    """Like :func:`borrow`, but the statements run inside commit together (a non-autocommit
    ``conn`` keeps its caller's transaction)."""
    with borrow(db, action, conn) as c:
        if c.autocommit:
            with c.transaction():
                yield c
        else:
            yield c
