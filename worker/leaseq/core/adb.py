"""Opening and borrowing asyncio connections, with failures translated to leaseq errors
(the twin of :mod:`leaseq.core.db` for :mod:`leaseq.aio`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from leaseq.core.errors import check_conninfo, translate

AsyncConn = psycopg.AsyncConnection[Any]
#: What the asyncio face runs on: one connection, or a psycopg_pool AsyncConnectionPool.
AsyncDb = AsyncConn | AsyncConnectionPool[AsyncConn]


async def aconnect(conninfo: str, *, action: str, autocommit: bool = True) -> AsyncConn:
    """Open one asyncio connection (autocommit by default); errors as :func:`leaseq.connect`."""
    check_conninfo(conninfo, action=action)
    try:
        return await psycopg.AsyncConnection.connect(conninfo, autocommit=autocommit)
    except psycopg.Error as exc:
        raise translate(exc, action=action, conninfo=conninfo) from exc


def conninfo_of(db: AsyncDb) -> str:
    """The connection string ``db`` connects with (for the listening connection)."""
    if isinstance(db, AsyncConnectionPool):
        return db.conninfo if isinstance(db.conninfo, str) else ""
    return psycopg.conninfo.make_conninfo(db.info.dsn, password=db.info.password or None)


@asynccontextmanager
async def aborrow(
    db: AsyncDb, action: str, conn: AsyncConn | None = None
) -> AsyncIterator[AsyncConn]:
    """A connection for one call: ``conn`` if given (its transaction, if any, is the
    caller's), else ``db`` when it is a connection, else one from the pool."""
    target = conn if conn is not None else db
    if isinstance(target, AsyncConnectionPool):
        try:
            async with target.connection() as pooled:
                yield pooled
        except psycopg.Error as exc:
            info = target.conninfo if isinstance(target.conninfo, str) else ""
            raise translate(exc, action=action, conninfo=info) from exc
    else:
        yield target


@asynccontextmanager
async def atransaction(
    db: AsyncDb, action: str, conn: AsyncConn | None = None
) -> AsyncIterator[AsyncConn]:
    """Like :func:`aborrow`, but the statements inside commit together."""
    async with aborrow(db, action, conn) as c:
        if c.autocommit:
            async with c.transaction():
                yield c
        else:
            yield c
