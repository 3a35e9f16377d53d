"""Durable steps driven by hand against a real PostgreSQL: a handler's context over a claimed
job, a crash inside a step (its intent committed, no outcome), and the next attempt after the
lease expired."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

import leaseq
from leaseq.runtime.context import JobContext
from support.dbtime import claim_one, db_now


class Crash(BaseException):
    """Stands for the process dying inside a step: no handler code runs after it."""


def context(queue: leaseq.Queue, job: leaseq.ClaimedJob) -> JobContext:
    return JobContext(job, queue, job.lease.owner, threading.Event())


def take_over(queue: leaseq.Queue, conn: leaseq.core.db.Conn, owner: str) -> leaseq.ClaimedJob:
    """The job's lease expires (in the reaper's and claimer's view of time) and ``owner``
    claims it: the next attempt."""
    later = db_now(conn) + timedelta(seconds=120)
    assert queue.reap(now=later)
    return claim_one(queue, owner, now=later)


def crash_in(ctx: JobContext, name: str, effect: list[str], **options: Any) -> None:
    def charge() -> dict[str, str]:
        effect.append(ctx.step_key)
        raise Crash

    with pytest.raises(Crash):
        ctx.step(name, charge, **options)


def stop_uncertain(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, first: JobContext, name: str
) -> None:
    """Attempt ``first`` dies inside step ``name``; the next attempt finds the step uncertain
    and the job stops (dead, StepUncertain), as a worker leaves it."""
    crash_in(first, name, [])
    attempt = take_over(queue, conn, "w2")
    with pytest.raises(leaseq.StepUncertain) as raised:
        context(queue, attempt).step(name, lambda: pytest.fail("ran again"))
    queue.fail(attempt.lease, str(raised.value), retryable=False, error_code="StepUncertain")
