"""A durable sleep across faults: its wake time passes while PostgreSQL is down, or the
worker that put the job to sleep is SIGKILLed while it sleeps. Either way the job resumes
exactly once (the handler's code after the sleep runs once), completes on its first attempt
with no failed attempt, and its wake time was recorded once, by the first attempt."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

import leaseq
from support.pgserver import RestartablePostgres
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.faults

#: How long the job sleeps: long enough to stop PostgreSQL (well under a second) or to kill
#: a worker and start another (about a second here, a few on a loaded machine) before the
#: wake, which each test checks rather than assumes, failing loudly instead of proving
#: nothing.
NAP_SECONDS = 12.0
#: How long PostgreSQL stays down after the wake time has passed.
DOWN_PAST_WAKE_SECONDS = 3.0


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def put_to_sleep(queue: leaseq.Queue, folder: Path, key: str | None = None) -> tuple[int, datetime]:
    """Enqueue a ``nap`` job and wait until its first attempt has slept: its id and wake."""
    job_id = queue.enqueue("q", "nap", {"dir": str(folder), "seconds": NAP_SECONDS}, key=key).job_id
    wait_for(lambda: [a.outcome for a in queue.attempts(job_id)] == ["released"], "the sleep", 60)
    job = queue.get(job_id)
    assert (job.status, job.attempt_count) == ("pending", 0)
    return job_id, job.available_at


def assert_resumed_once(queue: leaseq.Queue, job_id: int, wake: datetime, folder: Path) -> str:
    """The job woke no earlier than its wake and finished on its first attempt, its sleep
    recorded once and the code after it run once; returns the worker that finished it."""
    job = queue.get(job_id)
    assert (job.status, job.attempt_count) == ("succeeded", 1)
    attempts = queue.attempts(job_id)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "released"), (1, "succeeded")]
    assert (attempts[0].error or "").startswith("sleeping until")
    assert attempts[1].started_at is not None and attempts[1].started_at >= wake
    [step] = queue.steps(job_id)
    assert (step.name, step.attempt, step.recorded) == ("leaseq.sleep-1", 1, True)
    assert datetime.fromisoformat(step.result) == wake
    assert len(lines(folder / "before")) == 2  # before the sleep: once per attempt
    [after] = lines(folder / "after")
    worker, token = after.split()
    assert job.result == {"woke": worker, "token": int(token)}
    return worker


def test_a_wake_time_passing_while_postgres_is_down_resumes_the_job_once(
    restartable: RestartablePostgres,
    restartable_url: str,
    spawn_on: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    """The job sleeps; PostgreSQL crashes (immediate stop) before the wake and stays down
    past it while the worker keeps polling; once it is back the worker claims the job and
    the handler goes on after its sleep, once."""
    worker = spawn_on(restartable_url, "w-out", concurrency=1, lease=2.0, heartbeat=0.5)
    with leaseq.connect(restartable_url, action="test") as conn:
        job_id, wake = put_to_sleep(leaseq.Queue(conn), tmp_path)
    restartable.stop("immediate")
    down_at = datetime.now(UTC)  # the same host's clock as the server's
    assert down_at < wake, "PostgreSQL went down after the wake: the test proved nothing"
    # The outage itself, not a synchronisation: it must outlast the wake time.
    time.sleep((wake - down_at).total_seconds() + DOWN_PAST_WAKE_SECONDS)
    restartable.start()
    up_at = datetime.now(UTC)
    with leaseq.connect(restartable_url, action="test") as conn:
        queue = leaseq.Queue(conn)
        wait_for(lambda: queue.get(job_id).status == "succeeded", "the job to resume", 60)
        assert assert_resumed_once(queue, job_id, wake, tmp_path) == "w-out"
        resumed = queue.attempts(job_id)[1].started_at or up_at
        print(f"resumed {(resumed - up_at).total_seconds():.2f}s after PostgreSQL was back")
    assert worker.proc.poll() is None  # the worker rode the outage out


def test_an_outage_as_the_job_goes_to_sleep_costs_no_attempt(
    restartable: RestartablePostgres,
    restartable_url: str,
    spawn_on: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    """PostgreSQL stops just as the handler reaches its sleep, for less than the lease: the
    wake time's record waits the outage out, the hand-back goes through once the server is
    back (the 2 s wake has passed by then, so the job is due at once), and the job finishes
    on its first attempt, the code after its sleep run once."""
    outage = 4.0
    worker = spawn_on(restartable_url, "w-gate", concurrency=1, lease=outage + 6, heartbeat=0.5)
    with leaseq.connect(restartable_url, action="test") as conn:
        queue = leaseq.Queue(conn)
        payload = {"dir": str(tmp_path), "seconds": 2.0, "gate": True}
        job_id = queue.enqueue("q", "nap", payload).job_id
        wait_for(lambda: lines(tmp_path / "before"), "the handler to start", 60)
    restartable.stop("fast")
    (tmp_path / "gate").touch()
    time.sleep(outage)  # the outage itself, not a synchronisation
    restartable.start()
    with leaseq.connect(restartable_url, action="test") as conn:
        queue = leaseq.Queue(conn)
        wait_for(lambda: queue.get(job_id).status == "succeeded", "the job to finish", 60)
        [step] = queue.steps(job_id)
        wake = datetime.fromisoformat(step.result)
        assert assert_resumed_once(queue, job_id, wake, tmp_path) == "w-gate"
    # The outage met the sleep: its record had to wait for the server.
    assert "not stored yet" in worker.log.read_text()


def test_a_job_whose_worker_is_killed_while_it_sleeps_resumes_once_on_another(
    database_url: str,
    conn: leaseq.core.db.Conn,
    spawn_on: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    """The worker that put the job to sleep is SIGKILLed; a new worker, started before the
    wake, claims the job at the wake and finishes it, though the job's key is limited to 1
    (the dead worker held no unit of it)."""
    queue = leaseq.Queue(conn)
    flow = leaseq.FlowControl(conn)
    flow.set_limit("q", "tenant-a", max_running=1)
    first = spawn_on(database_url, "w-a", concurrency=1, lease=2.0, heartbeat=0.5)
    job_id, wake = put_to_sleep(queue, tmp_path, key="tenant-a")
    first.signal(signal.SIGKILL)
    assert first.wait_exit() == -signal.SIGKILL
    [status] = flow.status(["q"])
    assert (status.running, status.held_silent) == (0, 0)
    spawn_on(database_url, "w-b", concurrency=1, lease=2.0, heartbeat=0.5)
    assert datetime.now(UTC) < wake, "w-b started after the wake: the test proved nothing"
    wait_for(lambda: queue.get(job_id).status == "succeeded", "w-b to resume the job", 60)
    assert assert_resumed_once(queue, job_id, wake, tmp_path) == "w-b"
    assert [a.worker for a in queue.attempts(job_id)] == ["w-a", "w-b"]
