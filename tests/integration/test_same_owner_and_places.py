"""Fencing by token alone (the stale caller has the same worker id as the new holder), jobs
that keep their place when handed back or reaped, and the jitter in every backoff."""

from __future__ import annotations

from datetime import timedelta

import leaseq
from leaseq.core.backoff import Backoff
from support.dbtime import claim_one, db_now


def test_a_stale_token_held_by_the_same_worker_id_is_fenced(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """A worker that restarts under the same id (a StatefulSet pod, a fixed --worker-id)
    reclaims its own expired job: only the token tells its two attempts apart."""
    now = db_now(conn)
    queue.enqueue("q", "t", now=now)
    old = claim_one(queue, owner="pod-0", lease_seconds=5, now=now)
    queue.reap(now=now + timedelta(seconds=6))
    later = now + timedelta(hours=1)
    new = claim_one(queue, owner="pod-0", lease_seconds=5, now=later)
    assert (new.lease.owner, new.lease.token) == ("pod-0", old.lease.token + 1)
    at = later + timedelta(seconds=1)

    beat = queue.heartbeat(old.lease, lease_seconds=5, progress={"stale": True}, now=at)
    assert beat.status is leaseq.HeartbeatStatus.LOST
    assert queue.checkpoint(old.lease, {"stale": True}, now=at) is False
    running = leaseq.JobStatus.RUNNING
    assert queue.complete(old.lease, {"by": "old"}, now=at) == leaseq.Fenced(
        old.id, leaseq.Call.COMPLETE, running
    )
    assert queue.fail(old.lease, "stale", now=at) == leaseq.Fenced(
        old.id, leaseq.Call.FAIL, running
    )
    assert queue.release(old.lease, now=at) == leaseq.Fenced(old.id, leaseq.Call.RELEASE, running)

    record = queue.get(old.id)
    assert (record.status, record.lease_token, record.progress, record.checkpoint) == (
        "running", new.lease.token, None, None
    )  # fmt: skip
    assert queue.complete(new.lease, {"by": "new"}, now=at) == leaseq.Completed(old.id, None, False)
    assert queue.get(old.id).result == {"by": "new"}


def _two_jobs(queue: leaseq.Queue, conn: leaseq.core.db.Conn) -> tuple[int, int]:
    now = db_now(conn)
    first = queue.enqueue("q", "t", now=now - timedelta(seconds=10)).job_id
    second = queue.enqueue("q", "t", now=now - timedelta(seconds=5)).job_id
    return first, second


def test_a_released_job_keeps_its_place(queue: leaseq.Queue, conn: leaseq.core.db.Conn) -> None:
    first, _ = _two_jobs(queue, conn)
    job = claim_one(queue, owner="A")
    assert job.id == first
    assert isinstance(queue.release(job.lease), leaseq.Released)
    assert claim_one(queue, owner="B").id == first


def test_a_reaped_job_keeps_its_place(queue: leaseq.Queue, conn: leaseq.core.db.Conn) -> None:
    first, _ = _two_jobs(queue, conn)
    now = db_now(conn)
    job = claim_one(queue, owner="A", lease_seconds=1, now=now)
    assert job.id == first
    [reaped] = queue.reap(now=now + timedelta(seconds=2))
    assert reaped.job_id == first
    assert claim_one(queue, owner="B", now=now + timedelta(seconds=2)).id == first


def test_retry_delays_are_jittered(conn: leaseq.core.db.Conn) -> None:
    """fail()'s backoff draws each delay from [d/2, d]: many workers never retry in step."""
    rows = conn.execute(
        "SELECT extract(epoch FROM leaseq.retry_delay(3, 2.0, 600.0))::float8"
        " FROM generate_series(1, 200)"
    ).fetchall()
    delays = [float(r[0]) for r in rows]
    assert all(4.0 <= d <= 8.0 for d in delays)
    assert len(set(delays)) > 150
    assert min(delays) < 4.5
    assert max(delays) > 7.5


def test_worker_backoffs_are_jittered() -> None:
    """Two workers' reconnect and idle loops started together drift apart at once."""
    firsts = {Backoff(1.0, 60.0).next() for _ in range(200)}
    assert len(firsts) > 150
    assert all(0.5 <= d <= 1.0 for d in firsts)
    assert min(firsts) < 0.6
    assert max(firsts) > 0.9
