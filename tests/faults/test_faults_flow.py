"""Per-key limits with real worker processes: SIGKILL of a worker holding units of a limit,
the reaper giving them back, a stale (SIGSTOPped) worker calling in after its jobs were
reaped; the most jobs of a key ever running at once, from the attempt history, stays within
its limit, and no unit leaks."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from conftest import ReaperThread

import leaseq
from support.flowcheck import intervals, max_running
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.faults


def test_sigkill_and_stale_workers_keep_key_limits(
    database_url: str,
    conn: leaseq.core.db.Conn,
    spawn_on: Callable[..., WorkerProcess],
    reaper_on: Callable[[str, float], ReaperThread],
) -> None:
    flow = leaseq.FlowControl(conn)
    flow.set_limit("q", "hot", max_running=3)
    flow.set_limit("q", "one", max_running=1)
    queue = leaseq.Queue(conn)
    ids = [
        queue.enqueue("q", "step", {"seconds": 0.4}, key=key, max_attempts=20).job_id
        for _ in range(12)
        for key in ("hot", "one", "hot")
    ]

    def spawn(name: str) -> WorkerProcess:
        return spawn_on(database_url, name, concurrency=4, lease=2.0, heartbeat=0.3)

    # a starts alone: with b racing it, b can take every unit the limits allow, and a may
    # never hold two at once before the jobs run out.
    workers = {"a": spawn("a")}
    reaper = reaper_on(database_url, 0.2)

    def running(worker: str) -> int:
        row = conn.execute(
            "SELECT count(*) FROM leaseq.jobs WHERE status = 'running' AND lease_owner = %s",
            (worker,),
        ).fetchone()
        return int(row[0]) if row else 0  # type: ignore[call-overload]

    # SIGKILL a worker while it holds units; its jobs come back through the reaper.
    wait_for(lambda: running("a") >= 2, "worker a to hold units")
    workers["b"] = spawn("b")
    workers["a"].proc.kill()
    workers["a"].proc.wait(timeout=10)
    workers["c"] = spawn("c")
    # SIGSTOP another: its leases expire, others run its jobs, then it wakes and calls in.
    wait_for(lambda: running("b") >= 1, "worker b to hold units")
    workers["b"].proc.send_signal(signal.SIGSTOP)
    wait_for(lambda: running("b") == 0, "worker b's jobs to be reaped", timeout=30)
    # When b's leases were reaped: b's calls will rewrite those attempts as `fenced`.
    reaped_at = {
        (int(job), int(token)): at  # type: ignore[call-overload]
        for job, token, at in conn.execute(
            "SELECT job_id, lease_token, ended_at FROM leaseq.job_attempts"
            " WHERE worker = 'b' AND outcome = 'lease_expired'"
        ).fetchall()
    }
    # Before b wakes, another worker has taken each of its jobs (a newer token).
    wait_for(
        lambda: all(queue.get(job).lease_token > token for job, token in reaped_at),
        "b's reaped jobs claimed again by the others",
        60,
    )
    workers["b"].proc.send_signal(signal.SIGCONT)
    wait_for(
        lambda: all(queue.get(i).status == "succeeded" for i in ids), "every job to succeed", 120
    )
    reaper.stop()
    with psycopg.connect(database_url, autocommit=True) as c:
        spans = intervals(c, "q", reaped_at)  # type: ignore[arg-type]
        seen = {key: max_running(spans[key]) for key in ("hot", "one")}
        outcomes = dict(
            c.execute(
                "SELECT outcome::text, count(*) FROM leaseq.job_attempts GROUP BY 1"
            ).fetchall()
        )
        held = c.execute(
            "SELECT count(*) FROM leaseq.flow_slots WHERE job_id IS NOT NULL"
        ).fetchone()
    print(f"most running at once: {seen}; attempts by outcome: {outcomes}")
    assert seen["hot"] <= 3
    assert seen["one"] <= 1
    assert outcomes.get("lease_expired", 0) + outcomes.get("fenced", 0) >= 1, "leases were reaped"
    assert held == (0,)
    assert flow.repair() == {}


def test_a_handler_told_to_back_off_pauses_its_key_without_spending_an_attempt(
    database_url: str,
    conn: leaseq.core.db.Conn,
    spawn_on: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    queue = leaseq.Queue(conn)
    first = queue.enqueue(
        "q", "throttled", {"dir": str(tmp_path), "retry_after": 2.0}, key="api", max_attempts=1
    ).job_id
    spawn_on(database_url, "w", concurrency=2)
    wait_for(lambda: (tmp_path / f"{first}.429").exists(), "the first call to be told 429")
    # The handler has been told 429, but its release (and the pause with it) may not have
    # committed yet; a claim that starts before that commit rightly sees no pause.
    wait_for(
        lambda: (
            conn.execute(
                "SELECT paused_until > now() FROM leaseq.flow_keys"
                " WHERE queue = 'q' AND key = 'api'"
            ).fetchone()
            == (True,)
        ),
        "the key to be paused",
    )
    # Enqueued while the key is paused (its call would succeed): it waits for the pause too.
    second = queue.enqueue("q", "throttled", {"dir": str(tmp_path)}, key="api", delay=3600).job_id
    (tmp_path / f"{second}.429").write_text("")
    conn.execute("UPDATE leaseq.jobs SET available_at = now() WHERE id = %s", (second,))
    wait_for(lambda: queue.get(first).status == "succeeded", "the job to run after the pause")
    job = queue.get(first)
    outcomes = [a.outcome for a in queue.attempts(first)]
    assert job.attempt_count == 1, "backing off spent no attempt (max_attempts=1 survived)"
    assert outcomes == ["released", "succeeded"]
    paused, ran = conn.execute(
        "SELECT a.ended_at, b.started_at FROM leaseq.job_attempts a, leaseq.job_attempts b"
        " WHERE a.job_id = %s AND a.outcome = 'released' AND b.job_id = %s"
        " AND b.outcome = 'succeeded'",
        (first, first),
    ).fetchone()  # type: ignore[misc]
    assert (ran - paused).total_seconds() >= 2.0, "not claimed again before Retry-After"
    wait_for(lambda: queue.get(second).status == "succeeded", "the other job of the key")
    second_started = conn.execute(
        "SELECT min(started_at) FROM leaseq.job_attempts WHERE job_id = %s", (second,)
    ).fetchone()
    assert second_started is not None
    assert (second_started[0] - paused).total_seconds() >= 2.0, "the key was paused"  # type: ignore[operator]
