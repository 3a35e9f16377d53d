"""A handler's mistakes (NULs, a 5 MB error, an Interrupted loop) never leave a job
running or cycling forever, and what is stored or logged stays bounded."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.faults


def test_nul_in_a_result_is_stored_with_a_note(
    database_url: str, queue: leaseq.Queue, spawn_on: Callable[..., WorkerProcess]
) -> None:
    spawn_on(database_url, "w-nul")
    job = queue.enqueue("q", "nul", {}).job_id
    wait_for(lambda: queue.get(job).status == "succeeded", "the job to succeed", 30)
    record = queue.get(job)
    assert record.result is not None
    assert record.result["text"] == "page\ufffdone\ufffd"
    assert record.result["k\ufffd"] == 1
    (attempt,) = queue.attempts(job)
    assert attempt.outcome == "succeeded"
    assert attempt.error is not None
    assert "3 NUL" in attempt.error


def test_huge_error_is_stored_cut_and_logged_bounded(
    database_url: str, queue: leaseq.Queue, spawn_on: Callable[..., WorkerProcess]
) -> None:
    worker = spawn_on(database_url, "w-huge")
    job = queue.enqueue("q", "huge_error", {}, max_attempts=1).job_id
    wait_for(lambda: queue.get(job).status == "dead", "the job to go dead", 60)
    error = queue.get(job).last_error
    assert error is not None
    assert error.startswith("RuntimeError: bad\ufffdinput\\x1b[31m yyy")
    assert len(error) < 20_000
    assert "cut" in error
    assert "5000029 characters in all" in error
    (attempt,) = queue.attempts(job)
    assert attempt.error == error
    assert worker.log.stat().st_size < 200_000


def test_a_handler_that_always_interrupts_goes_dead(
    database_url: str, queue: leaseq.Queue, spawn_on: Callable[..., WorkerProcess]
) -> None:
    """Interrupted outside a shutdown counts as an attempt: bounded by max_attempts."""
    spawn_on(database_url, "w-int")
    job = queue.enqueue("q", "interrupt", {}, max_attempts=3).job_id
    wait_for(lambda: queue.get(job).status == "dead", "the job to go dead", 60)
    record = queue.get(job)
    assert record.attempt_count == 3
    assert record.last_error_code == "INTERRUPTED"
    assert [a.outcome for a in queue.attempts(job)] == ["interrupted"] * 3
