"""Every job transition against a real PostgreSQL, with time moved through ``now=``."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

import leaseq
from leaseq import HeartbeatStatus
from support.dbtime import claim_one, db_now


def test_enqueue_then_claim_sets_lease_and_increments_token(queue: leaseq.Queue) -> None:
    enq = queue.enqueue("q", "t", {"doc": 1}, max_attempts=3, timeout=60)
    assert enq.created
    job = claim_one(queue, lease_seconds=30)
    assert (job.id, job.payload, job.attempt, job.max_attempts) == (enq.job_id, {"doc": 1}, 1, 3)
    assert job.lease.token == 1
    record = queue.get(job.id)
    assert record.status == "running"
    assert record.lease_owner == "w1"
    assert record.lease_expires_at is not None and record.started_at is not None
    assert record.lease_expires_at - record.started_at == timedelta(seconds=30)
    assert queue.claim(["q"], "w2") == []


def test_claim_order_is_priority_then_fifo_and_batches_are_bounded(queue: leaseq.Queue) -> None:
    low = queue.enqueue("q", "t", priority=200).job_id
    first = queue.enqueue("q", "t").job_id
    second = queue.enqueue("q", "t").job_id
    urgent = queue.enqueue("q", "t", priority=0).job_id
    other = queue.enqueue("elsewhere", "t", priority=50).job_id
    claimed = queue.claim(["q", "elsewhere"], "w", limit=4)
    assert [j.id for j in claimed] == [urgent, other, first, second]
    assert [j.id for j in queue.claim(["q"], "w", limit=10)] == [low]
    with pytest.raises(leaseq.InvalidJob, match="limit"):
        queue.claim(["q"], "w", limit=0)


def test_scheduled_job_is_invisible_until_due(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    job_id = queue.enqueue("q", "t", delay=60, now=now).job_id
    assert queue.claim(["q"], "w", now=now + timedelta(seconds=59)) == []
    [stats] = queue.stats(horizon=120, now=now)
    assert (stats.ready, stats.scheduled, stats.scheduled_soon) == (0, 1, 1)
    assert [j.id for j in queue.claim(["q"], "w", now=now + timedelta(seconds=60))] == [job_id]


def test_dedup_key_returns_the_unfinished_job_then_frees_after_finish(queue: leaseq.Queue) -> None:
    first = queue.enqueue("q", "t", dedup_key="doc-7")
    again = queue.enqueue("q", "t", dedup_key="doc-7")
    assert again == leaseq.Enqueued(first.job_id, created=False)
    assert queue.enqueue("other", "t", dedup_key="doc-7").created
    job = claim_one(queue)
    assert not queue.enqueue("q", "t", dedup_key="doc-7").created  # running still counts
    queue.complete(job.lease)
    assert queue.enqueue("q", "t", dedup_key="doc-7").created


def test_enqueue_joins_the_callers_transaction(database_url: str, queue: leaseq.Queue) -> None:
    with psycopg.connect(database_url) as caller:  # not autocommit: the caller's transaction
        queue.enqueue("q", "t", {"n": 1}, conn=caller)
        caller.rollback()
        assert queue.stats() == []
        enq = queue.enqueue("q", "t", {"n": 2}, conn=caller)
        with psycopg.connect(database_url, autocommit=True) as listener:
            listener.execute("LISTEN leaseq_jobs")
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []  # not yet committed
            caller.commit()
            [note] = list(listener.notifies(timeout=5, stop_after=1))
            assert note.payload == "q"
    assert queue.get(enq.job_id).payload == {"n": 2}


def test_enqueue_many_is_all_or_nothing(queue: leaseq.Queue) -> None:
    good = leaseq.JobSpec("q", "t", {"i": 1})
    bad = leaseq.JobSpec("q", "t", {"i": float("nan")})
    with pytest.raises(leaseq.InvalidJob, match="payload"):
        queue.enqueue_many([good, bad])
    assert queue.stats() == []
    results = queue.enqueue_many([good, good])
    assert [r.created for r in results] == [True, True]
    assert results[0].job_id != results[1].job_id


def test_heartbeat_extends_lease_stores_progress_and_stops_at_max_runtime(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    queue.enqueue("q", "t", timeout=50, now=now)
    job = claim_one(queue, lease_seconds=20, now=now)
    beat = queue.heartbeat(
        job.lease, lease_seconds=20, progress={"page": 3}, now=now + timedelta(seconds=10)
    )
    assert beat.status is HeartbeatStatus.RENEWED
    assert beat.lease_expires_at == now + timedelta(seconds=30)
    assert queue.get(job.id).progress == {"page": 3}
    # Renewal is capped at started_at + timeout ...
    beat = queue.heartbeat(job.lease, lease_seconds=20, now=now + timedelta(seconds=29))
    assert beat.lease_expires_at == now + timedelta(seconds=49)
    assert queue.get(job.id).lease_expires_at == now + timedelta(seconds=49)
    # ... so once the job has used its maximum runtime the lease is gone.
    beat = queue.heartbeat(job.lease, lease_seconds=20, now=now + timedelta(seconds=49))
    assert beat.status is HeartbeatStatus.LOST


def test_job_at_its_max_runtime_is_failed_as_timed_out(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    queue.enqueue("q", "t", timeout=10, now=now)
    job = claim_one(queue, lease_seconds=30, now=now)  # lease capped at the timeout: now+10
    beat = queue.heartbeat(job.lease, now=now + timedelta(seconds=9))
    assert beat.status is HeartbeatStatus.RENEWED
    assert beat.lease_expires_at == now + timedelta(seconds=10)
    # The worker gives up on a job whose runtime is spent: timed_out, retried per policy.
    result = queue.fail(
        job.lease,
        "max runtime reached",
        timed_out=True,
        now=now + timedelta(seconds=9, milliseconds=500),
    )
    assert isinstance(result, leaseq.Failed) and result.status == "pending"
    [attempt] = queue.attempts(job.id)
    assert attempt.outcome == "timed_out"


def test_heartbeat_on_a_lost_lease_is_fenced(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    queue.enqueue("q", "t", now=now)
    job = claim_one(queue, lease_seconds=5, now=now)
    beat = queue.heartbeat(job.lease, now=now + timedelta(seconds=6))
    assert beat.status is HeartbeatStatus.LOST
    assert queue.get(job.id).status == "running"  # unchanged: the reaper's to decide
    assert [a.outcome for a in queue.attempts(job.id)] == ["fenced"]


def test_a_frozen_workers_refused_call_keeps_the_reaped_attempts_end_time(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    # The attempt ended when the reaper took it: a later refusal of its frozen worker must
    # not move that end (the history would show the key over its limit when it was not).
    now = db_now(conn)
    queue.enqueue("q", "t", now=now)
    job = claim_one(queue, lease_seconds=5, now=now)
    queue.reap(now=now + timedelta(seconds=6))
    [reaped] = queue.attempts(job.id)
    assert reaped.outcome == "lease_expired"
    late = now + timedelta(minutes=5)
    assert queue.heartbeat(job.lease, now=late).status is HeartbeatStatus.LOST
    assert isinstance(queue.complete(job.lease, now=late), leaseq.Fenced)
    [fenced] = queue.attempts(job.id)
    assert fenced.outcome == "fenced"
    assert fenced.ended_at == reaped.ended_at == now + timedelta(seconds=6)


def test_heartbeat_many_renews_each_held_lease_and_answers_each_lost_one(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """One statement for all: each lease fenced by its own token; a lost one is recorded and
    answered as heartbeat() answers it; bad progress is left out, its lease still renewed."""
    now = db_now(conn)
    for n in range(4):
        queue.enqueue("q", "t", priority=n, now=now)
    held, expired, cancelled, bad = (claim_one(queue, lease_seconds=20, now=now) for _ in range(4))
    conn.execute(
        "UPDATE leaseq.jobs SET lease_expires_at = %s WHERE id = %s",
        (now + timedelta(seconds=5), expired.id),
    )
    queue.cancel(cancelled.id)
    later = now + timedelta(seconds=10)
    beats = queue.heartbeat_many(
        [held.lease, expired.lease, cancelled.lease, bad.lease],
        lease_seconds=20,
        progresses=[{"page": 3}, {"page": 1}, None, {"x": float("nan")}],
        now=later,
    )
    assert [b.status for b in beats] == [
        HeartbeatStatus.RENEWED,
        HeartbeatStatus.LOST,
        HeartbeatStatus.LOST,
        HeartbeatStatus.RENEWED,
    ]
    assert beats[0].lease_expires_at == later + timedelta(seconds=20)
    assert beats[2].job_status == "cancelled"
    assert queue.get(held.id).progress == {"page": 3}
    assert queue.get(expired.id).progress is None
    assert queue.get(bad.id).lease_expires_at == later + timedelta(seconds=20)
    assert [a.outcome for a in queue.attempts(expired.id)] == ["fenced"]
    assert queue.heartbeat_many([]) == []


def test_a_lease_exists_only_while_its_job_runs(queue: leaseq.Queue, database_url: str) -> None:
    """The fenced statements rely on it (they do not name the status)."""
    job = queue.enqueue("q", "t")
    with (
        psycopg.connect(database_url) as c,
        pytest.raises(psycopg.errors.CheckViolation, match="jobs_lease_only_while_running"),
    ):
        c.execute("UPDATE leaseq.jobs SET lease_expires_at = now() WHERE id = %s", (job.job_id,))


def test_complete_writes_the_effect_once(queue: leaseq.Queue) -> None:
    queue.enqueue("q", "t", idempotency_key="invoice-2026-000412")
    job = claim_one(queue)
    done = queue.complete(job.lease, {"total": 12})
    assert done == leaseq.Completed(job.id, "invoice-2026-000412", effect_written=True)
    record = queue.get(job.id)
    assert (record.status, record.result, record.lease_expires_at) == (
        "succeeded",
        {"total": 12},
        None,
    )
    effect = queue.effect("invoice-2026-000412")
    assert effect is not None and (effect.job_id, effect.produced_by) == (job.id, "w1")
    assert [a.outcome for a in queue.attempts(job.id)] == ["succeeded"]


def test_retryable_failure_backs_off_in_database_time(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    queue.retry = leaseq.RetryPolicy(base_seconds=10, cap_seconds=25)
    now = db_now(conn)
    queue.enqueue("q", "t", max_attempts=4, now=now)
    delays = []
    for attempt in (1, 2, 3):
        job = claim_one(queue, now=now)
        assert job.attempt == attempt
        failed = queue.fail(job.lease, f"503 on attempt {attempt}", error_code="E503", now=now)
        assert isinstance(failed, leaseq.Failed) and failed.retry_at is not None
        delays.append((failed.retry_at - now).total_seconds())
        now = failed.retry_at
    # capped exponential with equal jitter: d/2 <= delay <= d, d = min(25, 10 * 2**(n-1))
    for delay, full in zip(delays, (10, 20, 25), strict=True):
        assert full / 2 <= delay <= full
    record = queue.get(job.id)
    assert (record.status, record.last_error, record.last_error_code) == (
        "pending",
        "503 on attempt 3",
        "E503",
    )


def test_non_retryable_error_goes_dead_at_once(queue: leaseq.Queue) -> None:
    queue.enqueue("q", "t", max_attempts=5)
    job = claim_one(queue)
    failed = queue.fail(job.lease, "payload schema v9 unsupported", retryable=False)
    assert failed == leaseq.Failed(job.id, "dead", None)
    record = queue.get(job.id)
    assert (record.status, record.attempt_count, record.finished_at is not None) == (
        "dead",
        1,
        True,
    )


def test_release_returns_the_job_now_without_costing_an_attempt(queue: leaseq.Queue) -> None:
    queue.enqueue("q", "t", max_attempts=1)
    for _ in range(3):  # three rolling deploys in a row never kill a single-attempt job
        job = claim_one(queue)
        assert job.attempt == 1
        assert queue.release(job.lease) == leaseq.Released(job.id)
    job = claim_one(queue)
    assert job.lease.token == 7  # +1 per claim and per release
    # No key: no effect row, the result is in the job's row.
    assert queue.complete(job.lease) == leaseq.Completed(job.id, None, False)
    outcomes = [(a.attempt, a.outcome) for a in queue.attempts(job.id)]
    assert outcomes == [(1, "released")] * 3 + [(1, "succeeded")]


def test_a_counted_release_retries_after_backoff_and_is_dead_at_max_attempts(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """A release that is not a shutdown (a handler raising Interrupted) spends the attempt:
    back after backoff while attempts remain, ``dead`` (finished, owner kept) at the last."""
    now = db_now(conn)
    queue.enqueue("q", "t", max_attempts=2, now=now)
    first = claim_one(queue, now=now)
    assert queue.release(first.lease, reason="stopped", shutdown=False, now=now) == (
        leaseq.Released(first.id, leaseq.JobStatus.PENDING)
    )
    retried = queue.get(first.id)
    assert (retried.attempt_count, retried.available_at > now) == (1, True)
    later = now + timedelta(hours=1)
    second = claim_one(queue, now=later)
    assert second.attempt == 2
    assert queue.release(second.lease, reason="stopped again", shutdown=False, now=later) == (
        leaseq.Released(second.id, leaseq.JobStatus.DEAD)
    )
    dead = queue.get(second.id)
    assert (dead.status, dead.attempt_count, dead.finished_at, dead.lease_owner) == (
        "dead", 2, later, "w1",
    )  # fmt: skip
    assert (dead.last_error, dead.last_error_code) == ("stopped again", "INTERRUPTED")
    assert [(a.attempt, a.outcome) for a in queue.attempts(second.id)] == [
        (1, "interrupted"),
        (2, "interrupted"),
    ]


def test_release_by_a_stale_worker_is_fenced(queue: leaseq.Queue) -> None:
    queue.enqueue("q", "t")
    job = claim_one(queue)
    queue.release(job.lease)
    assert queue.release(job.lease) == leaseq.Fenced(job.id, "release", "pending")


def test_checkpoint_reaches_the_next_attempt(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    queue.enqueue("q", "t", now=now)
    job = claim_one(queue, lease_seconds=5, now=now)
    assert job.checkpoint is None
    assert queue.checkpoint(job.lease, {"pages_done": 40}, now=now)
    queue.reap(now=now + timedelta(seconds=6))  # the worker crashed
    retry = claim_one(queue, owner="w2", now=now + timedelta(hours=1))
    assert retry.checkpoint == {"pages_done": 40}
    assert not queue.checkpoint(job.lease, {"pages_done": 41})


def test_cancel_pending_and_running(queue: leaseq.Queue) -> None:
    pending = queue.enqueue("q", "t", priority=5).job_id
    running_id = queue.enqueue("q", "t", priority=1).job_id
    job = claim_one(queue)
    assert job.id == running_id
    assert queue.cancel(pending) == leaseq.Cancelled(pending, True, "pending")
    assert queue.cancel(running_id, reason="user asked") == leaseq.Cancelled(
        running_id, True, "running", running=1
    )
    assert queue.cancel(running_id) == leaseq.Cancelled(running_id, False, "cancelled")
    assert queue.heartbeat(job.lease).status is HeartbeatStatus.LOST
    assert queue.complete(job.lease) == leaseq.Fenced(running_id, "complete", "cancelled")
    assert queue.get(running_id).status == "cancelled"
    # The refusals are the cancel reaching the worker: the attempt stays cancelled.
    [attempt] = queue.attempts(running_id)
    assert (attempt.outcome, attempt.error) == ("cancelled", "user asked")
    with pytest.raises(leaseq.JobNotFound, match="job 999999"):
        queue.cancel(999999)


def test_a_running_job_whose_refused_renewal_found_its_lease_expired_can_be_cancelled(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    # No reaper ran: the job stays running with the refused token, whose attempt the refusal
    # recorded. Cancelling it must not trip over that row (it raised DuplicateJob).
    then = db_now(conn) - timedelta(minutes=1)
    job_id = queue.enqueue("q", "t", now=then).job_id
    job = claim_one(queue, lease_seconds=5, now=then)
    beat = queue.heartbeat(job.lease)
    assert (beat.status, beat.job_status) == (HeartbeatStatus.LOST, "running")
    [attempt] = queue.attempts(job_id)
    assert attempt.outcome == "fenced"
    assert attempt.error is not None and "lease of token 1 expired at" in attempt.error
    assert "not current" not in attempt.error
    assert queue.cancel(job_id, reason="stuck") == leaseq.Cancelled(
        job_id, True, "running", running=1
    )
    assert queue.get(job_id).status == "cancelled"
    # The attempt ended when its worker was told it had lost the lease; the cancel keeps that.
    assert [a.outcome for a in queue.attempts(job_id)] == ["fenced"]
    # A stale token still says it is not current.
    assert queue.complete(job.lease) == leaseq.Fenced(job_id, "complete", "cancelled")


def test_prune_deletes_only_old_finished_jobs_in_batches(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    for i in range(5):
        queue.enqueue("q", "t", idempotency_key=f"k{i}", now=now)
    for job in queue.claim(["q"], "w", limit=5, now=now):
        queue.complete(job.lease, now=now)
    live = queue.enqueue("q", "t").job_id
    assert queue.prune(older_than=3600, now=now + timedelta(minutes=30)) == 0
    assert queue.prune(older_than=3600, batch=2, now=now + timedelta(hours=2)) == 5
    assert [j.id for j in queue.jobs()] == [live]
    assert conn.execute("SELECT count(*) FROM leaseq.job_attempts").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM leaseq.job_results").fetchone() == (5,)


def test_stats_per_queue(queue: leaseq.Queue, conn: leaseq.core.db.Conn) -> None:
    now = db_now(conn)
    queue.enqueue("a", "t", now=now - timedelta(seconds=30))
    queue.enqueue("a", "t", now=now)
    queue.enqueue("a", "t", delay=600, now=now)
    queue.enqueue("b", "t", max_attempts=1, now=now)
    [job] = queue.claim(["b"], "w", now=now)
    queue.fail(job.lease, "boom", now=now)
    queue.enqueue("b", "t", now=now - timedelta(seconds=7))
    [running] = queue.claim(["b"], "w", now=now - timedelta(seconds=7))
    a, b = queue.stats(now=now)
    assert (a.queue, a.ready, a.scheduled, a.running, a.dead) == ("a", 2, 1, 0, 0)
    assert a.oldest_ready_age == pytest.approx(30)
    assert (b.queue, b.ready, b.running, b.dead) == ("b", 0, 1, 1)
    assert b.max_heartbeat_age == pytest.approx(7)
    assert [s.queue for s in queue.stats(["b"], now=now)] == ["b"]
    assert running.queue == "b"


def test_a_failed_attempt_keeps_its_traceback_bounded_and_redacted(queue: leaseq.Queue) -> None:
    queue.enqueue("q", "t")
    [job] = queue.claim(["q"], "w1")
    trace = "Traceback\x00 postgresql://u:hunter2-secret@h/db " + "x" * 20000
    queue.fail(job.lease, "boom", traceback=trace)
    [attempt] = queue.attempts(job.id)
    stored = attempt.traceback or ""
    assert "\x00" not in stored and "hunter2" not in stored and "u:***@h" in stored
    assert stored.endswith("the first 8192 kept; 1 NUL replaced by U+FFFD]"), stored[-200:]
    assert len(stored) < 8192 + 200
