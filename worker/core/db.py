"""Opening connections and pools, with connection failures translated to leaseq errors."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from leaseq.core.errors import translate

Conn = psycopg.Connection[Any]


def connect(conninfo: str, *, action: str, autocommit: bool = True, **kwargs: Any) -> Conn:
    """Open one connection (autocommit by default: every leaseq statement is its own transaction).

    Raises :class:`leaseq.core.errors.DatabaseUnavailable` naming host and port when unreachable.
    """
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
) -> ConnectionPool[Conn]:
    """A pool of autocommit connections. Connections are made in the background; a call that
    cannot get one within ``timeout`` seconds fails with DatabaseUnavailable."""
    return ConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        name=name,
        timeout=timeout,
        kwargs={"autocommit": True},
        open=True,
    )
