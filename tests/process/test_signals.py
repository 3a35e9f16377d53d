"""Real workers, real signals: SIGKILL, SIGTERM (twice), SIGSTOP/SIGCONT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import leaseq
from support import net
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

Spawn = Callable[..., WorkerProcess]


def running_on(queue: leaseq.Queue, job_id: int, worker: WorkerProcess) -> bool:
    job = queue.get(job_id)
    return job.status == "running" and job.lease_owner == worker.worker_id


def outcomes(queue: leaseq.Queue, job_id: int) -> list[tuple[str, str]]:
    return [(a.worker, a.outcome) for a in queue.attempts(job_id)]


def test_sigkill_mid_job_is_finished_by_another_worker_after_reap(
    queue: leaseq.Queue, spawn_worker: Spawn, reaper: list[leaseq.Reaped]
) -> None:
    a = spawn_worker("w-a")
    job_id = queue.enqueue(
        "q", "work", {"seconds_by_attempt": [30, 0.2]}, idempotency_key="k-1"
    ).job_id
    wait_for(lambda: running_on(queue, job_id, a), "w-a to run the job")

    a.signal(signal.SIGKILL)
    assert a.wait_exit() == -signal.SIGKILL
    b = spawn_worker("w-b")

    job = wait_for(
        lambda: (j := queue.get(job_id)).status == "succeeded" and j, "the job to finish"
    )
    assert job.attempt_count == 2
    assert job.result == {"worker": "w-b", "attempt": 2}
    assert [r.job_id for r in reaper] == [job_id]
    assert outcomes(queue, job_id) == [("w-a", "lease_expired"), ("w-b", "succeeded")]
    effect = queue.effect("k-1")
    assert effect is not None
    assert effect.produced_by == "w-b"
    assert effect.job_id == job_id
    assert (
        b.metric("leaseq_jobs_finished_total", queue="q", job_type="work", outcome="succeeded") == 1
    )


def test_sigterm_releases_the_job_to_another_worker_without_waiting_for_the_lease(
    queue: leaseq.Queue, workers: leaseq.Workers, spawn_worker: Spawn
) -> None:
    # A 60 s lease and no reaper: only a release can hand the job over within the test.
    a = spawn_worker("w-a", lease=60, heartbeat=1, drain=0.5)
    job_id = queue.enqueue("q", "work", {"seconds_by_worker": {"w-a": 120}}).job_id
    wait_for(lambda: running_on(queue, job_id, a), "w-a to run the job")
    b = spawn_worker("w-b", lease=60, heartbeat=1)

    a.signal(signal.SIGTERM)
    assert a.wait_exit() == 0
    job = wait_for(lambda: (j := queue.get(job_id)).status == "succeeded" and j, "hand-over")

    assert outcomes(queue, job_id) == [("w-a", "released"), ("w-b", "succeeded")]
    assert job.attempt_count == 1  # a release does not spend an attempt
    assert job.result == {"worker": "w-b", "attempt": 1}
    assert [w.worker_id for w in workers.list()] == ["w-b"]
    assert b.metric("leaseq_jobs_claimed_total", queue="q", job_type="work") == 1


def test_sigterm_drains_in_flight_jobs_and_claims_nothing_new(
    queue: leaseq.Queue, workers: leaseq.Workers, spawn_worker: Spawn, tmp_path: Path
) -> None:
    a = spawn_worker("w-a", lease=2, drain=60)
    gate = tmp_path / "gate"
    first = queue.enqueue("q", "gated", {"gate": str(gate)}).job_id
    wait_for(lambda: running_on(queue, first, a), "w-a to run the job")

    a.signal(signal.SIGTERM)
    wait_for(lambda: [w.state for w in workers.list()] == ["draining"], "draining state")
    second = queue.enqueue("q", "work", {"seconds": 0}).job_id
    assert a.get("/readyz")[0] == 503
    assert a.get("/healthz")[0] == 200
    assert a.metric("leaseq_worker_draining") == 1
    gate.touch()
    assert a.wait_exit() == 0

    job = queue.get(first)
    assert job.status == "succeeded"
    assert job.result == {"worker": "w-a", "draining": True}
    assert outcomes(queue, first) == [("w-a", "succeeded")]
    untouched = queue.get(second)
    assert (untouched.status, untouched.attempt_count) == ("pending", 0)
    assert workers.list() == []


def test_second_sigterm_releases_at_once(
    queue: leaseq.Queue, workers: leaseq.Workers, spawn_worker: Spawn
) -> None:
    a = spawn_worker("w-a", lease=2, drain=600)
    job_id = queue.enqueue("q", "gated", {"gate": "/nonexistent/never"}).job_id
    wait_for(lambda: running_on(queue, job_id, a), "w-a to run the job")

    a.signal(signal.SIGTERM)
    wait_for(lambda: [w.state for w in workers.list()] == ["draining"], "draining state")
    a.signal(signal.SIGINT)
    assert a.wait_exit() == 0

    job = queue.get(job_id)
    assert (job.status, job.attempt_count) == ("pending", 0)
    assert outcomes(queue, job_id) == [("w-a", "released")]


def test_a_stopped_worker_is_fenced_when_it_resumes(
    queue: leaseq.Queue, spawn_worker: Spawn, reaper: list[leaseq.Reaped]
) -> None:
    a = spawn_worker("w-a")
    job_id = queue.enqueue(
        "q", "work", {"seconds_by_attempt": [1.5, 0.2]}, idempotency_key="k-stop"
    ).job_id
    wait_for(lambda: running_on(queue, job_id, a), "w-a to run the job")

    a.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: reaper, "the reaper to take the job back")
        b = spawn_worker("w-b")
        wait_for(lambda: queue.get(job_id).status == "succeeded", "w-b to finish the job")
    finally:
        a.signal(signal.SIGCONT)

    wait_for(
        lambda: a.metric("leaseq_fenced_calls_total", queue="q") >= 1, "w-a's stale call fenced"
    )
    wait_for(
        lambda: (
            queue.get(job_id).attempt_count == 2
            and outcomes(queue, job_id) == [("w-a", "fenced"), ("w-b", "succeeded")]
        ),
        "the fenced call in the audit trail",
    )
    job = queue.get(job_id)
    assert job.result == {"worker": "w-b", "attempt": 2}
    effect = queue.effect("k-stop")
    assert effect is not None
    assert effect.produced_by == "w-b"
    assert (
        a.metric("leaseq_jobs_finished_total", queue="q", job_type="work", outcome="succeeded") == 0
    )
    assert (
        b.metric("leaseq_jobs_finished_total", queue="q", job_type="work", outcome="succeeded") == 1
    )
    assert a.proc.poll() is None


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_sigterm_after_the_worker_stopped_still_exits_0(
    spawn_worker: Spawn, isolation: str
) -> None:
    # A supervisor that repeats its SIGTERM (systemd, a Job-style runner) while the worker
    # is already exiting must still see the clean stop's status.
    w = spawn_worker("w-a", isolation=isolation)
    w.signal(signal.SIGTERM)
    # Read as fast as the log grows: the window between the line and the exit is short.
    while "worker stopped" not in w.log.read_text() and w.proc.poll() is None:
        pass
    w.signal(signal.SIGTERM)
    assert w.wait_exit() == 0


def test_sigterm_while_waiting_for_the_database_at_start_up_exits_0(tmp_path: Path) -> None:
    # Nothing listens on the port: the worker waits for its database (with backoff) and
    # must stop cleanly on SIGTERM, a batching app included (its batcher never started).
    nowhere = f"postgresql://leaseq@127.0.0.1:{net.free_port()}/none?connect_timeout=2"
    log = tmp_path / "w-a.log"
    cmd = [sys.executable, "-m", "leaseq.cli", "worker", "--app", "apps:registry",
           "--queue", "q", "--metrics-port", "0", "--database-url", nowhere]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_for(lambda: "waiting for the database" in log.read_text(), "the wait for the database")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()
    assert "Traceback" not in log.read_text()
