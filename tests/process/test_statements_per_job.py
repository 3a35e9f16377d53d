"""Fewer statements per job, with real worker processes: free slots are filled by one claim
statement, and an attempt shorter than one heartbeat interval sends no heartbeat."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

Spawn = Callable[..., WorkerProcess]


def test_free_slots_are_filled_by_one_claim_statement(
    queue: leaseq.Queue, spawn_worker: Spawn, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    ids = [queue.enqueue("q", "gated", {"gate": str(gate)}).job_id for _ in range(4)]
    spawn_worker("w-a", concurrency=4, lease=30.0, heartbeat=10.0)
    jobs = wait_for(
        lambda: all(queue.get(i).status == "running" for i in ids) and [queue.get(i) for i in ids],
        "all four jobs to run",
    )
    # started_at is the claiming statement's transaction time: one value, one statement.
    assert len({j.started_at for j in jobs}) == 1
    gate.touch()
    wait_for(lambda: all(queue.get(i).status == "succeeded" for i in ids), "the jobs to finish")


def test_only_attempts_older_than_one_heartbeat_interval_are_renewed(
    queue: leaseq.Queue, spawn_worker: Spawn
) -> None:
    short = queue.enqueue("q", "work", {"seconds": 0}).job_id
    long = queue.enqueue("q", "work", {"seconds": 6}).job_id
    spawn_worker("w-a", concurrency=2, lease=15.0, heartbeat=5.0)
    wait_for(lambda: queue.get(short).status == "succeeded", "the short job", timeout=60)
    wait_for(lambda: queue.get(long).status == "succeeded", "the long job", timeout=60)
    quick = queue.get(short)
    assert quick.heartbeat_at == quick.started_at  # never renewed
    slow = queue.get(long)
    assert slow.heartbeat_at is not None and slow.started_at is not None
    assert slow.heartbeat_at > slow.started_at  # renewed after one interval
