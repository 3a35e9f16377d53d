"""Micro-batching (``@registry.batch``) in real workers, with threads and with child
processes: each job of a batch keeps its own lease and token; the batch's successes complete
in one statement; one bad input fails only its own job; claims fill a batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import leaseq
from support.jobs import finished, take_over
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = [pytest.mark.process, pytest.mark.parametrize("isolation", ["thread", "process"])]

Spawn = Callable[..., WorkerProcess]


def test_a_stale_token_in_the_middle_of_a_batch_fences_only_that_job(
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
    spawn_worker: Spawn,
    tmp_path: Path,
    isolation: str,
) -> None:
    gate = tmp_path / "gate"
    specs = [
        leaseq.JobSpec("q", "embed", {"text": text, "gate": str(gate)}, idempotency_key=text)
        for text in ("a", "bb", "ccc")
    ]
    first, middle, last = (e.job_id for e in queue.enqueue_many(specs))
    # Each member its own token (drain releases cost no attempt): a batch settled with one
    # member's token for all would fence the others.
    for limit in (2, 1):
        for job in queue.claim(["q"], "deploy", limit=limit):
            queue.release(job.lease)
    # A long lease and heartbeat: only complete_many can notice the stale token.
    w = spawn_worker("w-a", isolation=isolation, lease=60, heartbeat=20)
    wait_for(
        lambda: all(queue.get(j).status == "running" for j in (first, middle, last)),
        "the batch to be claimed",
    )
    assert [queue.get(j).lease_token for j in (first, middle, last)] == [5, 3, 1]
    # Until the batch closes, the worker claims to fill it, and would take the reaped job back.
    wait_for(lambda: (tmp_path / "gate.entered").exists(), "the batch to close and run")
    # The middle job is taken over: its lease expires, the reaper returns it, another
    # worker claims it (a new token) and completes it.
    thief = take_over(queue, conn, middle)
    assert isinstance(queue.complete(thief.lease, {"by": "thief"}), leaseq.Completed)

    gate.touch()
    jobs = [finished(queue, j) for j in (first, middle, last)]

    assert [j.status for j in jobs] == ["succeeded"] * 3
    assert jobs[0].result["batch"] == jobs[2].result["batch"] == [first, middle, last]
    assert jobs[1].result == {"by": "thief"}
    # The batch's successes completed in one statement (one transaction timestamp).
    assert jobs[0].finished_at == jobs[2].finished_at
    # The refusal is recorded right after the statement that completed the others.
    wait_for(
        lambda: (
            [(a.worker, a.outcome) for a in queue.attempts(middle)]
            == [("deploy", "released"), ("w-a", "fenced"), ("thief", "succeeded")]
        ),
        "the fenced refusal recorded",
    )
    attempts = queue.attempts(middle)
    assert (attempts[1].error or "").startswith("complete refused")
    for job, text, by in zip(jobs, ("a", "bb", "ccc"), ("w-a", "thief", "w-a"), strict=True):
        effect = queue.effect(text)
        assert effect is not None
        assert (effect.job_id, effect.produced_by) == (job.id, by)
    assert w.metric("leaseq_fenced_calls_total", queue="q") == 1


def test_one_bad_input_fails_only_its_own_job(
    queue: leaseq.Queue, spawn_worker: Spawn, isolation: str
) -> None:
    spawn_worker("w-a", isolation=isolation)
    payloads = [{"text": "a"}, {"image": "no text"}, {"text": "ccc"}]
    specs = [leaseq.JobSpec("q", "embed", p) for p in payloads]
    ids = [e.job_id for e in queue.enqueue_many(specs)]
    good, bad, other = (finished(queue, j) for j in ids)

    assert (good.status, other.status) == ("succeeded", "succeeded")
    assert good.result["batch"] == other.result["batch"] == ids
    assert (good.result["length"], other.result["length"]) == (1, 3)
    assert bad.status == "dead"
    assert bad.attempt_count == 1
    assert bad.last_error == "PermanentError: no text in {'image': 'no text'}"
    assert [a.outcome for a in queue.attempts(bad.id)] == ["failed"]


def test_a_batch_fills_from_several_claims(
    queue: leaseq.Queue, spawn_worker: Spawn, isolation: str
) -> None:
    # embed_fill waits up to a minute for three jobs; they arrive one claim at a time.
    spawn_worker("w-a", isolation=isolation)
    ids = []
    for _ in range(2):
        ids.append(queue.enqueue("q", "embed_fill").job_id)
        wait_for(lambda: queue.get(ids[-1]).status == "running", "the job to join the batch")
    ids.append(queue.enqueue("q", "embed_fill").job_id)  # the third fills the batch
    jobs = [finished(queue, j) for j in ids]

    assert [j.result for j in jobs] == [{"batch": ids}] * 3
    starts = [queue.attempts(j)[0].started_at for j in ids]
    assert len(set(starts)) == 3  # three claims
    assert len({j.finished_at for j in jobs}) == 1  # one completing statement


def _batch_sizes(queue: leaseq.Queue, ids: list[int]) -> list[int]:
    """The size of each batch the jobs ran in, in the order the batches ran (every job must
    succeed)."""
    jobs = [finished(queue, j) for j in ids]
    assert [j.status for j in jobs] == ["succeeded"] * len(ids)
    batches = {tuple(j.result["batch"]): j.finished_at for j in jobs}
    return [len(b) for b in sorted(batches, key=lambda b: batches[b])]


# The poll interval outlasts every test: nothing but the claims made as a batch opens can
# fill it, and the backlog is already there (no notification wakes the worker for it).
NEVER_POLL = 600


def test_a_backlog_enqueued_before_the_worker_starts_runs_in_full_batches(
    queue: leaseq.Queue, spawn_worker: Spawn, isolation: str
) -> None:
    # embed_backlog: max_batch 4; 12 jobs are three model calls, not 4 + 8 x 1.
    specs = [leaseq.JobSpec("q", "embed_backlog", {"n": n}) for n in range(12)]
    ids = [e.job_id for e in queue.enqueue_many(specs)]
    spawn_worker("w-a", isolation=isolation, poll=NEVER_POLL)

    assert _batch_sizes(queue, ids) == [4, 4, 4]


def test_a_backlog_that_grows_while_the_worker_runs_fills_every_batch(
    queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path, isolation: str
) -> None:
    spawn_worker("w-a", isolation=isolation, poll=NEVER_POLL)
    gate = tmp_path / "gate"
    first = [
        e.job_id
        for e in queue.enqueue_many(
            [leaseq.JobSpec("q", "embed_backlog", {"gate": str(gate)}) for _ in range(4)]
        )
    ]
    wait_for(
        lambda: all(queue.get(j).status == "running" for j in first), "the first batch to fill"
    )
    # While the first batch holds the worker, the backlog grows by two batches.
    more = [
        e.job_id
        for e in queue.enqueue_many([leaseq.JobSpec("q", "embed_backlog", {}) for _ in range(8)])
    ]
    gate.touch()

    assert _batch_sizes(queue, first + more) == [4, 4, 4]
