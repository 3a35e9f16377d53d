"""``leaseq reaper``: the operator's reaper without Kubernetes, as real processes. Two copies:
one reaps; SIGTERM hands the lease over at once; a SIGSTOPped leader is replaced after its
TTL, and when it wakes it cannot act in a term that is over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import leaseq
from support.polling import wait_for

pytestmark = pytest.mark.faults

Start = Callable[[str], subprocess.Popen[bytes]]


@pytest.fixture
def start_reaper(database_url: str, tmp_path: Path) -> Iterator[Start]:
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(holder: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"{holder}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "leaseq.cli", "reaper", "--operator-id", holder,
                 "--reap-interval-seconds", "0.2", "--leader-ttl-seconds", "2"],
                env={**os.environ, "LEASEQ_DATABASE_URL": database_url},
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        started.append((proc, log))
        return proc

    yield start
    for proc, log in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=10)
        print(f"----- {log.name} (exit {proc.returncode})\n{log.read_text()[-5000:]}")


def crashed_job(queue: leaseq.Queue, conn: leaseq.core.db.Conn) -> int:
    """A job whose worker died holding it: its lease has already expired. (Each in a queue
    of its own: a reaped job keeps its place, and must not be claimed again here.)"""
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    started = now - timedelta(minutes=1)
    name = f"q{now.timestamp()}"
    job = queue.enqueue(name, "t", now=started).job_id
    [claimed] = queue.claim([name], "dead-worker", lease_seconds=5, now=started)
    assert claimed.id == job
    return job


def leader(conn: leaseq.core.db.Conn) -> tuple[str, int] | None:
    row = conn.execute(
        "SELECT holder, term FROM leaseq.leader_leases WHERE name = 'reaper' AND expires_at > now()"
    ).fetchone()
    return (str(row[0]), int(row[1])) if row else None


def reaped_by(queue: leaseq.Queue, job: int) -> str:
    [attempt] = queue.attempts(job)
    assert attempt.outcome == "lease_expired"
    assert attempt.error is not None
    return attempt.error.rsplit("reaped by ", 1)[1].rstrip(")")


def test_reaper_processes_take_over_from_each_other(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, start_reaper: Start
) -> None:
    procs = {name: start_reaper(name) for name in ("r1", "r2")}
    first = crashed_job(queue, conn)
    wait_for(lambda: queue.get(first).status == "pending", "the first job to be reaped")
    holder, term = wait_for(lambda: leader(conn), "a leader")
    assert reaped_by(queue, first) == f"{holder} term {term}"

    # SIGTERM: the leader gives the lease up on its way out; the other takes it at once.
    procs[holder].send_signal(signal.SIGTERM)
    assert procs[holder].wait(timeout=30) == 0
    other = "r2" if holder == "r1" else "r1"
    second = crashed_job(queue, conn)
    wait_for(lambda: queue.get(second).status == "pending", "the second job to be reaped")
    assert reaped_by(queue, second).startswith(f"{other} term ")

    # SIGSTOP: a frozen leader is replaced after its TTL by a new copy (new term); woken up,
    # it cannot act in its old term.
    new_holder, new_term = wait_for(lambda: leader(conn), "the new leader")
    assert new_holder == other
    procs[other].send_signal(signal.SIGSTOP)
    start_reaper(holder)
    third = crashed_job(queue, conn)
    wait_for(lambda: queue.get(third).status == "pending", "the third job to be reaped", 30)
    assert reaped_by(queue, third).startswith(f"{holder} term ")
    assert int(reaped_by(queue, third).rsplit(" ", 1)[1]) > new_term
    procs[other].send_signal(signal.SIGCONT)
    fourth = crashed_job(queue, conn)
    wait_for(lambda: queue.get(fourth).status == "pending", "the fourth job to be reaped", 30)
    assert reaped_by(queue, fourth).startswith(f"{holder} term ")
