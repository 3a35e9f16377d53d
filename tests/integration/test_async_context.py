"""The awaitable forms of a handler's ctx calls (``step_async``, ``sleep_async``,
``sleep_until_async``, ``wait_for_async``, ``emit_async``, ``checkpoint_async``) against a
real PostgreSQL: while one waits for a row lock held from another connection, a second task
on the same event loop keeps running (it is the one that sees the wait and ends it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.runtime.context import JobContext, Suspended
from support.dbtime import claim_one, db_now
from support.steps import context

#: Every wait here is bounded: a blocked loop fails the test instead of hanging it.
BOUND = 60.0
#: The blocker's transaction ends itself after this long idle (its session is closed by the
#: server): if the call held the loop, the lock is freed only so, after the call ended,
#: and the watcher never sees the call waiting.
BLOCKER_IDLE_LIMIT = "20s"

Call = Callable[[JobContext, datetime], Awaitable[Any]]

#: Each awaitable ctx call with what it ends in: a value, or the exception that ends the attempt.
CALLS: dict[str, tuple[Call, Any]] = {
    "step_async": (lambda ctx, now: ctx.step_async("fetch", lambda: 7), 7),
    "sleep_async": (lambda ctx, now: ctx.sleep_async(600), leaseq.Sleeping),
    "sleep_until_async": (
        lambda ctx, now: ctx.sleep_until_async(now + timedelta(seconds=600)),
        leaseq.Sleeping,
    ),
    "wait_for_async": (lambda ctx, now: ctx.wait_for_async("go", timeout=600), leaseq.Waiting),
    "emit_async": (lambda ctx, now: ctx.emit_async({"page": 1}), 1),
    "checkpoint_async": (lambda ctx, now: ctx.checkpoint_async({"page": 1}), True),
}


async def call_waits_for_a_lock(watcher: psycopg.AsyncConnection[Any]) -> bool:
    cursor = await watcher.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE NOT l.granted AND a.datname = current_database()"
    )
    row = await cursor.fetchone()
    return row is not None and row[0] > 0


@pytest.mark.parametrize("name", list(CALLS))
def test_an_awaitable_ctx_call_waiting_on_a_lock_leaves_the_loop_running(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, database_url: str, name: str
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    ctx = context(queue, claim_one(queue))
    make, expected = CALLS[name]
    now = db_now(conn)

    async def scenario() -> Any:
        blocker = await psycopg.AsyncConnection.connect(database_url)
        watcher = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
        async with blocker, watcher:
            await blocker.execute(
                f"SET idle_in_transaction_session_timeout = '{BLOCKER_IDLE_LIMIT}'"
            )
            await blocker.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", (job_id,))
            call = asyncio.ensure_future(make(ctx, now))
            # This task runs only if the call left the loop free while it waits.
            async with asyncio.timeout(BOUND):
                while not await call_waits_for_a_lock(watcher):
                    await asyncio.sleep(0.01)
            assert not call.done()
            await blocker.commit()
            async with asyncio.timeout(BOUND):
                try:
                    return await call
                except Suspended as ended:
                    return ended

    outcome = asyncio.run(scenario())
    if isinstance(expected, type):
        assert isinstance(outcome, expected)
    else:
        assert outcome == expected
