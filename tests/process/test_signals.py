"""Real workers, real signals: SIGKILL, SIGTERM (twice), SIGSTOP/SIGCONT."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import leaseq
import pytest
from conftest import WorkerProcess, wait_for

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

    job = wait_for(lambda: (j := queue.get(job_id)).status == "succeeded" and j, "the job to finish")
    assert job.attempt_count == 2
    assert job.result == {"worker": "w-b", "attempt": 2}
    assert [r.job_id for r in reaper] == [job_id]
    assert outcomes(queue, job_id) == [("w-a", "lease_expired"), ("w-b", "succeeded")]
    effect = queue.effect("k-1")
    assert effect is not None and effect.produced_by == "w-b" and effect.job_id == job_id
    assert b.metric("leaseq_jobs_finished_total", queue="q", job_type="work", outcome="succeeded") == 1
