"""Seed 001's crash list, at the queue-core level, against a real PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest

import leaseq
from bench.explain import function_plans
from leaseq.core._store import statements
from support.claimcheck import Executions, run_claimers
from support.dbtime import claim_one, db_now

JOBS = 2000
THREADS = 16


def leaseq_claim(
    queue_conn: psycopg.Connection[tuple[object, ...]], owner: str
) -> tuple[int, int] | None:
    queue = leaseq.Queue(queue_conn)  # type: ignore[arg-type]
    jobs = queue.claim(["q"], owner)
    if not jobs:
        return None
    assert isinstance(queue.complete(jobs[0].lease), leaseq.Completed)
    return jobs[0].id, jobs[0].lease.token


def naive_claim(conn: psycopg.Connection[tuple[object, ...]], owner: str) -> tuple[int, int] | None:
    """Seed 000's naive claim: SELECT the head, then UPDATE it, as two statements."""
    row = conn.execute(
        "SELECT id FROM leaseq.jobs WHERE status = 'pending' AND queue = 'q'"
        " ORDER BY priority, available_at, id LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    updated = conn.execute(
        "UPDATE leaseq.jobs SET status = 'running', lease_owner = %s,"
        " lease_expires_at = now() + interval '30 s', attempt_count = attempt_count + 1,"
        " lease_token = lease_token + 1 WHERE id = %s RETURNING lease_token",
        (owner, row[0]),
    ).fetchone()
    assert updated is not None
    return int(str(row[0])), int(str(updated[0]))


def test_concurrent_claimers_never_share_a_job(database_url: str, queue: leaseq.Queue) -> None:
    queue.enqueue_many([leaseq.JobSpec("q", "t", {"n": n}) for n in range(JOBS)])
    executions = run_claimers(database_url, THREADS, leaseq_claim)
    assert len(executions.runs) == JOBS
    assert executions.duplicates == 0
    assert executions.duplicate_tokens == 0
    assert {token for _, token in executions.runs} == {1}
    [stats] = queue.stats() or [None]
    assert stats is None  # nothing pending, running or dead: every job succeeded once


def test_duplicate_detector_catches_the_naive_claim(database_url: str, queue: leaseq.Queue) -> None:
    """The zero-duplicates test can fail: the same detector flags seed 000's naive claim.

    A barrier lines the claimers up the way an idle pool meets a new job: every one reads the
    head of the queue before any of them marks it."""
    queue.enqueue_many([leaseq.JobSpec("q", "t") for _ in range(40)])
    threads = 8
    barrier = threading.Barrier(threads)
    executions: Executions = run_claimers(
        database_url, threads, naive_claim, rounds=3, barrier=barrier
    )
    assert executions.duplicates > 0
    over_counted = [job for job in queue.jobs(status="running") if job.attempt_count > 1]
    assert over_counted, "the naive claim also corrupts attempt_count"


def test_crash_after_claim_expires_and_is_reclaimed_with_attempt_kept(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    queue.enqueue("q", "t", now=now)
    job = claim_one(queue, owner="w-crashed", lease_seconds=10, now=now)
    assert queue.reap(now=now + timedelta(seconds=9)) == []  # still leased
    [reaped] = queue.reap(now=now + timedelta(seconds=10))
    assert (reaped.job_id, reaped.status, reaped.previous_owner, reaped.attempt) == (
        job.id,
        "pending",
        "w-crashed",
        1,
    )
    record = queue.get(job.id)
    assert (record.status, record.attempt_count, record.last_error_code) == (
        "pending",
        1,
        "LEASE_EXPIRED",
    )
    retry = claim_one(queue, owner="w2", now=now + timedelta(hours=1))
    assert (retry.id, retry.attempt, retry.lease.token) == (job.id, 2, 2)
    assert [(a.worker, a.outcome) for a in queue.attempts(job.id)] == [
        ("w-crashed", "lease_expired")
    ]


def test_stale_worker_is_fenced_and_the_new_owner_result_stands(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    queue.enqueue("q", "t", idempotency_key="doc-47", now=now)
    a = claim_one(queue, owner="A", lease_seconds=5, now=now)
    queue.reap(now=now + timedelta(seconds=6))  # A paused past its lease
    b = claim_one(queue, owner="B", lease_seconds=5, now=now + timedelta(hours=1))
    assert b.lease.token == a.lease.token + 1
    later = now + timedelta(hours=1, seconds=1)
    assert queue.complete(b.lease, {"by": "B"}, now=later) == leaseq.Completed(b.id, "doc-47", True)
    assert queue.complete(a.lease, {"by": "A"}, now=later) == leaseq.Fenced(
        a.id, "complete", "succeeded"
    )
    assert queue.fail(a.lease, "late", now=later) == leaseq.Fenced(a.id, "fail", "succeeded")
    record = queue.get(a.id)
    assert (record.status, record.result, record.lease_owner) == ("succeeded", {"by": "B"}, "B")
    effect = queue.effect("doc-47")
    assert effect is not None and effect.produced_by == "B"
    outcomes = {(x.lease_token, x.worker): x.outcome for x in queue.attempts(a.id)}
    assert outcomes == {(a.lease.token, "A"): "fenced", (b.lease.token, "B"): "succeeded"}


def test_stale_worker_on_an_unreaped_expired_lease_is_fenced(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    queue.enqueue("q", "t", now=now)
    a = claim_one(queue, owner="A", lease_seconds=5, now=now)
    assert queue.complete(a.lease, now=now + timedelta(seconds=5)) == leaseq.Fenced(
        a.id, "complete", "running"
    )
    assert queue.get(a.id).status == "running"  # untouched until reaped
    [reaped] = queue.reap(now=now + timedelta(seconds=5))
    assert reaped.job_id == a.id
    [attempt] = queue.attempts(a.id)
    assert attempt.outcome == "fenced"  # the reaper does not overwrite the refusal


def test_work_done_twice_writes_one_effect(queue: leaseq.Queue, conn: leaseq.core.db.Conn) -> None:
    """Seed 000's idempotency check: the first completion's acknowledgement is lost, so the
    row goes back to pending and a second worker does the work again."""
    queue.enqueue("q", "t", idempotency_key="invoice-2026-000412")
    a = claim_one(queue, owner="worker-a")
    assert queue.complete(a.lease, {"amount": 10}) == leaseq.Completed(
        a.id, "invoice-2026-000412", True
    )
    conn.execute(
        "UPDATE leaseq.jobs SET status = 'pending', finished_at = NULL WHERE id = %s", (a.id,)
    )
    b = claim_one(queue, owner="worker-b")
    assert queue.complete(b.lease, {"amount": 10}) == leaseq.Completed(
        b.id, "invoice-2026-000412", False
    )
    assert queue.get(a.id).attempt_count == 2
    rows = conn.execute(
        "SELECT produced_by FROM leaseq.job_results WHERE idempotency_key = 'invoice-2026-000412'"
    ).fetchall()
    assert rows == [("worker-a",)]


def test_exhausted_retries_go_dead_and_retry_dead_keeps_history(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    job_id = queue.enqueue("q", "t", max_attempts=3, now=now).job_id
    for attempt in range(1, 4):
        job = claim_one(queue, now=now)
        result = queue.fail(job.lease, "model backend returned 503", now=now)
        assert isinstance(result, leaseq.Failed)
        assert result.status == ("dead" if attempt == 3 else "pending")
        now += timedelta(hours=1)
    dead = queue.get(job_id)
    assert (dead.status, dead.attempt_count, dead.last_error) == (
        "dead",
        3,
        "model backend returned 503",
    )
    assert [j.id for j in queue.jobs(status="dead")] == [job_id]
    assert queue.stats()[0].dead == 1
    assert queue.retry_dead(job_id) == 6  # a fresh budget of 3 on top of the 3 used
    with pytest.raises(leaseq.JobStateError, match="only dead jobs can be retried"):
        queue.retry_dead(job_id)
    job = claim_one(queue)
    assert (job.id, job.attempt) == (job_id, 4)
    queue.complete(job.lease)
    assert [a.outcome for a in queue.attempts(job_id)] == ["failed"] * 3 + ["succeeded"]


def test_a_job_that_kills_its_worker_every_time_still_stops(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    job_id = queue.enqueue("q", "t", max_attempts=3, now=now).job_id
    statuses = []
    for _ in range(3):
        claim_one(queue, lease_seconds=5, now=now)
        now += timedelta(seconds=5)
        [reaped] = queue.reap(now=now)
        statuses.append(reaped.status)
        now += timedelta(hours=1)
    assert statuses == ["pending", "pending", "dead"]
    assert queue.get(job_id).status == "dead"


def test_one_locked_row_does_not_block_the_rest(
    database_url: str, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    head = queue.enqueue("q", "t", priority=0).job_id
    nxt = queue.enqueue("q", "t").job_id
    conn.execute("SET statement_timeout = '10s'")  # a blocked claim fails instead of hanging
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", (head,))
        assert [j.id for j in queue.claim(["q"], "w", limit=2)] == [nxt]
    assert [j.id for j in queue.claim(["q"], "w")] == [head]


def test_high_priority_flood_policy(queue: leaseq.Queue) -> None:
    """Fairness policy: priority is strict within a queue (a flood of urgent jobs delays less
    urgent ones, which keep FIFO order among themselves); queues isolate workloads (a flood in
    one queue never delays a worker serving another)."""
    routine = [queue.enqueue("bulk", "t", priority=100).job_id for _ in range(5)]
    queue.enqueue_many([leaseq.JobSpec("bulk", "t", priority=0) for _ in range(200)])
    interactive = queue.enqueue("interactive", "t", priority=100).job_id
    assert [j.id for j in queue.claim(["interactive"], "w")] == [interactive]
    seen: list[int] = []
    while len(seen) < 200:
        batch = queue.claim(["bulk"], "w", limit=50)
        assert all(j.priority == 0 for j in batch)
        seen += [j.id for j in batch]
    assert [j.id for j in queue.claim(["bulk"], "w", limit=50)] == routine


def test_claim_plan_uses_the_partial_index_under_history(conn: leaseq.core.db.Conn) -> None:
    conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type, status, finished_at, lease_owner, result)"
        " SELECT 'q', 't', 'succeeded', now(), 'w', '{}'::jsonb FROM generate_series(1, 200000)"
    )
    conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type) SELECT 'q', 't' FROM generate_series(1, 500)"
    )
    conn.execute("ANALYZE leaseq.jobs")
    claim = statements.load()["job_claim"].query
    # Every type, and only the types a worker's registry serves: the same index walk.
    for job_types in (None, ["t", "u"]):
        params = {
            "queues": ["q"],
            "owner": "w",
            "limit": 1,
            "lease_seconds": 30,
            "claim_id": None,
            "claim_secret": b"s" * 32,
            "job_types": job_types,
            "now": None,
        }
        with conn.transaction(force_rollback=True):
            plan = str(function_plans(conn, claim, params))
        assert "'Index Name': 'jobs_claim_idx'" in plan
        assert "'Node Type': 'Seq Scan'" not in plan.replace("'Relation Name': 'unnest'", "")
        assert "Sort" not in plan.split("jobs_claim_idx")[0].split("LockRows")[-1]
