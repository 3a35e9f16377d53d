"""The asyncio twin of :class:`leaseq.core._store.store.Store` for what producers do: the
same named statements (the same parsed text), run on an ``AsyncConnection``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import DictRow, class_row, dict_row
from psycopg.types.json import Jsonb

from leaseq.core import moments
from leaseq.core._store import statements
from leaseq.core._store.runner import Params
from leaseq.core._store.store import enqueue_params, json_param, outcome, stream_page
from leaseq.core.errors import translate
from leaseq.core.models import (
    CancelledJob,
    JobOutcome,
    JobRecord,
    PipelineRecord,
    StepRecord,
    StreamPage,
    UncertainStep,
)

AsyncConn = psycopg.AsyncConnection[Any]
T = TypeVar("T")


class AsyncStore:
    """Runs leaseq's named producer statements against a given asyncio connection."""

    def __init__(self) -> None:
        self._statements = statements.load()

    async def _execute(
        self, conn: AsyncConn, name: str, params: Params, factory: Callable[..., Any], action: str
    ) -> list[Any]:
        try:
            async with conn.cursor(row_factory=factory) as cur:
                moments.register(cur.adapters)
                await cur.execute(self._statements[name].query, params)
                return await cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise translate(exc, action=action, conninfo=conn.info.dsn) from exc

    async def _dicts(
        self, conn: AsyncConn, name: str, params: Params, action: str
    ) -> list[DictRow]:
        return await self._execute(conn, name, params, dict_row, action)

    async def job_enqueue(
        self, conn: AsyncConn, jobs: Sequence[Params], now: datetime | None = None
    ) -> list[DictRow | None]:
        """As :meth:`Store.job_enqueue`: one pipelined round trip, a row (or None) per job."""
        query = self._statements["job_enqueue"].query
        results: list[DictRow | None] = []
        try:
            async with conn.cursor(row_factory=dict_row) as cur:
                moments.register(cur.adapters)
                await cur.executemany(query, enqueue_params(jobs, now), returning=True)
                while True:
                    results.append(await cur.fetchone())
                    if not cur.nextset():
                        break
        except psycopg.Error as exc:
            raise translate(exc, action="enqueue", conninfo=conn.info.dsn) from exc
        return results

    async def stream_read(self, conn: AsyncConn, job_id: int, after: int, limit: int) -> StreamPage:
        rows = await self._dicts(
            conn, "stream_read", {"id": job_id, "after": after, "limit": limit}, "read stream"
        )
        return stream_page(rows)

    async def job_signal(self, conn: AsyncConn, job_id: int, name: str, payload: Any) -> DictRow:
        """As :meth:`Store.job_signal`."""
        params = {"id": job_id, "name": name, "payload": Jsonb(payload)}
        [row] = await self._dicts(conn, "job_signal", params, "signal")
        return row

    async def job_get(self, conn: AsyncConn, job_id: int) -> JobRecord | None:
        rows = await self._execute(
            conn, "job_get", {"id": job_id}, class_row(JobRecord), "show job"
        )
        return rows[0] if rows else None

    async def step_list(self, conn: AsyncConn, job_id: int) -> list[StepRecord]:
        return await self._execute(
            conn, "step_list", {"id": job_id}, class_row(StepRecord), "list steps"
        )

    async def step_resolve(
        self,
        conn: AsyncConn,
        job_id: int,
        name: str,
        *,
        result: Any,
        retry: bool,
        actor: str,
        reason: str,
    ) -> bool:
        """As :meth:`Store.step_resolve`."""
        rows = await self._dicts(
            conn,
            "step_resolve",
            {
                "id": job_id,
                "name": name,
                "result": json_param(result),
                "retry": retry,
                "actor": actor,
                "reason": reason,
                "now": None,
            },
            "resolve step",
        )
        return bool(rows)

    async def steps_uncertain(
        self, conn: AsyncConn, error_code: str, limit: int
    ) -> list[UncertainStep]:
        return await self._execute(
            conn,
            "steps_uncertain",
            {"error_code": error_code, "limit": limit},
            class_row(UncertainStep),
            "list uncertain steps",
        )

    async def job_cancel(
        self, conn: AsyncConn, job_id: int, *, reason: str | None
    ) -> list[CancelledJob]:
        """As :meth:`leaseq.core._store.store.Store.job_cancel`."""
        rows = await self._dicts(
            conn, "job_cancel", {"id": job_id, "reason": reason, "now": None}, "cancel"
        )
        return [CancelledJob(r["id"], r["previous_status"], r["ancestor"]) for r in rows]

    async def job_retry_dead(
        self, conn: AsyncConn, job_id: int, *, attempts: int | None
    ) -> int | None:
        """The job's new max_attempts when revived; None when it was not dead."""
        rows = await self._dicts(
            conn, "job_retry_dead", {"id": job_id, "attempts": attempts, "now": None}, "retry"
        )
        return int(rows[0]["max_attempts"]) if rows else None

    async def waiter_listen(self, conn: AsyncConn) -> None:
        await self._dicts(conn, "waiter_listen", {}, "listen")

    async def job_watch(self, conn: AsyncConn, ids: Sequence[int]) -> None:
        await self._dicts(conn, "job_watch", {"ids": list(ids)}, "wait")

    async def job_outcomes(self, conn: AsyncConn, ids: Sequence[int]) -> dict[int, JobOutcome]:
        rows = await self._dicts(conn, "job_outcomes", {"ids": list(ids)}, "wait")
        return {int(r["id"]): outcome(r) for r in rows}

    # -- pipelines (sql/queries/pipelines.sql), as in Store ------------------------------

    async def deps_lock_parents(self, conn: AsyncConn, ids: Sequence[int]) -> list[DictRow]:
        return await self._dicts(conn, "deps_lock_parents", {"ids": list(ids)}, "enqueue")

    async def job_ids_reserve(self, conn: AsyncConn, n: int) -> list[int]:
        rows = await self._dicts(conn, "job_ids_reserve", {"n": n}, "enqueue")
        return [int(r["id"]) for r in rows]

    async def pipeline_create(self, conn: AsyncConn, *, name: str, total: int) -> int:
        params = {"name": name, "total": total, "now": None}
        rows = await self._dicts(conn, "pipeline_create", params, "enqueue")
        return int(rows[0]["id"])

    async def pipeline_grow(self, conn: AsyncConn, pipeline_id: int, n: int) -> None:
        await self._dicts(conn, "pipeline_grow", {"id": pipeline_id, "n": n}, "enqueue")

    async def graph_insert_jobs(self, conn: AsyncConn, params: Params) -> None:
        await self._dicts(conn, "graph_insert_jobs", params, "enqueue")

    async def graph_insert_deps(self, conn: AsyncConn, params: Params) -> None:
        await self._dicts(conn, "graph_insert_deps", params, "enqueue")

    async def queues_wake(self, conn: AsyncConn, queues: Sequence[str]) -> None:
        await self._dicts(conn, "queues_wake", {"queues": list(queues)}, "enqueue")

    async def pipeline_cancel(
        self, conn: AsyncConn, pipeline_id: int, *, reason: str | None
    ) -> DictRow:
        params = {"id": pipeline_id, "reason": reason, "now": None}
        rows = await self._dicts(conn, "pipeline_cancel", params, "cancel")
        return rows[0]

    async def pipeline_sinks(
        self, conn: AsyncConn, pipeline_id: int, *, limit: int
    ) -> list[JobOutcome]:
        rows = await self._dicts(
            conn, "pipeline_sinks", {"id": pipeline_id, "limit": limit}, "wait"
        )
        return [outcome(r) for r in reversed(rows)]

    async def job_pipeline_of(self, conn: AsyncConn, job_id: int) -> tuple[bool, int | None]:
        rows = await self._dicts(conn, "job_pipeline_of", {"id": job_id}, "wait")
        return (False, None) if not rows else (True, rows[0]["pipeline_id"])

    async def pipeline_get(self, conn: AsyncConn, pipeline_id: int) -> PipelineRecord | None:
        rows = await self._execute(
            conn, "pipeline_get", {"id": pipeline_id}, class_row(PipelineRecord), "show pipeline"
        )
        return rows[0] if rows else None
