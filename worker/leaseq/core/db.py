"""Opening connections and pools, with connection failures translated to leaseq errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from leaseq.core.errors import check_conninfo, translate
from leaseq.core.pool import Conn, Pool

__all__ = [
    "UNPREPARED",
    "Conn",
    "Db",
    "borrow",
    "connect",
    "open_pool",
    "replaceable",
    "transaction",
]

#: What every face runs on: one connection, or a pool it borrows one from per call
#: (leaseq's own :class:`Pool`, or a psycopg_pool ``ConnectionPool`` the caller made).
Db = Conn | Pool | ConnectionPool[Conn]
#: Connection options that turn server-side prepared statements off: a transaction-pooling
#: PgBouncer before 1.21 hands each transaction a different server connection, where
#: psycopg's prepared statements do not exist, or already do.
UNPREPARED: dict[str, Any] = {"prepare_threshold": None}


def connect(conninfo: str, *, action: str, autocommit: bool = True, **kwargs: Any) -> Conn:
    """Open one connection (autocommit by default: every leaseq statement is its own transaction).

    Raises :class:`leaseq.core.errors.DatabaseUnavailable` naming host and port when
    unreachable, :class:`leaseq.core.errors.ConfigError` (quoting none of it) when malformed.
    """
    check_conninfo(conninfo, action=action)
    try:
        return psycopg.connect(conninfo, autocommit=autocommit, **kwargs)
    except psycopg.Error as exc:
        raise translate(exc, action=action, conninfo=conninfo) from exc


def open_pool(
    conninfo: str,
    *,
    min_size: int = 1,
    max_size: int = 4,
    name: str = "leaseq",
    timeout: float = 10.0,
    prepare: bool = True,
    configure: Callable[[Conn], None] | None = None,
) -> Pool:
    """A pool of checked autocommit connections (see :mod:`leaseq.core.pool`): a call that
    cannot get a free one within ``timeout`` seconds, or cannot connect, fails with
    DatabaseUnavailable; the first call after the database is back reconnects at once.
    ``prepare=False`` turns server-side prepared statements off (for PgBouncer < 1.21);
    ``configure`` runs on each new connection before it is first handed out. A malformed
    ``conninfo`` is refused here (ConfigError), before the pool could log it."""
    check_conninfo(conninfo, action="connect")
    return Pool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        name=name,
        timeout=timeout,
        kwargs=None if prepare else UNPREPARED,
        configure=configure,
    )


def replaceable(db: Db) -> bool:
    """True when ``db`` is a pool, so a call whose connection dropped can take another."""
    return isinstance(db, Pool | ConnectionPool)


@contextmanager
def borrow(db: Db, action: str, conn: Conn | None = None) -> Iterator[Conn]:
    """A connection for one call: ``conn`` if given, else ``db`` itself when it is a
    connection, else one from the pool (autocommit, returned after the call).

    A given connection is used as it is: in autocommit mode each call commits on its own;
    otherwise the call joins the connection's transaction and the caller commits. A pool that
    cannot hand out a connection raises the translated leaseq error for ``action``."""
    target = conn if conn is not None else db
    if isinstance(target, Pool | ConnectionPool):
        try:
            with target.connection() as pooled:
                yield pooled
        except psycopg.Error as exc:
            info = target.conninfo if isinstance(target.conninfo, str) else ""
            raise translate(exc, action=action, conninfo=info) from exc
    else:
        yield target


@contextmanager
def transaction(db: Db, action: str, conn: Conn | None = None) -> Iterator[Conn]:
    """Like :func:`borrow`, but the statements run inside commit together (a non-autocommit
    ``conn`` keeps its caller's transaction). A failed commit raises the translated leaseq
    error for ``action``, as a failed statement does."""
    with borrow(db, action, conn) as c:
        if c.autocommit:
            # The commit itself can fail (the server went away between the last statement
            # and COMMIT): on a plain connection nothing else would translate that error.
            try:
                with c.transaction():
                    yield c
            except psycopg.Error as exc:
                raise translate(exc, action=action, conninfo=c.info.dsn) from exc
        else:
            yield c
