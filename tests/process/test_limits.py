"""Max runtime and progress timeouts, enforced by the worker itself (no reaper running)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process


def test_max_runtime_exceeded_fails_the_attempt_as_timed_out(
    queue: leaseq.Queue, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    a = spawn_worker("w-a", lease=5)
    job_id = queue.enqueue(
        "q", "work", {"seconds": 60, "cooperative": True}, timeout=1.5, max_attempts=1
    ).job_id
    job = wait_for(lambda: (j := queue.get(job_id)).status == "dead" and j, "the job to time out")

    assert job.last_error_code == "TIMED_OUT"
    assert [(x.worker, x.outcome) for x in queue.attempts(job_id)] == [("w-a", "timed_out")]
    labels = {"queue": "q", "job_type": "work"}
    wait_for(
        lambda: a.metric("leaseq_jobs_finished_total", **labels, outcome="timed_out") == 1,
        "the timed_out outcome counted",
    )
    # The slot is free again: the worker carries on with the next job.
    nxt = queue.enqueue("q", "work", {"seconds": 0}).job_id
    wait_for(lambda: queue.get(nxt).status == "succeeded", "the next job")


def test_no_progress_stops_renewal_and_fails_the_attempt(
    queue: leaseq.Queue, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    a = spawn_worker("w-a", lease=5)
    job_id = queue.enqueue("q", "silent", {}, max_attempts=1).job_id
    job = wait_for(lambda: (j := queue.get(job_id)).status == "dead" and j, "the job to stall")

    assert job.last_error_code == "NO_PROGRESS"
    assert [(x.worker, x.outcome) for x in queue.attempts(job_id)] == [("w-a", "failed")]
    wait_for(
        lambda: (
            a.metric("leaseq_jobs_finished_total", queue="q", job_type="silent", outcome="dead")
            == 1
        ),
        "the dead outcome counted",
    )
