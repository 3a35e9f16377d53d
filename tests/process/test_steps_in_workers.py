"""Durable steps in real worker processes, both isolation modes: SIGKILL inside a step
after its effect, the retry resumes after the recorded steps and reconciles the uncertain
one; without a way to reconcile the job stops uncertain and `leaseq steps resolve` finishes
it; a worker frozen (SIGSTOP) inside a step records nothing when it resumes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

Spawn = Callable[..., WorkerProcess]
APP = "steps_app:registry"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def cli(database_url: str, *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "leaseq.cli", *argv, "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def crash_in_the_charge(
    queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path, mode: str, isolation: str
) -> tuple[int, WorkerProcess]:
    """Enqueue a three-step job, SIGKILL its first worker once step 2's effect is written
    (before the step is recorded), and start a second worker; returns the job and it."""
    folder = tmp_path / "effects"
    folder.mkdir()
    job_id = queue.enqueue("q", "three_steps", {"dir": str(folder), "mode": mode}).job_id
    a = spawn_worker("w-a", app=APP, isolation=isolation)
    wait_for(lambda: lines(folder / "effects"), "step 2's effect", timeout=60)
    a.signal(signal.SIGKILL)
    assert a.wait_exit() == -signal.SIGKILL
    return job_id, spawn_worker("w-b", app=APP, isolation=isolation)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_retry_resumes_after_recorded_steps_and_reconciles_the_uncertain_one(
    queue: leaseq.Queue,
    spawn_worker: Spawn,
    reaper: list[leaseq.Reaped],
    tmp_path: Path,
    isolation: str,
) -> None:
    job_id, _ = crash_in_the_charge(queue, spawn_worker, tmp_path, "reconcile", isolation)
    job = wait_for(
        lambda: (j := queue.get(job_id)).status == "succeeded" and j, "the retry", timeout=60
    )
    folder = tmp_path / "effects"
    key = f"job:{job_id}:step:charge"
    assert lines(folder / "fetch.calls") == ["w-a 1"]
    assert [c.split()[:2] for c in lines(folder / "charge.calls")] == [["w-a", "1"]]
    assert lines(folder / "check.calls") == ["w-b 2 1"]
    assert lines(folder / "publish.calls") == ["w-b 2"]
    assert lines(folder / "effects") == [key]
    assert job.result == {
        "pages": {"pages": 3},
        "charged": {"charged": key, "found": True},
        "published": f"published after {key}",
    }
    assert list(queue.stream(job_id)) == [leaseq.StreamItem(1, {"published": key})]
    steps = {s.name: s for s in queue.steps(job_id)}
    assert {n: (s.attempt, s.recorded) for n, s in steps.items()} == {
        "fetch": (1, True),
        "charge": (2, True),
        "publish": (2, True),
    }


def test_an_idempotent_step_runs_again_under_the_same_key(
    queue: leaseq.Queue, spawn_worker: Spawn, reaper: list[leaseq.Reaped], tmp_path: Path
) -> None:
    job_id, _ = crash_in_the_charge(queue, spawn_worker, tmp_path, "idempotent", "thread")
    wait_for(lambda: queue.get(job_id).status == "succeeded", "the retry", timeout=60)
    folder = tmp_path / "effects"
    key = f"job:{job_id}:step:charge"
    assert lines(folder / "charge.calls") == [f"w-a 1 {key}", f"w-b 2 {key}"]
    assert lines(folder / "effects") == [key]
    assert lines(folder / "fetch.calls") == ["w-a 1"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_without_reconcile_the_job_stops_uncertain_and_steps_resolve_finishes_it(
    queue: leaseq.Queue,
    spawn_worker: Spawn,
    reaper: list[leaseq.Reaped],
    tmp_path: Path,
    database_url: str,
    isolation: str,
) -> None:
    job_id, b = crash_in_the_charge(queue, spawn_worker, tmp_path, "none", isolation)
    held = wait_for(
        lambda: (j := queue.get(job_id)).status == "held" and j, "the uncertain stop", timeout=60
    )
    assert held.last_error_code == "StepUncertain"
    assert "step 'charge' is uncertain" in (held.last_error or "")
    assert b.metric("leaseq_steps_uncertain_total", queue="q", job_type="three_steps") == 1
    status = json.loads(cli(database_url, "status", "--json"))
    assert [(u["job_id"], u["name"]) for u in status["uncertain_steps"]] == [(job_id, "charge")]
    assert "uncertain" in cli(database_url, "jobs", "show", str(job_id))

    cli(
        database_url, "steps", "resolve", str(job_id), "charge",
        "--result", '{"charged": "seen in the ledger"}', "--reason", "ledger entry 17",
        "--by", "ops",
    )  # fmt: skip
    job = wait_for(lambda: (j := queue.get(job_id)).status == "succeeded" and j, "the resolved job")
    folder = tmp_path / "effects"
    assert job.result["charged"] == {"charged": "seen in the ledger"}
    assert len(lines(folder / "charge.calls")) == 1
    assert lines(folder / "fetch.calls") == ["w-a 1"]
    assert [c.split()[0] for c in lines(folder / "publish.calls")] == ["w-b"]
    assert not (folder / "check.calls").exists()
    step = next(s for s in queue.steps(job_id) if s.name == "charge")
    assert (step.resolved_by, step.resolve_reason) == ("ops", "ledger entry 17")


def test_a_worker_frozen_in_a_step_records_nothing_when_it_resumes(
    queue: leaseq.Queue, spawn_worker: Spawn, reaper: list[leaseq.Reaped], tmp_path: Path
) -> None:
    folder = tmp_path / "frozen"
    folder.mkdir()
    job_id = queue.enqueue("q", "gated_step", {"dir": str(folder)}).job_id
    a = spawn_worker("w-a", app=APP)
    wait_for(lambda: lines(folder / "write.calls") == ["w-a"], "w-a inside the step")
    a.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: reaper, "the reaper to take the job back")
        spawn_worker("w-b", app=APP)
        wait_for(lambda: lines(folder / "write.calls") == ["w-a", "w-b"], "w-b inside the step")
        (folder / "gate").touch()
        wait_for(lambda: queue.get(job_id).status == "succeeded", "w-b to finish the job")
    finally:
        a.signal(signal.SIGCONT)
    wait_for(lambda: "lease lost: step 'write'" in a.log.read_text(), "w-a's step fenced")
    [step] = queue.steps(job_id)
    assert (step.result, step.attempt, step.lease_token) == ({"by": "w-b"}, 2, 2)
    assert queue.get(job_id).result == {"step": {"by": "w-b"}}


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_sleeping_job_is_handed_back_and_resumes_after_its_step(
    queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path, isolation: str
) -> None:
    job_id = queue.enqueue("q", "nap", {"dir": str(tmp_path), "seconds": 1}).job_id
    spawn_worker("w-a", app=APP, isolation=isolation)
    wait_for(lambda: queue.get(job_id).status == "succeeded", "the job to wake and finish")

    job = queue.get(job_id)
    assert (job.result, job.attempt_count) == ({"step": "before", "woke": "w-a"}, 1)
    assert [a.outcome for a in queue.attempts(job_id)] == ["released", "succeeded"]
    assert lines(tmp_path / "before.calls") == ["w-a 1"]


#: How long after job A's wait began the test sends its signal (the issue's done-when).
SIGNAL_AFTER_SECONDS = 10.0


@pytest.mark.parametrize(
    ("isolation", "keyed"), [("thread", False), ("thread", True), ("process", True)]
)
def test_a_job_waiting_for_a_signal_holds_no_slot_nor_unit_and_a_signal_resumes_it(
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
    spawn_worker: Spawn,
    tmp_path: Path,
    isolation: str,
    keyed: bool,
) -> None:
    """One worker slot (and, keyed, a limit of 1 on the key A and B share): B runs to the
    end while A waits; a signal sent 10 s into the wait resumes A, which finishes after its
    recorded step, without a failed attempt."""
    key = "tenant" if keyed else None
    if keyed:
        leaseq.FlowControl(conn).set_limit("q", "tenant", max_running=1)
    spawn_worker("w-a", app=APP, isolation=isolation, concurrency=1)
    a = queue.enqueue("q", "approval", {"dir": str(tmp_path)}, key=key).job_id
    wait_for(lambda: queue.get(a).waiting_for == "approve", "A to wait", timeout=60)
    waiting_since = time.monotonic()
    waited = queue.get(a)
    assert (waited.status, waited.attempt_count, waited.lease_expires_at) == ("pending", 0, None)

    b = queue.enqueue("q", "quick", key=key).job_id
    wait_for(lambda: queue.get(b).status == "succeeded", "B to run while A waits", timeout=60)
    assert queue.get(a).waiting_for == "approve"

    # The signal comes 10 s into the wait (the worker has nothing to run meanwhile): a
    # delay the scenario asks for, not a bound on anything.
    time.sleep(max(0.0, SIGNAL_AFTER_SECONDS - (time.monotonic() - waiting_since)))
    assert queue.get(a).status == "pending"
    assert queue.signal(a, "approve", {"by": "ana"}).waiting
    done = wait_for(
        lambda: (j := queue.get(a)).status == "succeeded" and j, "A to resume", timeout=60
    )
    assert done.result == {"draft": "draft", "decision": {"by": "ana"}}
    assert done.attempt_count == 1 and done.waiting_for is None
    assert [x.outcome for x in queue.attempts(a)] == ["released", "succeeded"]
    assert lines(tmp_path / "draft.calls") == ["w-a 1"]
    assert lines(tmp_path / "after.calls") == ["w-a 1"]
    b_started = queue.attempts(b)[0].started_at
    a_waited, a_resumed = queue.attempts(a)
    assert a_waited.ended_at is not None and b_started is not None
    assert a_waited.ended_at < b_started < (a_resumed.started_at or b_started)


def test_a_wait_past_its_deadline_raises_in_the_handler_and_the_job_dies_once(
    queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path
) -> None:
    """No signal within 1 s: the job comes back at its deadline, wait_for raises
    WaitTimedOut, and the job is dead after that one attempt (permanent by default)."""
    spawn_worker("w-a", app=APP, concurrency=1)
    a = queue.enqueue("q", "approval", {"dir": str(tmp_path), "timeout": 1}).job_id
    dead = wait_for(lambda: (j := queue.get(a)).status == "dead" and j, "A to time out", 60)
    assert dead.last_error_code == "WaitTimedOut" and "'approve'" in (dead.last_error or "")
    assert [x.outcome for x in queue.attempts(a)] == ["released", "failed"]
    assert lines(tmp_path / "draft.calls") == ["w-a 1"]
    assert lines(tmp_path / "after.calls") == []


def test_retrying_a_job_that_died_waiting_waits_afresh_and_takes_a_later_signal(
    queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path
) -> None:
    """A job dead of WaitTimedOut, retried: its next attempt waits again with a new deadline
    (the timed-out one is withdrawn by the retry) and a signal sent after the retry reaches
    it; the step before the wait is not run again."""
    spawn_worker("w-a", app=APP, concurrency=1)
    a = queue.enqueue("q", "approval", {"dir": str(tmp_path), "timeout": 1}).job_id
    wait_for(lambda: queue.get(a).status == "dead", "A to time out", 60)
    with pytest.raises(leaseq.JobStateError):
        queue.signal(a, "approve", "too late")  # a dead job refuses signals

    (tmp_path / "timeout").write_text("3600")  # the retried wait must outlive a slow machine
    queue.retry_dead(a)
    waiting = wait_for(
        lambda: (j := queue.get(a)).waiting_for == "approve" and j, "A to wait again", 60
    )
    assert waiting.status == "pending" and waiting.last_error_code == "WaitTimedOut"
    deadline = next(s for s in queue.steps(a) if s.name == "leaseq.wait-1")
    assert deadline.resolved_by == "retry" and deadline.finished_at is not None
    assert waiting.waiting_since is not None
    assert datetime.fromisoformat(deadline.result) - waiting.waiting_since > timedelta(minutes=30)

    assert queue.signal(a, "approve", {"ok": "late"}).stored
    done = wait_for(lambda: (j := queue.get(a)).status == "succeeded" and j, "A to finish", 60)
    assert done.result == {"draft": "draft", "decision": {"ok": "late"}}
    assert [x.outcome for x in queue.attempts(a)] == ["released", "failed", "released", "succeeded"]
    assert lines(tmp_path / "draft.calls") == ["w-a 1"]
    assert len(lines(tmp_path / "after.calls")) == 1


def test_a_reused_step_name_kills_the_job_on_its_first_attempt_naming_the_step(
    queue: leaseq.Queue, spawn_worker: Spawn
) -> None:
    """A reused step name is a bug in the handler, not a transient fault: no retry with
    backoff, the job is dead after one attempt with an error that names the step."""
    spawn_worker("w-a", app=APP)
    job_id = queue.enqueue("q", "same_name", max_attempts=5).job_id
    dead = wait_for(lambda: (j := queue.get(job_id)).status == "dead" and j, "the job to die", 60)
    assert dead.last_error_code == "StepNameReused"
    assert "step 'fetch' ran already in this attempt" in (dead.last_error or "")
    assert [a.outcome for a in queue.attempts(job_id)] == ["failed"]
