"""What the work-based scaling policy reads from PostgreSQL: work per job type with recent
mean run times (Queue.work, statement pool_work), and loading workers (Workers)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import leaseq
from leaseq.core._store import statements
from leaseq.core.models import JobTypeWork, WorkerState
from leaseq.core.schedule_models import NextSlot
from support.dbtime import db_now


def ran(
    queue: leaseq.Queue, job_type: str, seconds: float, ended: datetime, queue_name: str = "q"
) -> None:
    """One job of ``job_type`` whose only attempt ran ``seconds`` and succeeded at ``ended``."""
    started = ended - timedelta(seconds=seconds)
    queue.enqueue(queue_name, job_type, {}, now=started)
    [job] = queue.claim([queue_name], "w-old", lease_seconds=3600, now=started)
    queue.complete(job.lease, now=ended)


def test_work_per_job_type_with_recent_mean_run_times(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    ran(queue, "ocr", 10, now - timedelta(seconds=60))
    ran(queue, "ocr", 30, now - timedelta(seconds=30))
    ran(queue, "ocr", 500, now - timedelta(seconds=2000))  # ended before the window
    ran(queue, "ocr", 999, now - timedelta(seconds=30), queue_name="elsewhere")  # other queue
    ran(queue, "embed", 2, now - timedelta(seconds=10))
    ran(queue, "gone", 5, now - timedelta(seconds=10))  # history, but no job now: not listed
    # An attempt that did not run to its end says nothing about run time.
    queue.enqueue("q", "ocr", {}, now=now - timedelta(seconds=100))
    [released] = queue.claim(["q"], "w-old", lease_seconds=3600, now=now - timedelta(seconds=100))
    queue.release(released.lease, now=now - timedelta(seconds=1))  # back to ready
    for _ in range(2):
        queue.enqueue("q", "ocr", {})
    queue.enqueue("q", "ocr", {}, delay=5)  # due within the horizon
    queue.enqueue("q", "ocr", {}, delay=3600)  # not soon: not demand
    queue.enqueue("q", "embed", {})
    [running] = queue.claim(["q"], "w1", now=now + timedelta(seconds=1))  # the oldest: released
    assert running.job_type == "ocr"
    queue.enqueue("q", "fresh", {})

    work = queue.work(["q"], window=900, horizon=10, now=now + timedelta(seconds=1))
    assert work == [
        JobTypeWork("embed", ready=1, scheduled_soon=0, running=0, mean_seconds=2.0, samples=1),
        JobTypeWork("fresh", ready=1, scheduled_soon=0, running=0, mean_seconds=None, samples=0),
        JobTypeWork("ocr", ready=2, scheduled_soon=1, running=1, mean_seconds=20.0, samples=2),
    ]


def test_work_window_must_be_positive(queue: leaseq.Queue) -> None:
    with pytest.raises(leaseq.InvalidJob, match="window"):
        queue.work(["q"], window=0)


def test_run_times_are_read_through_the_index_however_long_the_trail(
    conn: leaseq.core.db.Conn,
) -> None:
    conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type, status, finished_at, lease_owner, result)"
        " SELECT 'q', 't', 'succeeded', now(), 'w', '{}'::jsonb FROM generate_series(1, 50000)"
    )
    conn.execute(
        "INSERT INTO leaseq.job_attempts"
        " (job_id, attempt, lease_token, worker, started_at, ended_at, outcome)"
        " SELECT id, 1, 1, 'w', now() - interval '1 minute' - interval '10 s',"
        " now() - interval '1 minute', 'succeeded' FROM leaseq.jobs"
    )
    conn.execute("ANALYZE leaseq.jobs")
    conn.execute("ANALYZE leaseq.job_attempts")
    query = statements.load()["pool_work"].query
    params = {"queues": ["q"], "window": 900, "horizon": 0, "max_samples": 2000, "now": None}
    row = conn.execute(b"EXPLAIN (FORMAT JSON) " + query, params).fetchone()
    assert row is not None
    scans = [n for n in nodes(row[0][0]["Plan"]) if n.get("Relation Name") == "job_attempts"]
    # Newest first from the index, so the scan stops after max_samples rows (no sort of the
    # whole window).
    assert [(n["Node Type"], n.get("Index Name"), n["Scan Direction"]) for n in scans] == [
        ("Index Only Scan", "job_attempts_ended_idx", "Backward")
    ]


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def test_a_loading_worker_is_listed_with_its_age_then_its_start_up(
    conn: leaseq.core.db.Conn,
) -> None:
    workers = leaseq.Workers(conn)
    now = db_now(conn)
    fields = {"pod": "p", "node": "n", "queues": ["q"], "concurrency": 2, "in_flight": 0}
    workers.register("w1", state=WorkerState.LOADING, now=now - timedelta(seconds=40), **fields)
    [loading] = workers.list(["q"])
    assert loading.state is WorkerState.LOADING
    assert loading.age == pytest.approx((db_now(conn) - now).total_seconds() + 40, abs=1)
    assert loading.startup_seconds is None
    workers.register("w1", state=WorkerState.RUNNING, startup_seconds=38.5, **fields)
    [running] = workers.list(["q"])
    assert running.state is WorkerState.RUNNING
    assert running.startup_seconds == 38.5
    assert running.age >= 40  # the row's start is the registration, not the refresh


def test_what_is_coming_delayed_jobs_and_each_schedules_next_slot(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    schedules = leaseq.Schedules(conn)
    start = datetime(2031, 3, 4, 10, 3, 20, tzinfo=UTC)  # far from the real clock
    for name, cron, queue_name in [
        ("reports", "*/10 * * * *", "q"),
        ("hourly", "0 * * * *", "q"),
        ("paused", "* * * * *", "q"),
        ("elsewhere", "* * * * *", "other"),
    ]:
        schedules.add(leaseq.ScheduleSpec(name, cron, queue_name, name), now=start)
    schedules.pause("paused", now=start)
    queue.enqueue("q", "retry", {}, run_at=start + timedelta(seconds=30))  # within the horizon
    queue.enqueue("q", "later", {}, run_at=start + timedelta(seconds=3600))  # beyond it
    queue.enqueue("other", "retry", {}, run_at=start + timedelta(seconds=30))  # other queue
    queue.enqueue("q", "ready", {}, now=start)  # due already: not coming

    coming = schedules.coming(["q"], horizon=60, now=start)
    assert coming.now == start
    assert coming.delayed == 1
    assert coming.slots == (
        NextSlot("hourly", "hourly", datetime(2031, 3, 4, 11, 0, tzinfo=UTC)),
        NextSlot("reports", "reports", datetime(2031, 3, 4, 10, 10, tzinfo=UTC)),
    )
    assert coming.slots_within(400) == coming.slots[1:]
    assert coming.slots_within(3400) == coming.slots

    # A slot that fell but was not fired yet is due now; once fired, the next one is.
    fell = datetime(2031, 3, 4, 10, 10, 2, tzinfo=UTC)
    assert schedules.coming(["q"], horizon=0, now=fell).slots[1] == NextSlot(
        "reports", "reports", fell
    )
    schedules.tick(now=fell)
    assert schedules.coming(["q"], horizon=0, now=fell).slots[1].at == datetime(
        2031, 3, 4, 10, 20, tzinfo=UTC
    )


def test_what_is_coming_without_schedules(queue: leaseq.Queue, conn: leaseq.core.db.Conn) -> None:
    now = db_now(conn)
    queue.enqueue("q", "retry", {}, delay=30)
    coming = leaseq.Schedules(conn).coming(["q"], horizon=60, now=now)
    assert (coming.now, coming.delayed, coming.slots) == (now, 1, ())
    with pytest.raises(leaseq.InvalidJob, match="horizon"):
        leaseq.Schedules(conn).coming(["q"], horizon=-1)
