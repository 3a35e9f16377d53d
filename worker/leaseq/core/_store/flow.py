"""The store's methods for sql/queries/flow.sql: one typed method per statement."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg.rows import DictRow

from leaseq.core._store.runner import Conn, Runner


class FlowStore(Runner):
    """The flow-control statements (flow.sql), and only those."""

    def flow_limit_set(
        self,
        conn: Conn,
        *,
        queue: str,
        pattern: str,
        max_running: int | None,
        weight: float,
        per_second: float | None,
        burst: float | None,
    ) -> int:
        rows = self._dicts(
            conn,
            "flow_limit_set",
            {
                "queue": queue,
                "pattern": pattern,
                "max_running": max_running,
                "weight": weight,
                "per_second": per_second,
                "burst": burst,
            },
            "set limit",
        )
        return int(rows[0]["keys"])

    def flow_limit_remove(self, conn: Conn, *, queue: str, pattern: str) -> int:
        rows = self._dicts(
            conn, "flow_limit_remove", {"queue": queue, "pattern": pattern}, "remove limit"
        )
        return int(rows[0]["keys"])

    def flow_limit_list(self, conn: Conn, *, queue: str | None) -> list[DictRow]:
        return self._dicts(conn, "flow_limit_list", {"queue": queue}, "list limits")

    def flow_repair(self, conn: Conn, *, batch: int) -> list[DictRow]:
        return self._dicts(conn, "flow_repair", {"batch": batch}, "repair flow slots")

    def flow_settle(self, conn: Conn, *, batch: int, ahead: float) -> list[DictRow]:
        return self._dicts(
            conn, "flow_settle", {"batch": batch, "ahead": ahead}, "settle flow keys"
        )

    def flow_repairs_total(self, conn: Conn) -> list[DictRow]:
        return self._dicts(conn, "flow_repairs_total", {}, "read flow repairs")

    def flow_unblock(self, conn: Conn, *, queue: str, ordering_key: str) -> int | None:
        rows = self._dicts(
            conn, "flow_unblock", {"queue": queue, "ordering_key": ordering_key}, "unblock"
        )
        head = rows[0]["head"]
        return None if head is None else int(head)

    def flow_status(
        self,
        conn: Conn,
        *,
        queues: Sequence[str] | None,
        limit: int,
        live_seconds: float,
        now: datetime | None = None,
    ) -> list[DictRow]:
        return self._dicts(
            conn,
            "flow_status",
            {
                "queues": None if queues is None else list(queues),
                "limit": limit,
                "now": now,
                "live_seconds": live_seconds,
            },
            "flow status",
        )

    def flow_blocked(
        self, conn: Conn, *, queues: Sequence[str] | None, limit: int
    ) -> list[DictRow]:
        return self._dicts(
            conn,
            "flow_blocked",
            {"queues": None if queues is None else list(queues), "limit": limit},
            "blocked aggregates",
        )

    def flow_queue_summary(
        self, conn: Conn, *, queues: Sequence[str] | None, now: datetime | None = None
    ) -> list[DictRow]:
        return self._dicts(
            conn,
            "flow_queue_summary",
            {"queues": None if queues is None else list(queues), "now": now},
            "flow summary",
        )

    def flow_resume(self, conn: Conn, *, queue: str, key: str) -> bool:
        rows = self._dicts(conn, "flow_resume", {"queue": queue, "key": key}, "resume key")
        return bool(rows[0]["resumed"])

    def flow_pause(self, conn: Conn, *, queue: str, key: str, until: datetime) -> datetime | None:
        rows = self._dicts(
            conn, "flow_pause", {"queue": queue, "key": key, "until": until}, "pause key"
        )
        return rows[0]["paused_until"] if rows else None
