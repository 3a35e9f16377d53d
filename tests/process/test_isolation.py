"""``--isolation process``: handlers run in child processes; the worker process (the
supervisor) keeps the leases. Real workers, real children, real signals."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

Spawn = Callable[..., WorkerProcess]


def outcomes(queue: leaseq.Queue, job_id: int) -> list[tuple[str, str]]:
    return [(a.worker, a.outcome) for a in queue.attempts(job_id)]


def finished(queue: leaseq.Queue, job_id: int) -> leaseq.JobRecord:
    return wait_for(
        lambda: (j := queue.get(job_id)).status in ("succeeded", "dead") and j,
        f"job {job_id} to finish",
    )


def pid_in(path: Path) -> int:
    return int(wait_for(lambda: path.exists() and path.read_text(), f"a pid in {path.name}"))


def gone(pid: int) -> bool:
    """True once ``pid`` has exited and been reaped by its parent."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize(
    "isolation",
    [
        "process",
        pytest.param(
            "thread",
            marks=pytest.mark.xfail(
                strict=True,
                reason="evidence: in a thread, the C call holds the GIL, the heartbeat thread "
                "cannot renew, the lease runs out and the result is fenced",
            ),
        ),
    ],
)
def test_a_handler_holding_the_gil_past_its_lease_completes_once(
    queue: leaseq.Queue, spawn_worker: Spawn, reaper: list[leaseq.Reaped], isolation: str
) -> None:
    # The C call keeps the GIL for 3 s; the lease is 1 s, renewed every 0.3 s.
    w = spawn_worker("w-a", isolation=isolation)
    job_id = queue.enqueue(
        "q", "hold_gil", {"seconds": 3}, idempotency_key="gil", max_attempts=1
    ).job_id

    job = finished(queue, job_id)
    assert outcomes(queue, job_id) == [("w-a", "succeeded")]
    assert job.status == "succeeded"
    assert job.result["pid"] != w.proc.pid  # it ran in a child
    assert reaper == []
    effect = queue.effect("gil")
    assert effect is not None
    assert effect.job_id == job_id
    assert w.metric("leaseq_lease_renewals_total", queue="q") >= 3
