"""Job streams (ctx.emit, Queue.stream, leaseq.stream_read) against a real PostgreSQL:
appended in order by the lease holder only, capped, read from any offset until the job ends."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest
from psycopg_pool import AsyncConnectionPool

import leaseq
from leaseq.aio import AsyncQueue
from leaseq.runtime.context import Interrupted, JobContext
from support.dbtime import claim_one, db_now


def context(queue: leaseq.Queue, job: leaseq.ClaimedJob) -> JobContext:
    return JobContext(job, queue, job.lease.owner, threading.Event())


def test_items_are_read_from_any_offset_and_the_stream_ends_with_the_job(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    job = claim_one(queue)
    ctx = context(queue, job)
    assert [ctx.emit({"page": n}) for n in (1, 2, 3)] == [1, 2, 3]
    page = queue.stream_page(job_id)
    assert (len(page.items), page.finished) == (3, False)
    queue.complete(job.lease, "done")
    items = list(queue.stream(job_id, after=1, page=1))
    assert items == [leaseq.StreamItem(2, {"page": 2}), leaseq.StreamItem(3, {"page": 3})]
    assert list(queue.stream(job_id, after=3)) == []
    # Any language: one SQL function, one snapshot.
    rows = conn.execute("SELECT seq, value, finished FROM leaseq.stream_read(%s, 2)", [job_id])
    assert rows.fetchall() == [(3, {"page": 3}, True)]
    assert list(queue.stream(10**9)) == []  # no such job: nothing, at once


def test_a_stale_attempt_appends_nothing(queue: leaseq.Queue, conn: leaseq.core.db.Conn) -> None:
    job_id = queue.enqueue("q", "t").job_id
    stale = context(queue, claim_one(queue))
    assert stale.emit("first") == 1
    later = db_now(conn) + timedelta(seconds=120)
    queue.reap(now=later)
    current = context(queue, claim_one(queue, "w2", now=later))
    with pytest.raises(Interrupted, match="lease lost"):
        stale.emit("stale")
    assert current.emit("second") == 2
    assert [i.value for i in queue.stream_page(job_id).items] == ["first", "second"]


def test_a_stream_is_capped_and_refuses_null(
    queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leaseq.core.queue, "MAX_STREAM_ITEMS", 2)
    queue.enqueue("q", "t")
    ctx = context(queue, claim_one(queue))
    with pytest.raises(leaseq.InvalidJob, match="must not be null"):
        ctx.emit(None)
    with pytest.raises(leaseq.InvalidJob, match="is 65540 bytes as JSON; the limit is 65536"):
        ctx.emit("x" * 65538)
    ctx.emit(1)
    ctx.emit(2)
    with pytest.raises(leaseq.LeaseqError, match="stream is full"):
        ctx.emit(3)


def test_the_asyncio_twin_follows_a_live_stream_to_its_end(
    queue: leaseq.Queue, database_url: str
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    job = claim_one(queue)
    ctx = context(queue, job)
    ctx.emit("a")

    async def main() -> list[leaseq.StreamItem]:
        async with AsyncConnectionPool(
            database_url, min_size=1, max_size=2, kwargs={"autocommit": True}
        ) as apool:
            seen = []
            async for item in AsyncQueue(apool).stream(job_id, poll=0.05):
                seen.append(item)
                if item.offset == 1:
                    # Written while the reader waits: it reads on, then sees the end.
                    await asyncio.to_thread(ctx.emit, "b")
                    await asyncio.to_thread(queue.complete, job.lease)
            return seen

    assert asyncio.run(main()) == [leaseq.StreamItem(1, "a"), leaseq.StreamItem(2, "b")]


@pytest.mark.parametrize(
    ("after", "page", "field"),
    [(0, 2**31, "page"), (0, 0, "page"), (2**63, 10, "after"), (-1, 10, "after")],
)
def test_a_read_past_what_a_stream_holds_is_refused_by_name(
    queue: leaseq.Queue, database_url: str, after: int, page: int, field: str
) -> None:
    """A page of 2**31 once reached PostgreSQL as a bigint that leaseq.stream_read does not
    take, and the error said the schema needed migrating (issue 59)."""
    job_id = queue.enqueue("q", "t").job_id
    with pytest.raises(leaseq.InvalidJob, match=field):
        next(queue.stream(job_id, after=after, page=page))
    limit_field = "limit" if field == "page" else field
    with pytest.raises(leaseq.InvalidJob, match=limit_field):
        queue.stream_page(job_id, after=after, limit=page)

    async def main() -> None:
        async with AsyncConnectionPool(
            database_url, min_size=1, max_size=1, kwargs={"autocommit": True}
        ) as apool:
            with pytest.raises(leaseq.InvalidJob, match=field):
                await anext(AsyncQueue(apool).stream(job_id, after=after, page=page))

    asyncio.run(main())
    assert queue.stream_page(job_id, limit=10_000).items == []
