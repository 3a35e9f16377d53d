"""Pods by what their workers report: active, loading (and for how long), or unknown."""

from __future__ import annotations

from datetime import UTC, datetime

from leaseq.core.models import SILENT_AFTER_SECONDS, WorkerRecord, WorkerState
from leaseq_operator.capacity import PodStates, pod_states

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def worker(
    pod: str,
    state: WorkerState,
    age: float,
    startup: float | None = None,
    heartbeat_age: float = 1.0,
) -> WorkerRecord:
    return WorkerRecord(
        worker_id=f"w-{pod}-{state}",
        pod=pod,
        node="n",
        queues=["ocr"],
        concurrency=2,
        state=state,
        started_at=T0,
        heartbeat_at=T0,
        heartbeat_age=heartbeat_age,
        running=0,
        oldest_running_age=None,
        age=age,
        startup_seconds=startup,
    )


def test_pods_by_state() -> None:
    workers = [
        worker("a", WorkerState.RUNNING, 300, startup=40),
        worker("b", WorkerState.LOADING, 25),
        worker("c", WorkerState.LOADING, 5),
        worker("d", WorkerState.DRAINING, 900, startup=20),
        worker("elsewhere", WorkerState.RUNNING, 50, startup=30),  # not this Deployment's pod
    ]
    states = pod_states(["a", "b", "c", "d", "unregistered"], workers)
    assert states == PodStates(active=1, loading=(5.0, 25.0), reported_startup_seconds=30.0)


def test_a_silent_worker_is_not_counted() -> None:
    stale = worker(
        "a", WorkerState.RUNNING, 300, startup=99, heartbeat_age=SILENT_AFTER_SECONDS + 1
    )
    assert pod_states(["a"], [stale]) == PodStates(0, (), None)


def test_a_running_worker_makes_its_pod_active() -> None:
    workers = [worker("a", WorkerState.LOADING, 5), worker("a", WorkerState.RUNNING, 60, 10)]
    assert pod_states(["a"], workers) == PodStates(1, (), 10.0)
