"""A worker whose on_startup is still loading (a model) is registered as `loading`, alive but
not ready, claims nothing; once loaded it reports `running`, its start-up time and takes work."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq
from leaseq.core.models import WorkerRecord, WorkerState
from support.polling import wait_for
from support.workers import Workers

pytestmark = pytest.mark.process

HERE = Path(__file__).parent


@pytest.fixture
def workers(database_url: str, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(database_url, tmp_path, pythonpath=[HERE])
    yield started
    started.stop_all()


def test_loading_is_registered_not_ready_and_claims_nothing_until_loaded(
    workers: Workers, queue: leaseq.Queue, conn: leaseq.core.db.Conn, tmp_path: Path
) -> None:
    gate = tmp_path / "model-loaded"
    registry = leaseq.Workers(conn)

    def row() -> WorkerRecord:
        [found] = registry.list(["q"])
        return found

    # start() returns once the worker registered and serves HTTP: here, while it still loads.
    worker = workers.start(
        "w-load",
        "--app", "loading_app:registry",
        "--queue", "q",
        "--heartbeat-seconds", "0.2",
        "--poll-seconds", "0.2",
        env={"LEASEQ_TEST_LOAD_GATE": str(gate)},
    )  # fmt: skip
    loading = row()
    assert loading.state is WorkerState.LOADING
    assert loading.startup_seconds is None
    assert worker.get("/healthz") == (200, "ok\n")  # alive: a long load never fails liveness
    assert worker.get("/readyz") == (503, "loading: on_startup has not finished\n")
    assert worker.metric("leaseq_worker_loading") == 1
    assert worker.metric("leaseq_worker_startup_seconds") == 0
    job_id = queue.enqueue("q", "echo", {}).job_id
    # The registry heartbeat keeps the row fresh while loading (the operator counts the pod);
    # two refreshes later, the job is still waiting for a worker that has loaded.
    for _ in range(2):
        before = row().heartbeat_at
        wait_for(lambda b=before: row().heartbeat_at > b, "a registry heartbeat while loading")
    assert row().state is WorkerState.LOADING
    assert queue.get(job_id).status == leaseq.JobStatus.PENDING

    gate.touch()
    wait_for(lambda: queue.get(job_id).status == leaseq.JobStatus.SUCCEEDED, "the job to run")
    wait_for(lambda: worker.get("/readyz") == (200, "ok\n"), "readiness")
    loaded = row()
    assert loaded.state is WorkerState.RUNNING
    assert loaded.startup_seconds is not None and loaded.startup_seconds > 0
    assert worker.metric("leaseq_worker_startup_seconds") == pytest.approx(loaded.startup_seconds)
    assert worker.metric("leaseq_worker_loading") == 0


def test_a_sigterm_during_on_startup_means_no_claim_at_all(
    workers: Workers, queue: leaseq.Queue, tmp_path: Path
) -> None:
    """SIGTERM while on_startup still runs: the worker finishes loading, claims nothing (no
    attempt on any waiting job) and exits 0."""
    gate = tmp_path / "model-loaded"
    worker = workers.start(
        "w-load",
        "--app", "loading_app:registry",
        "--queue", "q",
        "--concurrency", "4",
        "--poll-seconds", "0.2",
        env={"LEASEQ_TEST_LOAD_GATE": str(gate)},
    )  # fmt: skip
    jobs = [queue.enqueue("q", "echo", {}).job_id for _ in range(4)]
    worker.signal(signal.SIGTERM)
    gate.touch()
    assert worker.wait_exit() == 0
    assert [(queue.get(j).status, queue.attempts(j)) for j in jobs] == [
        (leaseq.JobStatus.PENDING, [])
    ] * 4
    assert "signal during start-up: stopping without claiming" in worker.log.read_text()
