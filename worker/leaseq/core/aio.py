"""leaseq's asyncio face for producers: enqueue (one, many, or inside the caller's
transaction), get, result / wait_any / as_completed, stream, steps (list and settle), cancel
and retry, on a psycopg_pool ``AsyncConnectionPool`` (or one ``AsyncConnection``).

The same named statements as :class:`leaseq.Queue`, validated the same way, run natively on
the event loop: no threads. Waiting shares one listening connection per event loop and
database (see :mod:`leaseq.core.waiters`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

from leaseq.core import tracing, validation, waiters
from leaseq.core._store.astore import AsyncStore
from leaseq.core._store.store import graph_rows, json_param, pipeline_of
from leaseq.core.adb import AsyncConn, AsyncDb, aborrow, atransaction, conninfo_of
from leaseq.core.errors import JobNotFound, JobStateError, PipelineTimeout, ResultTimeout
from leaseq.core.graph import Dep, Graph, Plan
from leaseq.core.models import (
    STEP_UNCERTAIN_CODE,
    After,
    Cancelled,
    Enqueued,
    GraphEnqueued,
    JobOutcome,
    JobRecord,
    JobStatus,
    PipelineCancelled,
    PipelineOutcome,
    PipelineRecord,
    Signalled,
    StepRecord,
    StreamItem,
    UncertainStep,
    cancelled_of,
)
from leaseq.core.queue import (
    JOIN_PIPELINE,
    NEW_PIPELINE,
    JobSpec,
    checked_plan,
    enqueued,
    single_plan,
    statement_fields,
    unresolvable,
)


class AsyncQueue:
    """The producer API of :class:`leaseq.Queue`, as coroutines."""

    def __init__(self, db: AsyncDb) -> None:
        self._db = db
        self._store = AsyncStore()

    async def enqueue(
        self,
        queue: str,
        job_type: str,
        payload: Any = None,
        *,
        priority: int = 100,
        run_at: datetime | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        dedup_key: str | None = None,
        wait: bool = False,
        key: str | None = None,
        ordering_key: str | None = None,
        trace_context: Mapping[str, str] | None = None,
        after: Iterable[int | Dep] | None = None,
        when: After = After.SUCCEEDED,
        conn: AsyncConn | None = None,
    ) -> Enqueued:
        """As :meth:`leaseq.Queue.enqueue`; ``conn`` (not autocommit) joins its transaction."""
        spec = JobSpec(
            queue=queue,
            job_type=job_type,
            payload=payload,
            priority=priority,
            run_at=run_at,
            delay=delay,
            max_attempts=max_attempts,
            timeout=timeout,
            idempotency_key=idempotency_key,
            dedup_key=dedup_key,
            wait=wait,
            key=key,
            ordering_key=ordering_key,
            trace_context=trace_context,
        )
        if after:
            plan = single_plan(spec, after, when)
            async with atransaction(self._db, "enqueue", conn) as c:
                job_id = (await self._write_plan(c, plan, JOIN_PIPELINE, spec.trace_context))["job"]
                if wait:
                    await self._store.job_watch(c, [job_id])
            return Enqueued(job_id, True)
        return (await self.enqueue_many([spec], conn=conn))[0]

    async def enqueue_graph(self, graph: Graph, *, conn: AsyncConn | None = None) -> GraphEnqueued:
        """As :meth:`leaseq.Queue.enqueue_graph`."""
        plan = checked_plan(graph)
        async with atransaction(self._db, "enqueue", conn) as c:
            return await self._write_plan(c, plan, NEW_PIPELINE)

    async def _write_plan(
        self,
        c: AsyncConn,
        plan: Plan,
        pipeline: str,
        trace_context: Mapping[str, str] | None = None,
    ) -> GraphEnqueued:
        """As :func:`leaseq.core.queue.write_plan`, with the same statements."""
        parents = (
            {r["id"]: r for r in await self._store.deps_lock_parents(c, sorted(plan.external))}
            if plan.external
            else {}
        )
        ids = await self._store.job_ids_reserve(c, len(plan.nodes))
        jobs, deps, wake = graph_rows(plan, ids, parents, None, None)
        pipeline_id: int | None
        if pipeline == NEW_PIPELINE:
            pipeline_id = await self._store.pipeline_create(
                c, name=plan.name, total=len(plan.nodes)
            )
        else:
            pipeline_id = pipeline_of(parents, plan.external)
            if pipeline_id is not None:
                await self._store.pipeline_grow(c, pipeline_id, len(plan.nodes))
        jobs["pipeline_id"] = pipeline_id
        with tracing.enqueue_span(sorted({n.queue for n in plan.nodes}), len(plan.nodes)):
            jobs["trace_context"] = json_param(trace_context or tracing.current_carrier())
            await self._store.graph_insert_jobs(c, jobs)
        if deps["parents"]:
            await self._store.graph_insert_deps(c, deps)
        if wake:
            await self._store.queues_wake(c, wake)
        return GraphEnqueued(pipeline_id, {n.name: i for n, i in zip(plan.nodes, ids, strict=True)})

    async def pipeline(self, pipeline_id: int) -> PipelineRecord:
        """As :meth:`leaseq.Queue.pipeline`."""
        async with aborrow(self._db, "show pipeline") as c:
            found = await self._store.pipeline_get(c, pipeline_id)
        if found is None:
            raise JobStateError(f"pipeline {pipeline_id} does not exist; check the id")
        return found

    async def pipeline_of(self, job_id: int) -> int | None:
        """As :meth:`leaseq.Queue.pipeline_of`."""
        async with aborrow(self._db, "wait") as c:
            found, pipeline_id = await self._store.job_pipeline_of(c, job_id)
        if not found:
            raise JobNotFound(job_id)
        return pipeline_id

    async def wait_pipeline(
        self,
        pipeline_id: int | None = None,
        *,
        job: int | None = None,
        timeout: float | None = None,
        poll: float = waiters.DEFAULT_POLL_SECONDS,
        sinks: int = waiters.DEFAULT_SINKS,
    ) -> PipelineOutcome:
        """As :meth:`leaseq.Queue.wait_pipeline`: woken by the pipeline's finish on the event
        loop's listening connection, no thread."""
        waiters.refuse_in_handler()
        waiters.wait_target(pipeline_id, job, sinks)
        validation.positive("poll", poll)
        if timeout is not None:
            validation.non_negative("timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if job is not None:
            root = await anext(self.as_completed([job], timeout=timeout, poll=poll))
            pipeline_id = await self.pipeline_of(job)
            if pipeline_id is None:
                return waiters.lone_outcome(root)
        assert pipeline_id is not None
        listener = waiters.shared_async_listener(conninfo_of(self._db))
        async with listener.watching([waiters.pipeline_topic(pipeline_id)]) as woken:
            while True:
                # Read after the subscription: a finish that commits later wakes this.
                async with aborrow(self._db, "wait") as c:
                    record = await self._store.pipeline_get(c, pipeline_id)
                    if record is None:
                        raise JobStateError(f"pipeline {pipeline_id} does not exist; check the id")
                    if record.finished:
                        ends = await self._store.pipeline_sinks(c, pipeline_id, limit=sinks + 1)
                        return waiters.pipeline_outcome(record, ends, sinks)
                left = poll if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise PipelineTimeout(pipeline_id, timeout or 0.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), min(left, poll))
                woken.clear()

    async def cancel_pipeline(
        self, pipeline_id: int, *, reason: str | None = None
    ) -> PipelineCancelled:
        """As :meth:`leaseq.Queue.cancel_pipeline`."""
        async with aborrow(self._db, "cancel") as c:
            if await self._store.pipeline_get(c, pipeline_id) is None:
                raise JobStateError(f"pipeline {pipeline_id} does not exist; check the id")
            row = await self._store.pipeline_cancel(c, pipeline_id, reason=reason)
        return PipelineCancelled(pipeline_id, int(row["cancelled"]), int(row["running"]))

    async def enqueue_many(
        self, jobs: Iterable[JobSpec], *, conn: AsyncConn | None = None
    ) -> list[Enqueued]:
        """Enqueue a batch in one transaction: all are written or none is."""
        specs = [spec.validated() for spec in jobs]
        if not specs:
            return []
        with tracing.enqueue_span([s.queue for s in specs], len(specs)) as span:
            carrier = tracing.current_carrier()
            async with atransaction(self._db, "enqueue", conn) as c:
                rows = await self._store.job_enqueue(
                    c, [statement_fields(s, carrier) for s in specs]
                )
            results = enqueued(specs, rows)
            tracing.enqueued(span, [r.job_id for r in results])
        return results

    async def get(self, job_id: int) -> JobRecord:
        async with aborrow(self._db, "show job") as c:
            record = await self._store.job_get(c, job_id)
        if record is None:
            raise JobNotFound(job_id)
        return record

    async def stream(
        self, job_id: int, *, after: int = 0, poll: float = 0.2, page: int = 1000
    ) -> AsyncIterator[StreamItem]:
        """As :meth:`leaseq.Queue.stream`: the job's stream items after offset ``after`` as
        they are written, until the job has finished and every item was yielded."""
        validation.positive("poll", poll)
        validation.stream_window(after, page, "page")
        while True:
            async with aborrow(self._db, "read stream") as c:
                got = await self._store.stream_read(c, job_id, after, page)
            for item in got.items:
                yield item
            if got.items:
                after = got.items[-1].offset
            if got.finished and len(got.items) < page:
                return
            if not got.items:
                await asyncio.sleep(poll)

    async def signal(self, job_id: int, name: str, payload: Any = None) -> Signalled:
        """As :meth:`leaseq.Queue.signal`: send signal ``name`` with ``payload`` to the job."""
        validation.signal_name("name", name)
        validation.json_value("payload", payload, limit=validation.MAX_SIGNAL_BYTES)
        with tracing.signal_span(job_id, name):
            async with aborrow(self._db, "signal") as c:
                row = await self._store.job_signal(c, job_id, name, payload)
        return Signalled(job_id, name, bool(row["stored"]), bool(row["waiting"]))

    async def steps(self, job_id: int) -> list[StepRecord]:
        """As :meth:`leaseq.Queue.steps`."""
        async with aborrow(self._db, "list steps") as c:
            return await self._store.step_list(c, job_id)

    async def resolve_step(
        self,
        job_id: int,
        step: str,
        *,
        result: Any = None,
        retry: bool = False,
        actor: str,
        reason: str,
    ) -> None:
        """As :meth:`leaseq.Queue.resolve_step`."""
        result, actor, reason = validation.step_resolution(
            step, result, retry=retry, actor=actor, reason=reason
        )
        async with aborrow(self._db, "resolve step") as c:
            if await self._store.step_resolve(
                c, job_id, step, result=result, retry=retry, actor=actor, reason=reason
            ):
                return
            record = await self._store.job_get(c, job_id)
            steps = await self._store.step_list(c, job_id) if record else []
        raise unresolvable(job_id, step, record, steps)

    async def uncertain_steps(self, *, limit: int = 100) -> list[UncertainStep]:
        """As :meth:`leaseq.Queue.uncertain_steps`."""
        async with aborrow(self._db, "list uncertain steps") as c:
            return await self._store.steps_uncertain(c, STEP_UNCERTAIN_CODE, limit)

    async def cancel(self, job_id: int, *, reason: str | None = None) -> Cancelled:
        """As :meth:`leaseq.Queue.cancel`."""
        async with aborrow(self._db, "cancel") as c:
            reached = await self._store.job_cancel(c, job_id, reason=reason)
            if any(r.job_id == job_id for r in reached):
                return cancelled_of(job_id, reached, JobStatus.CANCELLED)
            record = await self._store.job_get(c, job_id)
        if record is None:
            raise JobNotFound(job_id)
        return cancelled_of(job_id, reached, record.status)

    async def retry_dead(self, job_id: int, *, attempts: int | None = None) -> int:
        """As :meth:`leaseq.Queue.retry_dead`."""
        if attempts is not None:
            validation.at_least("attempts", attempts, 1)
        async with aborrow(self._db, "retry") as c:
            new_max = await self._store.job_retry_dead(c, job_id, attempts=attempts)
            if new_max is not None:
                return new_max
            record = await self._store.job_get(c, job_id)
        if record is None:
            raise JobNotFound(job_id)
        raise JobStateError(
            f"job {job_id} is {record.status}, not dead; only dead jobs can be retried"
        )

    async def result(
        self,
        job_id: int,
        timeout: float | None = None,
        *,
        cancel_on_timeout: bool = False,
        poll: float = waiters.DEFAULT_POLL_SECONDS,
    ) -> Any:
        """As :meth:`leaseq.Queue.result`."""
        try:
            found = await anext(self.as_completed([job_id], timeout=timeout, poll=poll))
        except ResultTimeout as exc:
            if not cancel_on_timeout:
                raise
            if (await self.cancel(job_id, reason=f"result() timed out after {timeout}s")).cancelled:
                raise ResultTimeout(exc.job_ids, exc.timeout, cancelled=True) from None
            found = await anext(self.as_completed([job_id], timeout=0, poll=poll))
        return waiters.unwrap(found)

    async def wait_any(
        self,
        job_ids: Collection[int],
        timeout: float | None = None,
        *,
        poll: float = waiters.DEFAULT_POLL_SECONDS,
    ) -> JobOutcome:
        """As :meth:`leaseq.Queue.wait_any`."""
        return await anext(self.as_completed(job_ids, timeout=timeout, poll=poll))

    async def as_completed(
        self,
        job_ids: Collection[int],
        timeout: float | None = None,
        *,
        poll: float = waiters.DEFAULT_POLL_SECONDS,
    ) -> AsyncIterator[JobOutcome]:
        """As :meth:`leaseq.Queue.as_completed`."""
        waiters.refuse_in_handler()
        pending = waiters.job_ids(job_ids)
        validation.positive("poll", poll)
        if timeout is not None:
            validation.non_negative("timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        listener = waiters.shared_async_listener(conninfo_of(self._db))
        async with listener.watching(pending) as woken:
            first = True
            while True:
                async with aborrow(self._db, "wait") as c:
                    if first:
                        # After the subscription, before the read: see migration 0011.
                        await self._store.job_watch(c, pending)
                    found = await self._store.job_outcomes(c, pending)
                if first and len(found) < len(pending):
                    raise JobNotFound(min(set(pending) - found.keys()))
                first = False
                for outcome in sorted(
                    (o for o in found.values() if o.finished), key=lambda o: o.job_id
                ):
                    pending.remove(outcome.job_id)
                    yield outcome
                if not pending:
                    return
                left = poll if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise ResultTimeout(pending, timeout or 0.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), min(left, poll))
                woken.clear()
