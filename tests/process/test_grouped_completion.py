"""Grouped completion with real worker processes: a result is durable before the worker acts
on it, a crash between result and commit loses nothing but the attempt, and a stale token in
a completion group fences only its own job.

The tests hold a job's row lock from their own transaction, so the worker's ``complete_many``
for that job waits on PostgreSQL: a precise "after the handler returned, before the commit"
that no sleep could give.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

Spawn = Callable[..., WorkerProcess]


@contextmanager
def row_locked(database_url: str, job_id: int) -> Iterator[None]:
    """Hold ``job_id``'s row lock until the block ends (then roll back)."""
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", [job_id])
        yield
        conn.rollback()


def handled(worker: WorkerProcess, count: int) -> bool:
    """True once ``count`` handlers have returned in ``worker``."""
    samples = worker.metric("leaseq_job_duration_seconds_count", queue="q", job_type="gated")
    return samples >= count


def succeeded(worker: WorkerProcess) -> float:
    return worker.metric(
        "leaseq_jobs_finished_total", queue="q", job_type="gated", outcome="succeeded"
    )


def blocked_on_lock(database_url: str, worker_id: str) -> bool:
    """True while the worker's completing statement waits for a row lock."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            # job_complete: a call of leaseq.lease_complete.
            " AND wait_event_type = 'Lock' AND query LIKE '%%leaseq.lease_complete(%%'",
            [f"leaseq worker {worker_id}"],
        ).fetchone()
    return bool(row and row[0])


def running_on(queue: leaseq.Queue, worker_id: str, *job_ids: int) -> bool:
    return all(
        (j := queue.get(i)).status == "running" and j.lease_owner == worker_id for i in job_ids
    )


def test_result_is_durable_before_metrics_log_and_the_next_claim(
    database_url: str, queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    first = queue.enqueue("q", "gated", {"gate": str(gate)}).job_id
    worker = spawn_worker("w-a", lease=30.0, heartbeat=10.0)
    wait_for(lambda: running_on(queue, "w-a", first), "w-a to run the first job")
    with row_locked(database_url, first):
        gate.touch()
        wait_for(lambda: handled(worker, 1), "the handler to return")
        wait_for(lambda: blocked_on_lock(database_url, "w-a"), "complete to wait on the lock")
        second = queue.enqueue("q", "gated", {"gate": str(gate)}).job_id
        # The handler has returned, its complete waits on the lock: nothing may act on it yet.
        assert queue.get(first).status == "running"
        assert succeeded(worker) == 0
        assert worker.metric("leaseq_jobs_in_flight", queue="q") == 1
        assert "attempt settled" not in worker.log.read_text()
        assert queue.get(second).status == "pending"  # its slot is not free until the commit
    wait_for(lambda: queue.get(second).status == "succeeded", "both jobs to finish")
    assert queue.get(first).status == "succeeded"
    assert queue.get(first).result == {"worker": "w-a", "draining": False}
    with psycopg.connect(database_url) as conn:
        # Neither job has a key: their results are in their rows, with no effect row beside.
        assert conn.execute("SELECT count(*) FROM leaseq.job_results").fetchone() == (0,)
    assert succeeded(worker) == 2
    # A success is logged per job only at DEBUG (these workers log at DEBUG) ...
    assert worker.log.read_text().count("DEBUG leaseq.worker: attempt settled: succeeded") == 2
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit() == 0
    # ... and counted in the one INFO summary line, written at the latest on the way out.
    logged = worker.log.read_text()
    assert "INFO leaseq.worker: attempt settled" not in logged
    assert logged.count("INFO leaseq.worker: attempts settled in the last") == 1
    assert "s: q: 2 succeeded worker=w-a" in logged


def test_a_crash_between_result_and_commit_costs_the_attempt_never_the_effect(
    database_url: str,
    queue: leaseq.Queue,
    spawn_worker: Spawn,
    reaper: list[leaseq.Reaped],
    tmp_path: Path,
) -> None:
    first_gate, gate = tmp_path / "first", tmp_path / "gate"
    first = queue.enqueue("q", "gated", {"gate": str(first_gate)}).job_id
    job_id = queue.enqueue("q", "gated", {"gate": str(gate)}, idempotency_key="once").job_id
    a = spawn_worker("w-a", concurrency=2, lease=3.0, heartbeat=1.0)
    wait_for(lambda: running_on(queue, "w-a", first, job_id), "w-a to run both jobs")
    # The first job's complete waits on the lock, so the second job's result, returned
    # meanwhile, waits in the worker for its turn: the worker dies holding it.
    with row_locked(database_url, first):
        first_gate.touch()
        wait_for(lambda: blocked_on_lock(database_url, "w-a"), "complete to wait on the lock")
        gate.touch()
        wait_for(lambda: handled(a, 2), "the second handler to return")
        a.signal(signal.SIGKILL)
        assert a.wait_exit() == -signal.SIGKILL
    assert queue.effect("once") is None
    spawn_worker("w-b")
    job = wait_for(
        lambda: (j := queue.get(job_id)).status == "succeeded" and j, "another worker to finish it"
    )
    assert job.attempt_count == 2
    assert [(a.worker, a.outcome) for a in queue.attempts(job_id)] == [
        ("w-a", "lease_expired"),
        ("w-b", "succeeded"),
    ]
    effect = queue.effect("once")
    assert effect is not None and effect.produced_by == "w-b"
    # The statement already sent for the first job ran to its end without its client.
    assert queue.get(first).status == "succeeded"


def test_a_stale_token_in_a_completion_group_fences_only_its_own_job(
    database_url: str, queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path
) -> None:
    first_gate, group_gate = tmp_path / "first", tmp_path / "group"
    first, kept, stale = (
        queue.enqueue("q", "gated", {"gate": str(gate)}, idempotency_key=f"k-{name}").job_id
        for name, gate in (("first", first_gate), ("kept", group_gate), ("stale", group_gate))
    )
    worker = spawn_worker("w-a", concurrency=3, lease=30.0, heartbeat=10.0)
    wait_for(lambda: running_on(queue, "w-a", first, kept, stale), "w-a to run all three")
    # The first job's complete waits on the lock; meanwhile the other two finish and queue
    # up behind it, so they are delivered together, as one group, when the lock goes.
    with row_locked(database_url, first):
        first_gate.touch()
        wait_for(lambda: blocked_on_lock(database_url, "w-a"), "complete to wait on the lock")
        group_gate.touch()
        wait_for(lambda: handled(worker, 3), "all three handlers to return")
        # Another claimer took the stale job over (its token moved on) before the group lands.
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE leaseq.jobs SET lease_token = lease_token + 1, lease_owner = 'thief'"
                " WHERE id = %s",
                [stale],
            )
    wait_for(lambda: queue.get(kept).status == "succeeded", "the kept job to complete")
    wait_for(
        lambda: worker.metric("leaseq_fenced_calls_total", queue="q") == 1, "the fenced complete"
    )
    assert queue.get(first).status == "succeeded"
    job = queue.get(stale)
    assert (job.status, job.lease_owner) == ("running", "thief")  # nothing of w-a's applied
    assert queue.effect("k-stale") is None
    assert [a.outcome for a in queue.attempts(stale)] == ["fenced"]
    for key in ("k-first", "k-kept"):
        effect = queue.effect(key)
        assert effect is not None and effect.produced_by == "w-a"
    assert succeeded(worker) == 2
    fenced = worker.metric(
        "leaseq_jobs_finished_total", queue="q", job_type="gated", outcome="fenced"
    )
    assert fenced == 1
