"""The store's methods for sql/queries/schedules.sql: one typed method per statement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from leaseq.core._store.runner import Conn, Runner
from leaseq.core.schedule_models import DueRow, ScheduleOrigin, ScheduleSpec


class ScheduleStore(Runner):
    """The schedule statements (schedules.sql), and only those."""

    def schedule_put(
        self,
        conn: Conn,
        spec: ScheduleSpec,
        *,
        declared_by: ScheduleOrigin,
        declared_in: str | None,
        now: datetime | None = None,
    ) -> DictRow | None:
        """Row with ``name`` and ``created``; None when the name belongs to the other origin."""
        rows = self._dicts(
            conn,
            "schedule_put",
            {
                "name": spec.name,
                "cron": spec.cron,
                "timezone": spec.timezone,
                "queue": spec.queue,
                "job_type": spec.job_type,
                "payload": Jsonb(spec.payload),
                "priority": spec.priority,
                "max_attempts": spec.max_attempts,
                "overlap": spec.overlap,
                "catchup_seconds": spec.catchup_seconds,
                "declared_by": declared_by,
                "declared_in": declared_in,
                "now": now,
            },
            "declare schedule",
        )
        return rows[0] if rows else None

    def schedule_disable_undeclared(
        self, conn: Conn, *, app: str, names: Sequence[str], now: datetime | None = None
    ) -> list[str]:
        rows = self._dicts(
            conn,
            "schedule_disable_undeclared",
            {"app": app, "names": list(names), "now": now},
            "disable schedules",
        )
        return [str(r["name"]) for r in rows]

    def schedule_set_paused(
        self, conn: Conn, *, name: str, paused: bool, now: datetime | None = None
    ) -> bool:
        """False when there is no such schedule."""
        rows = self._dicts(
            conn,
            "schedule_set_paused",
            {"name": name, "paused": paused, "now": now},
            "pause schedule" if paused else "resume schedule",
        )
        return bool(rows)

    def schedule_delete(self, conn: Conn, *, name: str) -> bool:
        """False when there is no such schedule."""
        return bool(self._dicts(conn, "schedule_delete", {"name": name}, "remove schedule"))

    def schedule_list(
        self, conn: Conn, *, name: str | None = None, now: datetime | None = None
    ) -> list[DictRow]:
        return self._dicts(conn, "schedule_list", {"name": name, "now": now}, "list schedules")

    def schedule_due(self, conn: Conn, *, now: datetime | None = None) -> list[DictRow]:
        return self._dicts(conn, "schedule_due", {"now": now}, "read schedules")

    def pool_due(
        self, conn: Conn, *, queues: Sequence[str], horizon: float, now: datetime | None = None
    ) -> list[DueRow]:
        params = {"queues": list(queues), "horizon": horizon, "now": now}
        return self._typed(conn, "pool_due", params, DueRow, "read what is due")

    def schedule_fire(
        self,
        conn: Conn,
        *,
        name: str,
        slot: datetime,
        version: datetime,
        missed: int,
        trace_context: Mapping[str, str] | None = None,
        now: datetime | None = None,
    ) -> DictRow | None:
        """Row with ``slot``, ``outcome`` and ``job_id``; None when the slot was already
        recorded or the schedule changed (or was paused) since ``version``. The job carries
        ``trace_context``."""
        params = {
            "name": name,
            "slot": slot,
            "version": version,
            "missed": missed,
            "trace_context": None if trace_context is None else Jsonb(trace_context),
            "now": now,
        }
        rows = self._dicts(conn, "schedule_fire", params, "fire schedule")
        return rows[0] if rows else None
