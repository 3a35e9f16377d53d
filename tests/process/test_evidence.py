"""Failures that keep their evidence: a failed attempt's traceback is stored (from a thread or
a child process) and shown by ``leaseq jobs show``; a cancel reads as a cancel, at INFO; a
max runtime that passes is logged when it does. Real workers, real CLI processes."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import leaseq
from support.jobs import finished
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

Spawn = Callable[..., WorkerProcess]
SECRET = "postgresql://app:hunter2-not-shown@db.example/prod"


def cli(database_url: str, *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "leaseq.cli", *argv, "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def log_lines(worker: WorkerProcess, pattern: str) -> list[str]:
    return [line for line in worker.log.read_text().splitlines() if re.search(pattern, line)]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_failed_attempt_keeps_its_traceback_and_jobs_show_prints_it(
    database_url: str, queue: leaseq.Queue, spawn_worker: Spawn, isolation: str
) -> None:
    spawn_worker("w-tb", isolation=isolation)
    job_id = queue.enqueue(
        "q", "traceback", {"page": "x7", "secret": SECRET}, max_attempts=1
    ).job_id
    assert finished(queue, job_id).status == "dead"

    [attempt] = queue.attempts(job_id)
    trace = attempt.traceback or ""
    # Both exceptions of the chain, with the frame each was raised in.
    assert "in _parse_page" in trace and "in traceback_job" in trace
    assert "ValueError: invalid literal for int() with base 10: 'x7'" in trace
    assert "direct cause of the following exception" in trace
    assert trace.rstrip().endswith("unreadable, see postgresql://app:***@db.example/prod")
    assert "hunter2" not in trace

    shown = cli(database_url, "jobs", "show", str(job_id))
    assert f"traceback of attempt 1 (token {attempt.lease_token}, failed):" in shown
    assert "in _parse_page" in shown and "hunter2" not in shown
    # Without a key there is no effect row; the key handlers see is named, not shown as missing.
    assert re.search(rf"^idempotency key\s+- \(ctx.effect_key job:{job_id}\)$", shown, re.M), shown


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_cancelled_running_job_is_recorded_as_cancelled_at_info(
    queue: leaseq.Queue, spawn_worker: Spawn, isolation: str
) -> None:
    w = spawn_worker("w-c", isolation=isolation, lease=2, heartbeat=0.2)
    job_id = queue.enqueue("q", "work", {"seconds": 30, "cooperative": True}).job_id
    wait_for(lambda: queue.get(job_id).status == "running", "the job to start")
    queue.cancel(job_id, reason="not needed")
    wait_for(lambda: log_lines(w, "job cancelled: handler told to stop"), "the cancel logged")
    # Every line the worker wrote for the cancel is INFO (or DEBUG), none WARNING.
    said = log_lines(w, rf"job_id={job_id}\b")
    assert any(" INFO " in line and "job cancelled" in line for line in said), said
    assert not [line for line in said if " WARNING " in line or " ERROR " in line], said
    wait_for(
        lambda: (
            w.metric("leaseq_jobs_finished_total", queue="q", job_type="work", outcome="cancelled")
            == 1
        ),
        "the cancelled attempt counted",
    )
    [attempt] = queue.attempts(job_id)
    assert (attempt.outcome, attempt.error) == ("cancelled", "not needed")


def test_a_thread_mode_timeout_is_logged_when_it_fires(
    queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path
) -> None:
    w = spawn_worker("w-t", lease=2, heartbeat=0.2)
    pid_file = tmp_path / "runaway.pid"
    job_id = queue.enqueue(
        "q", "runaway", {"pid_file": str(pid_file)}, timeout=1.0, max_attempts=1
    ).job_id
    # The handler never ends (a thread cannot be killed): the log line must come anyway.
    [line] = wait_for(
        lambda: log_lines(w, "timed out: ran past its max runtime"), "the timeout logged"
    )
    assert " WARNING " in line and f"job_id={job_id}" in line
    assert "its result will be dropped" in line
