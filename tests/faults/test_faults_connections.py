"""Killed connections, a restarted PostgreSQL and an outage shorter than the lease never
cost a job an attempt."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import psycopg
import pytest

import leaseq
from support.pgserver import RestartablePostgres
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.faults


def worker_pids(conn: leaseq.core.db.Conn, worker_id: str) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s",
        [f"leaseq worker {worker_id}"],
    ).fetchall()
    return [int(r[0]) for r in rows]


def failures(conn: leaseq.core.db.Conn, job_ids: list[int]) -> list[tuple[int, str, str | None]]:
    """Attempts that did not succeed and were not a free release, with their errors."""
    rows = conn.execute(
        "SELECT job_id, outcome::text, error FROM leaseq.job_attempts"
        " WHERE job_id = ANY(%s) AND outcome NOT IN ('succeeded', 'released')",
        [job_ids],
    ).fetchall()
    return [(int(a), str(b), c) for a, b, c in rows]


def test_killed_pooled_connections_cost_no_attempt(
    database_url: str, conn: leaseq.core.db.Conn, spawn_on: Callable[..., WorkerProcess]
) -> None:
    """Every connection of a worker is killed again and again while its handlers checkpoint:
    each call goes through on a fresh connection, and every job succeeds on attempt 1."""
    queue = leaseq.Queue(conn)
    spawn_on(database_url, "w-kill", concurrency=3, lease=5.0, heartbeat=0.5)
    ids = [
        queue.enqueue("q", "step", {"seconds": 3.0, "checkpoint_every": 0.1}).job_id
        for _ in range(6)
    ]
    wait_for(lambda: all(queue.get(i).status != "pending" for i in ids[:3]), "claims")
    killed = 0
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline:
        pids = worker_pids(conn, "w-kill")
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
        killed += len(pids)
        time.sleep(0.3)
    assert killed >= 10
    wait_for(lambda: all(queue.get(i).status == "succeeded" for i in ids), "every job", 60)
    assert failures(conn, ids) == []
    assert [queue.get(i).attempt_count for i in ids] == [1] * len(ids)


class Prober:
    """Records the first moment (time.time()) PostgreSQL accepts a connection again."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.up_at: float | None = None
        self.armed = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.armed.wait()
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
            except psycopg.Error:
                time.sleep(0.005)
                continue
            self.up_at = time.time()
            return


def first_heartbeat_after(conn: leaseq.core.db.Conn, job_id: int, after: float) -> float | None:
    row = conn.execute(
        "SELECT extract(epoch FROM heartbeat_at)::float8 FROM leaseq.jobs WHERE id = %s",
        [job_id],
    ).fetchone()
    return float(row[0]) if row and row[0] is not None and row[0] > after else None


def test_outage_shorter_than_the_lease_costs_no_attempt(
    restartable: RestartablePostgres,
    restartable_url: str,
    spawn_on: Callable[..., WorkerProcess],
    reaper_on: Callable[..., object],
) -> None:
    """PostgreSQL stops for 10 s (LEASEQ_FAULTS_OUTAGE_SECONDS) under a worker holding a lease
    6 s longer: the worker renews the lease as soon as the server is back, and the job
    succeeds on its first attempt. Prints the time from "accepting connections" to the first
    heartbeat."""
    outage = float(os.environ.get("LEASEQ_FAULTS_OUTAGE_SECONDS", "10"))
    reaper_on(restartable_url, 0.5)
    spawn_on(restartable_url, "w-out", concurrency=1, lease=outage + 6, heartbeat=1.0)
    with leaseq.connect(restartable_url, action="test") as conn:
        job = leaseq.Queue(conn).enqueue("q", "step", {"seconds": outage + 10}).job_id
        wait_for(lambda: first_heartbeat_after(conn, job, 0), "the job to start")
    prober = Prober(restartable_url)
    restartable.stop("fast")
    prober.armed.set()
    time.sleep(outage)  # the outage itself, not a synchronisation
    restartable.start()
    wait_for(lambda: prober.up_at, "PostgreSQL to accept connections", 30)
    assert prober.up_at is not None
    with leaseq.connect(restartable_url, action="test") as conn:
        beat = wait_for(
            lambda: first_heartbeat_after(conn, job, prober.up_at or 0), "a heartbeat", 40
        )
        print(f"first heartbeat {beat - prober.up_at:.2f}s after PostgreSQL accepted again")
        queue = leaseq.Queue(conn)
        wait_for(lambda: queue.get(job).status == "succeeded", "the job to finish", 60)
        assert queue.get(job).attempt_count == 1
        assert [a.outcome for a in queue.attempts(job)] == ["succeeded"]
