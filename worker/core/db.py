"""Opening connections and pools, with connection failures translated to leaseq errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from leaseq.core.errors import check_conninfo, translate

Conn = psycopg.Connection[Any]
#: What every face runs on: one connection, or a pool it borrows one from per call.
Db = Conn | ConnectionPool[Conn]


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
    configure: Callable[[Conn], None] | None = None,
) -> ConnectionPool[Conn]:
    """A pool of autocommit connections. Connections are made in the background; a call that
    cannot get one within ``timeout`` seconds fails with DatabaseUnavailable. ``configure``
    runs on each new connection before it is first handed out. A malformed ``conninfo`` is
    refused here (ConfigError), before the pool could log it."""
    check_conninfo(conninfo, action="connect")
    return ConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        name=name,
        timeout=timeout,
        kwargs={"autocommit": True},
        configure=configure,
        open=True,
    )


@contextmanager
def borrow(db: Db, action: str, conn: Conn | None = None) -> Iterator[Conn]:
    """A connection for one call: ``conn`` if given, else ``db`` itself when it is a
    connection, else one from the pool (autocommit, returned after the call).

    A given connection is used as it is: in autocommit mode each call commits on its own;
    otherwise the call joins the connection's transaction and the caller commits. A pool that
    cannot hand out a connection raises the translated leaseq error for ``action``."""
    target = conn if conn is not None else db
    if isinstance(target, ConnectionPool):
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
    ``conn`` keeps its caller's transaction)."""
    with borrow(db, action, conn) as c:
        if c.autocommit:
            with c.transaction():
                yield c
        else:
            yield c
