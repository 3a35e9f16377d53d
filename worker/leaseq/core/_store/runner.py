"""What every store class shares, and nothing else: the named statements, loaded once, and the
one place a statement runs and a psycopg error becomes a leaseq error
(:meth:`Runner._execute_text`).

Each face's store class adds the typed methods of its own statements only: :class:`Store`
the jobs', workers', history's and migrations'; ConsoleStore, FlowStore and ScheduleStore
those of console.sql, flow.sql and schedules.sql. None of them carries another's methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg.rows import DictRow, class_row, dict_row

from leaseq.core import moments
from leaseq.core._store import statements
from leaseq.core.errors import translate

Conn = psycopg.Connection[Any]
T = TypeVar("T")
Params = Mapping[str, Any]


class Runner:
    """Runs leaseq's named statements (loaded once) against a given connection."""

    #: Statements whose rows are read in PostgreSQL's binary format (see BINARY_RESULTS).
    _binary_results: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self._statements = statements.load()

    def _execute(
        self,
        conn: Conn,
        name: str,
        params: Params | None,
        factory: Callable[..., Any],
        action: str,
    ) -> list[Any]:
        binary = name in self._binary_results
        return self._execute_text(
            conn, self._statements[name].query, action, params, factory, binary=binary
        )

    def _execute_text(
        self,
        conn: Conn,
        query: bytes,
        action: str,
        params: Params | None = None,
        factory: Callable[..., Any] = dict_row,
        *,
        binary: bool = False,
    ) -> list[Any]:
        # params=None sends the text as a simple query, so a migration's many statements run.
        try:
            with conn.cursor(row_factory=factory, binary=binary) as cur:
                moments.register(cur.adapters)
                cur.execute(query, params)
                return cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise translate(exc, action=action, conninfo=conn.info.dsn) from exc

    def _dicts(self, conn: Conn, name: str, params: Params | None, action: str) -> list[DictRow]:
        return self._execute(conn, name, params, dict_row, action)

    def _typed(self, conn: Conn, name: str, params: Params, cls: type[T], action: str) -> list[T]:
        return self._execute(conn, name, params, class_row(cls), action)
