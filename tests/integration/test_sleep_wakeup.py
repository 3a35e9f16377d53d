"""A durable sleep's hand-back tells listeners when its job wakes (issue 60): NOTIFY
leaseq_jobs '<queue> <seconds> <job type>', the seconds counted by the database from its
now to the wake time, or '<queue>' when the job is claimable at once. Time is moved with
``now=``; nothing sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

import leaseq
from leaseq.core.notifications import Wakeup, parse
from support.dbtime import claim_one, db_now
from support.wakeups import Listening, listening, notified


@pytest.fixture
def listener(database_url: str) -> Iterator[Listening]:
    with listening(database_url) as conn:
        yield conn


def held(
    conn: leaseq.core.db.Conn, queue: leaseq.Queue, listener: Listening, job_type: str, lease: float
) -> tuple[leaseq.ClaimedJob, datetime]:
    """A job of ``job_type`` enqueued and claimed at database time t0 for ``lease`` seconds,
    its enqueue's wake-up read; the job and t0."""
    queue.enqueue("q", job_type)
    t0 = db_now(conn)
    job = claim_one(queue, lease_seconds=lease, now=t0)
    notified(listener)
    return job, t0


def test_a_sleep_notifies_its_queue_type_and_the_seconds_to_its_wake_in_database_time(
    conn: leaseq.core.db.Conn, queue: leaseq.Queue, listener: Listening
) -> None:
    job, t0 = held(conn, queue, listener, "send mail", 60)
    # The handler asked for a wake 5 s after t0 and hands back 1.5 s after t0 (its clock is
    # not asked: the seconds are the database's, from the hand-back's now).
    slept = queue.sleep(job.lease, t0 + timedelta(seconds=5), now=t0 + timedelta(seconds=1.5))
    assert isinstance(slept, leaseq.Released)
    [payload] = notified(listener)
    assert parse(payload) == Wakeup("q", 3.5, "send mail")
    assert queue.get(job.id).available_at == t0 + timedelta(seconds=5)


def test_a_sleep_whose_wake_has_passed_notifies_its_queue_as_claimable_now(
    conn: leaseq.core.db.Conn, queue: leaseq.Queue, listener: Listening
) -> None:
    job, t0 = held(conn, queue, listener, "nap", 60)
    queue.sleep(job.lease, t0 + timedelta(seconds=1), now=t0 + timedelta(seconds=2))
    assert notified(listener) == ["q"]


def test_a_refused_sleep_notifies_nothing(
    conn: leaseq.core.db.Conn, queue: leaseq.Queue, listener: Listening
) -> None:
    job, t0 = held(conn, queue, listener, "nap", 1)
    late = queue.sleep(job.lease, t0 + timedelta(seconds=9), now=t0 + timedelta(seconds=2))
    assert isinstance(late, leaseq.Fenced)
    assert notified(listener) == []
