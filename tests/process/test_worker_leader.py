"""``leaseq worker`` alone is a complete system: with no operator and no ``leaseq reaper``,
the workers elect a leader among themselves (the leader lease), and it reaps. Real workers,
real SIGKILL."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

Spawn = Callable[..., WorkerProcess]
LEADING = {"LEASEQ_LEAD": "true"}
#: The worker's leader lease (15 s) plus a pass (5 s) plus the job's lease, with room: how
#: long a job of a SIGKILLed leader may take to come back.
BACK_WITHIN = 60.0


def holder(conn: leaseq.core.db.Conn) -> str | None:
    row = conn.execute(
        "SELECT holder FROM leaseq.leader_leases WHERE name = 'reaper' AND expires_at > now()"
    ).fetchone()
    return None if row is None else str(row[0])


def acquired(worker: WorkerProcess) -> int:
    return worker.log.read_text().count("reaper lease acquired")


def test_two_workers_elect_one_leader_which_brings_back_a_sigkilled_workers_job(
    spawn_worker: Spawn, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """No reaper anywhere. The first worker leads; it runs a job and is SIGKILLed; the other
    takes the lapsed lease over, reaps the job and runs it. One leader at any time."""
    a = spawn_worker("w-a", lease=1.0, env=LEADING)
    wait_for(lambda: holder(conn) == "w-a", "w-a to lead")
    assert "offering to lead" in a.log.read_text()
    job_id = queue.enqueue("q", "work", {"seconds_by_worker": {"w-a": 300}}).job_id
    wait_for(lambda: queue.get(job_id).lease_owner == "w-a", "w-a to run the job")
    b = spawn_worker("w-b", lease=1.0, env=LEADING)
    # b stands by while a's lease holds: both offer, one leads.
    assert "offering to lead" in b.log.read_text()
    assert (holder(conn), acquired(a), acquired(b)) == ("w-a", 1, 0)

    a.signal(signal.SIGKILL)
    a.wait_exit()
    job = wait_for(
        lambda: (j := queue.get(job_id)).status == "succeeded" and j,
        "the SIGKILLed worker's job to come back and finish on w-b",
        timeout=BACK_WITHIN,
    )
    assert [(x.worker, x.outcome) for x in queue.attempts(job_id)] == [
        ("w-a", "lease_expired"),
        ("w-b", "succeeded"),
    ]
    assert job.result == {"worker": "w-b", "attempt": 2}
    assert (holder(conn), acquired(b)) == ("w-b", 1)


def test_a_leading_worker_stopped_by_sigterm_releases_its_lease_without_a_warning(
    spawn_worker: Spawn, conn: leaseq.core.db.Conn
) -> None:
    """A clean SIGTERM is no fault: the leader gives its lease up (the next leader takes it
    at once, in a larger term) and logs nothing at WARNING, so an alert on WARNING stays
    quiet through a rollout."""
    a = spawn_worker("w-a", env=LEADING)
    wait_for(lambda: holder(conn) == "w-a", "w-a to lead")
    a.signal(signal.SIGTERM)
    assert a.wait_exit() == 0
    log = a.log.read_text()
    assert "reaper lease released" in log
    assert [line for line in log.splitlines() if " WARNING " in line] == []
    b = spawn_worker("w-b", env=LEADING)
    wait_for(lambda: holder(conn) == "w-b", "w-b to lead at once")
    row = conn.execute("SELECT term FROM leaseq.leader_leases WHERE name = 'reaper'").fetchone()
    assert row is not None and row[0] == 2
    b.signal(signal.SIGTERM)
    assert b.wait_exit() == 0


def test_a_worker_never_leads_where_an_operator_has_led(
    spawn_worker: Spawn, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """Issue 65: a worker started with the CLI default ``--lead true`` where an operator
    runs took the lease whenever it was free (an operator pod restarting released it), and
    no operator replica could lead and scale after that. An operator's released lease stays
    on record: the worker says once that it yields, runs its jobs, and never leads."""
    conn.execute(
        "INSERT INTO leaseq.leader_leases (name, holder, term, expires_at, holder_kind)"
        " VALUES ('reaper', 'leaseq-operator-0', 4, now() - interval '1 minute', 'operator')"
    )
    worker = spawn_worker("w-a", env=LEADING)
    said = "not leading: operator leaseq-operator-0 has led this database"
    wait_for(lambda: said in worker.log.read_text(), "the worker to say it yields")
    job_id = queue.enqueue("q", "work", {}).job_id
    wait_for(lambda: queue.get(job_id).status == "succeeded", "the job to run")
    assert holder(conn) is None
    row = conn.execute("SELECT holder, term, holder_kind FROM leaseq.leader_leases").fetchall()
    assert row == [("leaseq-operator-0", 4, "operator")]
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit() == 0
    log = worker.log.read_text()
    assert acquired(worker) == 0
    assert log.count("not leading:") == 1, log
