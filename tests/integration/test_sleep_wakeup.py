"""A durable sleep's hand-back tells listeners when its job wakes (issue 60): NOTIFY
leaseq_jobs '<queue> <seconds> <job type>', the seconds counted by the database from its
now to the wake time, or '<queue>' when the job is claimable at once. Time is moved with
``now=``; nothing sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

import leaseq
from leaseq.core.notifications import Wakeup, parse
from support.dbtime import claim_one, db_now


def notified(listener: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """The wake-ups sent since the last call (a marker sent last arrives last)."""
    listener.execute("SELECT pg_notify('leaseq_jobs', 'marker')")
    got: list[str] = []
    for n in listener.notifies(timeout=30):
        if n.payload == "marker":
            return got
        got.append(n.payload)
    raise AssertionError("the marker never arrived")


@pytest.fixture
def listener(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    conn = psycopg.connect(database_url, autocommit=True)
    conn.execute("LISTEN leaseq_jobs")
    yield conn
    conn.close()


def test_a_sleep_notifies_its_queue_type_and_the_seconds_to_its_wake_in_database_time(
    conn: leaseq.core.db.Conn,
    queue: leaseq.Queue,
    listener: psycopg.Connection[tuple[object, ...]],
) -> None:
    queue.enqueue("q", "send mail")
    t0 = db_now(conn)
    job = claim_one(queue, lease_seconds=60, now=t0)
    notified(listener)  # the enqueue's

    # The handler asked for a wake 5 s after t0 and hands back 1.5 s after t0 (its clock is
    # not asked: the seconds are the database's, from the hand-back's now).
    slept = queue.sleep(job.lease, t0 + timedelta(seconds=5), now=t0 + timedelta(seconds=1.5))
    assert isinstance(slept, leaseq.Released)
    [payload] = notified(listener)
    assert parse(payload) == Wakeup("q", 3.5, "send mail")
    assert queue.get(job.id).available_at == t0 + timedelta(seconds=5)


def test_a_sleep_whose_wake_has_passed_notifies_its_queue_as_claimable_now(
    conn: leaseq.core.db.Conn,
    queue: leaseq.Queue,
    listener: psycopg.Connection[tuple[object, ...]],
) -> None:
    queue.enqueue("q", "nap")
    t0 = db_now(conn)
    job = claim_one(queue, lease_seconds=60, now=t0)
    notified(listener)
    queue.sleep(job.lease, t0 + timedelta(seconds=1), now=t0 + timedelta(seconds=2))
    assert notified(listener) == ["q"]


def test_a_refused_sleep_notifies_nothing(
    conn: leaseq.core.db.Conn,
    queue: leaseq.Queue,
    listener: psycopg.Connection[tuple[object, ...]],
) -> None:
    queue.enqueue("q", "nap")
    t0 = db_now(conn)
    job = claim_one(queue, lease_seconds=1, now=t0)
    notified(listener)
    late = queue.sleep(job.lease, t0 + timedelta(seconds=9), now=t0 + timedelta(seconds=2))
    assert isinstance(late, leaseq.Fenced)
    assert notified(listener) == []
