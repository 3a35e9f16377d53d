"""A signal sent while the worker that would resume its job is SIGKILLed: a second worker
resumes the job, which completes once, its effect after the wait written once. Real workers,
real SIGKILL, a real PostgreSQL; the moments are made exact with a row lock and files, never
sleeps."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.faults


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def lock_waiters(conn: leaseq.core.db.Conn, pid: int) -> bool:
    """True when backend ``pid`` waits for a lock (the signal, for the job's row)."""
    row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
    found = row.fetchone()
    return found is not None and found[0] == "Lock"


@pytest.mark.parametrize("moment", ["while_signalled", "while_resuming"])
def test_a_signal_sent_while_the_resuming_worker_is_killed_resumes_the_job_once(
    database_url: str,
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
    spawn_on: Callable[..., WorkerProcess],
    reaper_on: Callable[..., object],
    tmp_path: Path,
    moment: str,
) -> None:
    """while_signalled: the signal's commit waits on the job's row while its only worker is
    SIGKILLed; while_resuming: the worker claims the signalled job, resumes and writes the
    effect, then is SIGKILLed before it completes (its lease expires and is reaped)."""
    victim = spawn_on(database_url, "w-a", concurrency=1, lease=2.0, heartbeat=0.5)
    job_id = queue.enqueue("q", "approval", {"dir": str(tmp_path), "hang_in": "w-a"}).job_id
    wait_for(lambda: queue.get(job_id).waiting_for == "approve", "the job to wait", timeout=60)

    if moment == "while_signalled":
        with (
            psycopg.connect(database_url) as locker,
            leaseq.connect(database_url, action="test") as sender,
        ):
            locker.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", [job_id])
            sent: list[leaseq.Signalled] = []
            thread = threading.Thread(
                target=lambda: sent.append(leaseq.Queue(sender).signal(job_id, "approve", "ok"))
            )
            thread.start()
            pid = sender.info.backend_pid
            wait_for(lambda: lock_waiters(conn, pid), "the signal to wait on the row")
            victim.signal(signal.SIGKILL)
            assert victim.wait_exit() == -signal.SIGKILL
            locker.rollback()
            thread.join(30)
        assert sent and sent[0].waiting
    else:
        assert queue.signal(job_id, "approve", "ok").waiting
        wait_for(lambda: lines(tmp_path / "act.calls"), "w-a to resume and act", timeout=60)
        victim.signal(signal.SIGKILL)
        assert victim.wait_exit() == -signal.SIGKILL
        reaper_on(database_url, 0.3)

    spawn_on(database_url, "w-b", concurrency=1, lease=2.0, heartbeat=0.5)
    done = wait_for(
        lambda: (j := queue.get(job_id)).status == "succeeded" and j, "w-b to finish", timeout=60
    )
    assert done.result == {"decision": "ok", "by": "w-b"}
    outcomes = [a.outcome for a in queue.attempts(job_id)]
    assert "failed" not in outcomes and outcomes[0] == "released" and outcomes[-1] == "succeeded"
    key = f"job:{job_id}:step:act"
    if moment == "while_signalled":
        assert outcomes == ["released", "succeeded"]
        assert lines(tmp_path / "resumed") == ["w-b"]
        assert lines(tmp_path / "act.calls") == [f"w-b {key}"]
    else:
        assert outcomes == ["released", "lease_expired", "succeeded"]
        assert lines(tmp_path / "resumed") == ["w-a", "w-b"]
        # The effect after the wait: written once, by the killed worker; w-b got its record.
        assert lines(tmp_path / "act.calls") == [f"w-a {key}"]
