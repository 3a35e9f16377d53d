"""The history mover in a real ``leaseq reaper`` process: SIGKILLed mid-run, then replaced by
another copy after its lease lapses; every finished job ends up moved exactly once, none lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq
from support.polling import wait_for

JOBS = 60000
Conn = leaseq.core.db.Conn


@pytest.fixture
def reapers(database_url: str, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def start(database_url: str, tmp_path: Path, holder: str) -> subprocess.Popen[bytes]:
    with (tmp_path / f"{holder}.log").open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "leaseq.cli", "reaper", "--operator-id", holder,
             "--reap-interval-seconds", "0.5", "--leader-ttl-seconds", "6",
             "--hot-retention", "1h"],
            env={**os.environ, "LEASEQ_DATABASE_URL": database_url},
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def one(conn: Conn, sql: str) -> int:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def accounted(conn: Conn) -> tuple[int, int, int, int]:
    """(hot, history, ledger, in both places): every job is in exactly one place."""
    return (
        one(conn, "SELECT count(*) FROM leaseq.jobs"),
        one(conn, "SELECT count(*) FROM leaseq.job_history"),
        one(conn, "SELECT count(*) FROM leaseq.job_ledger"),
        one(conn, "SELECT count(*) FROM leaseq.jobs j JOIN leaseq.job_ledger l USING (id)"),
    )


def test_a_sigkilled_mover_loses_nothing_and_its_successor_finishes(
    conn: Conn, database_url: str, tmp_path: Path, reapers: list[subprocess.Popen[bytes]]
) -> None:
    conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type, status, attempt_count, lease_token,"
        " lease_owner, started_at, finished_at)"
        " SELECT 'q', 't', 'succeeded', 1, 1, 'w', now() - interval '2 hours',"
        "        now() - interval '2 hours' + i * interval '1 ms' FROM generate_series(1, %s) i",
        (JOBS,),
    )
    conn.execute(
        "INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, outcome)"
        " SELECT id, 1, 1, 'w', 'succeeded' FROM leaseq.jobs"
    )
    first = start(database_url, tmp_path, "m1")
    reapers.append(first)
    wait_for(lambda: 0 < accounted(conn)[2] < JOBS // 2, "the first mover mid-run", timeout=60)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)

    hot, history, ledger, both = accounted(conn)
    assert (hot + history, history, both) == (JOBS, ledger, 0)
    assert one(conn, "SELECT count(*) FROM leaseq.job_attempt_history") == history

    reapers.append(start(database_url, tmp_path, "m2"))  # leads once m1's lease lapses
    wait_for(lambda: accounted(conn)[0] == 0, "the second mover to finish", timeout=180)
    assert accounted(conn) == (0, JOBS, JOBS, 0)
    assert one(conn, "SELECT count(DISTINCT id) FROM leaseq.job_history") == JOBS
    assert one(conn, "SELECT count(*) FROM leaseq.job_attempt_history") == JOBS
    assert one(conn, "SELECT count(*) FROM leaseq.job_attempts") == 0
    assert one(conn, "SELECT sum(jobs) FROM leaseq.history_counts") == JOBS
    assert one(conn, "SELECT moved FROM leaseq.history_mover") == JOBS
    holder = conn.execute("SELECT holder FROM leaseq.leader_leases").fetchone()
    assert holder == ("m2",)
