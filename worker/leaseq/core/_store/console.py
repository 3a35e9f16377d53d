"""The store's methods for sql/queries/console.sql: one typed method per statement (the
audited bulk actions share one, which an enum of theirs directs)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from leaseq.core._store.runner import Conn, Runner
from leaseq.core._store.store import json_param

Row = dict[str, Any]


class BulkAction(enum.StrEnum):
    """The console's audited bulk statements (console.sql): each changes the jobs of the
    ids (or the filter) that are still in the state it acts on, and records who and why."""

    RETRY_DEAD = "console_retry_dead"
    CANCEL = "console_cancel"

    @property
    def label(self) -> str:
        """What it does, as its transaction and its errors name it."""
        return _BULK_LABELS[self]


# Every action has its own: a new one without a label fails at its first use, not under
# another action's name.
_BULK_LABELS = {
    BulkAction.RETRY_DEAD: "console: retry dead jobs",
    BulkAction.CANCEL: "console: cancel jobs",
}


def _rows(rows: list[DictRow]) -> list[Row]:
    return [dict(r) for r in rows]


class ConsoleStore(Runner):
    """The console's statements (console.sql), and only those."""

    def console_bounds(self, conn: Conn, *, seconds: float) -> None:
        """Bound the current transaction (statement, lock and idle waits) to ``seconds``."""
        ms = max(1, round(seconds * 1000))
        self._dicts(conn, "console_bounds", {"ms": ms}, "console")

    def console_role(self, conn: Conn) -> Row:
        return dict(self._dicts(conn, "console_role", {}, "console")[0])

    def console_privileges(self, conn: Conn) -> Row:
        return dict(self._dicts(conn, "console_privileges", {}, "console: check role")[0])

    def console_queues(
        self, conn: Conn, *, limit: int, scan: int, rank_cap: int, now: datetime | None
    ) -> tuple[list[str], int]:
        """The most backed-up queues (at most ``limit``) and how many were found."""
        params = {"limit": limit, "scan": scan, "rank_cap": rank_cap, "now": now}
        rows = self._dicts(conn, "console_queues", params, "console: list queues")
        return [str(r["queue"]) for r in rows], int(rows[0]["found"]) if rows else 0

    def console_queue_panel(
        self, conn: Conn, *, queue: str, cap: int, live_seconds: float, now: datetime | None
    ) -> Row:
        params = {"queue": queue, "cap": cap, "live_seconds": live_seconds, "now": now}
        return dict(self._dicts(conn, "console_queue_panel", params, "console: overview")[0])

    def console_id_bounds(self, conn: Conn) -> tuple[int | None, int | None]:
        row = self._dicts(conn, "console_id_bounds", {}, "console: jobs")[0]
        return row["low"], row["high"]

    def console_id_below(self, conn: Conn, *, before: int) -> int | None:
        row = self._dicts(conn, "console_id_below", {"before": before}, "console: jobs")[0]
        value: int | None = row["id"]
        return value

    def console_jobs(self, conn: Conn, params: Mapping[str, Any]) -> list[Row]:
        return _rows(self._dicts(conn, "console_jobs", params, "console: jobs"))

    def console_job(self, conn: Conn, *, job_id: int, max_bytes: int) -> Row | None:
        params = {"id": job_id, "max_bytes": max_bytes}
        rows = self._dicts(conn, "console_job", params, "console: job")
        return dict(rows[0]) if rows else None

    def console_job_attempts(self, conn: Conn, *, job_id: int, limit: int) -> list[Row]:
        params = {"id": job_id, "limit": limit}
        return _rows(self._dicts(conn, "console_job_attempts", params, "console: attempts"))

    def console_job_steps(
        self, conn: Conn, *, job_id: int, after: str, limit: int, max_bytes: int
    ) -> list[Row]:
        params = {"id": job_id, "after": after, "limit": limit, "max_bytes": max_bytes}
        return _rows(self._dicts(conn, "console_job_steps", params, "console: job steps"))

    def console_job_step_state(self, conn: Conn, *, job_id: int, name: str) -> Row | None:
        params = {"id": job_id, "name": name}
        rows = self._dicts(conn, "console_job_step_state", params, "console: job step")
        return dict(rows[0]) if rows else None

    def console_job_step_facts(self, conn: Conn, *, job_id: int, cap: int) -> Row:
        params = {"id": job_id, "cap": cap}
        return dict(self._dicts(conn, "console_job_step_facts", params, "console: job steps")[0])

    def console_held(self, conn: Conn, *, limit: int) -> list[Row]:
        return _rows(self._dicts(conn, "console_held", {"limit": limit}, "console: held jobs"))

    def console_dead(self, conn: Conn, params: Mapping[str, Any]) -> list[Row]:
        return _rows(self._dicts(conn, "console_dead", params, "console: dead jobs"))

    def console_dead_count(self, conn: Conn, params: Mapping[str, Any]) -> Row:
        return dict(self._dicts(conn, "console_dead_count", params, "console: dead jobs")[0])

    def console_pending(self, conn: Conn, params: Mapping[str, Any]) -> Row:
        return dict(self._dicts(conn, "console_pending", params, "console: pending jobs")[0])

    def console_bulk(
        self,
        conn: Conn,
        *,
        action: BulkAction,
        ids: Sequence[int],
        actor: str,
        reason: str,
        filter: Mapping[str, Any] | None,
    ) -> list[int]:
        """Runs one of the console's audited bulk statements: the ids it changed."""
        params = {
            "ids": list(ids),
            "actor": actor,
            "reason": reason,
            "filter": None if filter is None else Jsonb(dict(filter)),
        }
        rows = self._dicts(conn, action.value, params, action.label)
        return [int(r["id"]) for r in rows]

    def console_workers(self, conn: Conn, *, limit: int, now: datetime | None) -> list[Row]:
        params = {"limit": limit, "now": now}
        return _rows(self._dicts(conn, "console_workers", params, "console: workers"))

    def console_schedules(self, conn: Conn, *, limit: int) -> list[Row]:
        return _rows(self._dicts(conn, "console_schedules", {"limit": limit}, "console: schedules"))

    def console_audit(self, conn: Conn, *, limit: int) -> list[Row]:
        return _rows(self._dicts(conn, "console_audit", {"limit": limit}, "console: audit"))

    def console_job_links(self, conn: Conn, *, job_id: int) -> Row | None:
        rows = self._dicts(conn, "console_job_links", {"id": job_id}, "console: job links")
        return dict(rows[0]) if rows else None

    def console_job_parents(self, conn: Conn, *, job_id: int, after: int, limit: int) -> list[Row]:
        params = {"id": job_id, "after": after, "limit": limit}
        return _rows(self._dicts(conn, "console_job_parents", params, "console: job parents"))

    def console_job_children(self, conn: Conn, *, job_id: int, after: int, limit: int) -> list[Row]:
        params = {"id": job_id, "after": after, "limit": limit}
        return _rows(self._dicts(conn, "console_job_children", params, "console: job children"))

    def console_pipelines(
        self, conn: Conn, *, before: int | None, unfinished: bool, limit: int
    ) -> list[Row]:
        params = {"before": before, "unfinished": unfinished, "limit": limit}
        return _rows(self._dicts(conn, "console_pipelines", params, "console: pipelines"))

    def console_pipeline(self, conn: Conn, *, pipeline_id: int) -> Row | None:
        rows = self._dicts(conn, "console_pipeline", {"id": pipeline_id}, "console: pipeline")
        return dict(rows[0]) if rows else None

    def console_pipeline_jobs(
        self,
        conn: Conn,
        *,
        pipeline_id: int,
        after: int,
        status: str | None,
        window: int,
        limit: int,
    ) -> list[Row]:
        params = {
            "id": pipeline_id, "after": after, "status": status, "window": window, "limit": limit,
        }  # fmt: skip
        return _rows(self._dicts(conn, "console_pipeline_jobs", params, "console: pipeline jobs"))

    def console_cancel_pipeline(
        self, conn: Conn, *, pipeline_id: int, actor: str, reason: str
    ) -> Row:
        params = {"id": pipeline_id, "actor": actor, "reason": reason}
        rows = self._dicts(conn, "console_cancel_pipeline", params, "console: cancel pipeline")
        return dict(rows[0])

    def console_resolve_step(
        self,
        conn: Conn,
        *,
        job_id: int,
        step: str,
        result: Any,
        retry: bool,
        actor: str,
        reason: str,
    ) -> bool:
        """True when the uncertain step was settled (and its job made pending again)."""
        params = {
            "id": job_id,
            "name": step,
            "result": json_param(result),
            "retry": retry,
            "actor": actor,
            "reason": reason,
        }
        return bool(self._dicts(conn, "console_resolve_step", params, "console: resolve step"))

    def console_flow_limits(self, conn: Conn, params: Mapping[str, Any]) -> list[Row]:
        return _rows(self._dicts(conn, "console_flow_limits", params, "console: flow limits"))

    def console_flow_keys(self, conn: Conn, params: Mapping[str, Any]) -> list[Row]:
        return _rows(self._dicts(conn, "console_flow_keys", params, "console: flow keys"))

    def console_flow_holders(self, conn: Conn, params: Mapping[str, Any]) -> list[Row]:
        return _rows(self._dicts(conn, "console_flow_holders", params, "console: flow holders"))

    def console_flow_blocked(self, conn: Conn, params: Mapping[str, Any]) -> list[Row]:
        return _rows(self._dicts(conn, "console_flow_blocked", params, "console: flow blocked"))

    def registered_console_role(self, conn: Conn, *, role: str) -> Row | None:
        """The registered console role (``role``, and ``same``: it is the given one), or None."""
        rows = self._dicts(conn, "registered_console_role", {"role": role}, "grant console")
        return dict(rows[0]) if rows else None

    def console_grants_apply(self, conn: Conn, *, role: str | None, admin: bool) -> list[str]:
        params = {"role": role, "admin": admin}
        rows = self._dicts(conn, "console_grants_apply", params, "grant console")
        return [str(r["statement"]) for r in rows]
