"""``async def`` handlers in real worker processes: concurrent on one event loop per
process (a module-level asyncio object serves every job), bounded by the slots; async and
plain durable steps memoized across attempts; errors classified as for plain handlers; a
batch handler; and a cancelled job's coroutine cancelled at its ``await``, which frees the
slot. Threads and child processes alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

APP = "async_app:registry"


def test_async_handlers_run_concurrently_on_one_loop(
    queue: leaseq.Queue, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    n = 4
    spawn_worker("w-1", app=APP, concurrency=n)
    ids = [queue.enqueue("q", "together", {"n": n}).job_id for _ in range(n)]
    wait_for(lambda: all(queue.get(i).finished_at for i in ids), "the jobs to finish", 90)
    jobs = [queue.get(i) for i in ids]
    assert [j.status for j in jobs] == ["succeeded"] * n, [j.last_error for j in jobs]
    # One loop on one thread: the same loop object, the same thread, in one process.
    assert len({(j.result["loop"], j.result["thread"], j.result["pid"]) for j in jobs}) == 1


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_async_steps_errors_and_batches(
    queue: leaseq.Queue,
    spawn_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
    isolation: str,
) -> None:
    spawn_worker("w-1", app=APP, concurrency=2, isolation=isolation)
    stepped = queue.enqueue("q", "steps", {"dir": str(tmp_path), "x": 20}).job_id
    refused = queue.enqueue("q", "refuse").job_id
    embeds = [queue.enqueue("q", "embed", {"x": x}).job_id for x in range(3)]
    everything = [stepped, refused, *embeds]
    wait_for(lambda: all(queue.get(i).finished_at for i in everything), "the jobs to end", 90)

    done = queue.get(stepped)
    assert (done.status, done.result, done.attempt_count) == ("succeeded", {"a": 40, "b": 41}, 2)
    # Each step's function ran once: the second attempt got both results back.
    assert (tmp_path / "double").read_text() == "x\n"
    assert (tmp_path / "plus_one").read_text() == "x\n"
    dead = queue.get(refused)
    assert (dead.status, dead.attempt_count) == ("dead", 1)
    assert dead.last_error == "PermanentError: not a document"
    for x, i in enumerate(embeds):
        job = queue.get(i)
        assert (job.status, job.result["x"]) == ("succeeded", x)


def test_a_step_whose_statement_waits_does_not_hold_up_the_other_async_jobs(
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
    database_url: str,
    spawn_worker: Callable[..., WorkerProcess],
) -> None:
    """One loop runs every async job of a worker: a step's statement that waits (here for a
    lock on the steps' table) waits off that loop, and another job runs to its end
    meanwhile. Had the statement run on the loop's thread, the other job could end only
    after the statement did."""

    def intent_waits() -> bool:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks"
            " WHERE relation = 'leaseq.job_steps'::regclass AND NOT granted"
        ).fetchone()
        return row is not None and row[0] > 0

    spawn_worker("w-1", app=APP, concurrency=2)
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE leaseq.job_steps IN EXCLUSIVE MODE")
        stepped = queue.enqueue("q", "one_step", {"x": 21}).job_id
        wait_for(intent_waits, "the step's intent to wait for the lock", 60)
        other = queue.enqueue("q", "quick").job_id
        wait_for(lambda: queue.get(other).status == "succeeded", "the other job to end", 60)
        assert intent_waits()  # it ended while the step's statement still waited
        assert queue.get(stepped).status == "running"
    wait_for(lambda: queue.get(stepped).status == "succeeded", "the step's job to end", 60)
    assert queue.get(stepped).result == 42


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_cancelled_async_job_is_cancelled_at_its_await_and_frees_its_slot(
    queue: leaseq.Queue,
    spawn_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
    isolation: str,
) -> None:
    spawn_worker("w-1", app=APP, concurrency=1, isolation=isolation)
    hour = queue.enqueue("q", "forever", {"dir": str(tmp_path)}).job_id
    wait_for(lambda: queue.get(hour).status == "running", "the job to start", 60)
    queue.cancel(hour)
    after = queue.enqueue("q", "quick").job_id
    # One slot: the next job runs only once the hour-long handler let go of it.
    wait_for(lambda: queue.get(after).status == "succeeded", "the slot to be freed", 60)
    assert queue.get(hour).status == "cancelled"
    if isolation == "thread":
        # The coroutine itself was cancelled (a child process is killed instead).
        wait_for(lambda: (tmp_path / "cancelled").exists(), "the coroutine to be cancelled", 30)


def test_cancelling_one_job_of_an_async_batch_leaves_the_others_running(
    queue: leaseq.Queue, spawn_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    # Both pending before the worker starts: one claim takes both into one batch.
    one, two = (queue.enqueue("q", "gated_batch", {"gate": str(gate)}).job_id for _ in "ab")
    worker = spawn_worker("w-1", app=APP, concurrency=1)
    wait_for(lambda: queue.get(two).status == "running" == queue.get(one).status, "the batch", 60)
    queue.cancel(one)
    # The worker sees the cancel at its next renewal and gives that attempt up.
    seen = f"job cancelled: handler told to stop job_id={one} "
    wait_for(lambda: seen in worker.log.read_text(errors="replace"), "the cancel seen", 30)
    gate.touch()
    wait_for(lambda: queue.get(two).finished_at, "the other job to finish", 60)
    other = queue.get(two)
    assert (other.status, other.attempt_count, other.result) == ("succeeded", 1, {"batch": 2})
    assert queue.get(one).status == "cancelled"
