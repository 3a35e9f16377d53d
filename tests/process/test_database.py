"""Connection loss: killed backends, and no listener at all."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

Spawn = Callable[..., WorkerProcess]


def sessions(conn: leaseq.core.db.Conn, worker_id: str) -> list[tuple[int, str]]:
    """(pid, last query) of the worker's sessions in this database."""
    rows = conn.execute(
        "SELECT pid, query FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s",
        [f"leaseq worker {worker_id}"],
    ).fetchall()
    return [(int(pid), str(query)) for pid, query in rows]


def enqueue(queue: leaseq.Queue, first: int, count: int) -> list[int]:
    return [
        queue.enqueue("q", "work", {"seconds": 0.3}, idempotency_key=f"k-{i}").job_id
        for i in range(first, first + count)
    ]


def succeeded(queue: leaseq.Queue, ids: list[int]) -> bool:
    return all(queue.get(i).status == "succeeded" for i in ids)


def test_killed_connections_are_replaced_and_work_carries_on(
    conn: leaseq.core.db.Conn, queue: leaseq.Queue, spawn_worker: Spawn
) -> None:
    a = spawn_worker("w-a", concurrency=2, lease=2)
    ids = enqueue(queue, 0, 6)
    wait_for(lambda: sum(queue.get(i).status == "succeeded" for i in ids) >= 2, "first jobs")

    killed = {pid for pid, _ in sessions(conn, "w-a")}
    assert len(killed) >= 2  # the pool and the listener
    conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [list(killed)])
    ids += enqueue(queue, 6, 6)

    wait_for(lambda: succeeded(queue, ids), "every job, after the connections were killed")
    wait_for(
        lambda: any(
            pid not in killed and query.startswith("LISTEN") for pid, query in sessions(conn, "w-a")
        ),
        "the listener to listen again",
    )
    assert a.proc.poll() is None
    for i, job_id in enumerate(ids):
        effect = queue.effect(f"k-{i}")
        assert effect is not None
        assert effect.job_id == job_id
    assert all(queue.get(i).attempt_count == 1 for i in ids)


def test_polling_alone_drains_every_job(
    conn: leaseq.core.db.Conn, queue: leaseq.Queue, spawn_worker: Spawn
) -> None:
    spawn_worker("w-a", concurrency=2, poll=0.3, listen=False)
    ids = enqueue(queue, 0, 8)
    wait_for(lambda: succeeded(queue, ids), "every job, by polling")
    assert not any(query.startswith("LISTEN") for _, query in sessions(conn, "w-a"))
