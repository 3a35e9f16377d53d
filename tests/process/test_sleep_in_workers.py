"""Durable sleep in real worker processes: a worker with one slot runs a job enqueued while
another sleeps, then wakes the sleeper at its recorded time and it completes on its first
attempt; the same under a flow key limited to 1 (a sleeping job holds no unit of it), and
with the handlers in child processes (``--isolation process``). An idle worker whose poll
has backed off to a minute claims a sleeper at its wake time, told by the hand-back's
notification (issue 60)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import leaseq
from support.dbtime import claim_one, db_now
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

APP = "steps_app:registry"

#: How long A sleeps. B needs one claim (woken by NOTIFY), a handler that returns at once and
#: one completion, well under a second even on a loaded machine: 10 s leaves a wide margin
#: for B to finish inside A's sleep (which the test checks in database time, not assumes),
#: and keeps each case short. The issue's 30 s would prove no more.
NAP_SECONDS = 10.0


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def database_now(conn: leaseq.core.db.Conn) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


@pytest.mark.parametrize(
    ("isolation", "keyed"),
    [("thread", False), ("thread", True), ("process", True)],
    ids=["thread", "thread-key-limit-1", "process-key-limit-1"],
)
def test_one_slot_runs_another_job_while_one_sleeps_and_the_sleeper_resumes(
    conn: leaseq.core.db.Conn,
    queue: leaseq.Queue,
    spawn_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
    isolation: str,
    keyed: bool,
) -> None:
    key = "tenant-a" if keyed else None
    flow = leaseq.FlowControl(conn)
    if keyed:
        flow.set_limit("q", "tenant-a", max_running=1)
    spawn_worker("w-1", app=APP, isolation=isolation, concurrency=1)
    a = queue.enqueue("q", "nap", {"dir": str(tmp_path), "seconds": NAP_SECONDS}, key=key).job_id
    wait_for(lambda: [x.outcome for x in queue.attempts(a)] == ["released"], "A to sleep", 60)
    slept = queue.get(a)
    assert (slept.status, slept.attempt_count) == ("pending", 0)
    wake = slept.available_at
    [step_record] = [s for s in queue.steps(a) if s.name == "leaseq.sleep-1"]
    assert datetime.fromisoformat(step_record.result) == wake  # the recorded wake time
    if keyed:
        [status] = flow.status(["q"])
        assert (status.key, status.running, status.max_running) == ("tenant-a", 0, 1)

    # One slot and (keyed) a limit of 1: B runs only if the sleeping A holds neither.
    b = queue.enqueue("q", "quick", key=key).job_id
    wait_for(lambda: queue.get(b).status == "succeeded", "B to run while A sleeps", 60)
    [b_run] = queue.attempts(b)
    assert b_run.ended_at < wake, "B finished after A's wake: not while A slept"
    assert queue.get(a).status == "pending"

    wait_for(lambda: queue.get(a).status == "succeeded", "A to wake and finish", NAP_SECONDS + 60)
    b_took = (b_run.ended_at - queue.get(b).created_at).total_seconds()
    woke = queue.attempts(a)[1].started_at or wake
    print(f"B done {b_took:.2f}s after its enqueue; A claimed {woke - wake} after its wake")
    assert database_now(conn) >= wake
    done = queue.get(a)
    assert (done.result, done.attempt_count) == ({"step": "before", "woke": "w-1"}, 1)
    released, succeeded = queue.attempts(a)
    assert (released.outcome, succeeded.outcome) == ("released", "succeeded")
    assert released.error is not None and released.error.startswith("sleeping until")
    assert succeeded.started_at is not None and succeeded.started_at >= wake
    assert (released.attempt, succeeded.attempt) == (1, 1)  # the sleep spent no attempt
    # Each step was recorded once, by the first attempt; the code after the sleep ran once.
    assert [(s.name, s.attempt) for s in queue.steps(a)] == [("before", 1), ("leaseq.sleep-1", 1)]
    assert lines(tmp_path / "before.calls") == ["w-1 1"]
    assert lines(tmp_path / "after.calls") == ["w-1 1"]


def test_a_sleep_given_a_bad_time_fails_its_job_at_once_naming_the_argument(
    queue: leaseq.Queue, spawn_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    bad = {
        -1: "invalid seconds: must not be negative, got -1",
        "inf": "invalid seconds: must be a finite number, got 'inf'",
        10**400: "invalid seconds: must be a finite number, got an integer of 1329 bits",
        400_000_000: "invalid seconds: must be at most 315360000 seconds (3650 days)",
    }
    ids = {
        queue.enqueue("q", "nap", {"dir": str(tmp_path), "seconds": seconds}).job_id: message
        for seconds, message in bad.items()
    }
    spawn_worker("w-1", app=APP)
    wait_for(lambda: all(queue.get(i).status == "dead" for i in ids), "the jobs to fail", 60)
    for job_id, message in ids.items():
        [attempt] = queue.attempts(job_id)
        assert attempt.outcome == "failed"
        assert message in (queue.get(job_id).last_error or "")
    assert lines(tmp_path / "after.calls") == []


#: The worker's poll interval: far longer than the test may wait for the sleeper.
POLL_SECONDS = 60.0
#: Empty claims that bring the idle backoff's step to its cap: it starts at 0.5 s and
#: doubles on every claim that finds nothing (leaseq.runtime.dispatcher), so after
#: log2(60 / 0.5) < 7 of them the next poll is at least POLL_SECONDS / 2 away.
EMPTY_CLAIMS = 8


def claims(worker: WorkerProcess) -> int:
    return int(worker.metric("leaseq_claim_latency_seconds_count"))


def test_an_idle_worker_backed_off_to_its_poll_claims_a_sleeper_at_its_wake(
    conn: leaseq.core.db.Conn, queue: leaseq.Queue, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    """The test runs the job's first attempt and sleeps 1 s; the worker, whose next poll is
    at least 30 s away by then, runs the job within 10 s: only the sleep's wake-up can
    explain it."""
    job_id = queue.enqueue("q", "quick").job_id
    held = claim_one(queue, "the-test", lease_seconds=60)
    worker = spawn_worker("w-1", app=APP, poll=POLL_SECONDS)
    wait_for(lambda: claims(worker) >= 1, "the worker's first claim")
    # Each enqueue of a type it does not serve wakes it for a claim that finds nothing.
    for _ in range(EMPTY_CLAIMS):
        seen = claims(worker)
        queue.enqueue("q", "served-by-nobody")
        wait_for(lambda seen=seen: claims(worker) > seen, "an empty claim on the wake-up")

    wake = db_now(conn) + timedelta(seconds=1)
    assert isinstance(queue.sleep(held.lease, wake), leaseq.Released)
    wait_for(lambda: queue.get(job_id).status == "succeeded", "the sleeper to run", timeout=10)
    slept, ran = queue.attempts(job_id)
    assert (slept.outcome, ran.worker) == ("released", "w-1")
    assert ran.started_at is not None and ran.started_at >= wake
