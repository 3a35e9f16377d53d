"""Real worker processes SIGKILLed as the OOM killer kills them: the one with an id of its own
has its job ended at once by the end the kubelet reports; one with an id given on its command
line (which a restarted container would use again) keeps its lease."""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

import leaseq
from leaseq.leader.reaper import LeaderLease, Reaper
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

NODE = "node-1"
LEASE = 300.0  # far longer than the test: only the reclaim can end these leases


def _boot_at(conn: leaseq.core.db.Conn, worker: str) -> datetime | None:
    row = conn.execute(
        "SELECT boot_at FROM leaseq.workers WHERE worker_id = %s", [worker]
    ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_a_killed_worker_with_its_own_id_is_reclaimed_and_a_named_one_waits(
    conn: leaseq.core.db.Conn, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    queue = leaseq.Queue(conn)
    ids = [queue.enqueue("q", "work", {"seconds": 3600}).job_id for _ in range(2)]
    own = spawn_worker(
        "own", lease=LEASE, heartbeat=1.0, own_id=True,
        env={"LEASEQ_POD_NAME": "workers-a", "LEASEQ_NODE_NAME": NODE},
    )  # fmt: skip
    named = spawn_worker(
        "named", lease=LEASE, heartbeat=1.0,
        env={"LEASEQ_POD_NAME": "workers-b", "LEASEQ_NODE_NAME": NODE},
    )  # fmt: skip
    assert own.worker_id != "own"  # made by the worker: <hostname>-<pid>-<random>
    wait_for(
        lambda: {queue.get(i).lease_owner for i in ids} == {own.worker_id, "named"},
        what="each worker running a job",
    )
    boot_at = _boot_at(conn, own.worker_id)
    assert boot_at is not None
    assert _boot_at(conn, "named") is None  # an id given: never known to have ended
    # The kubelet dates the end in whole seconds; this one comes after the worker started.
    wait_for(lambda: datetime.now(UTC).replace(microsecond=0) > boot_at, what="a second later")
    for worker in (own, named):
        worker.signal(signal.SIGKILL)
        assert worker.wait_exit() == -signal.SIGKILL
    finished = datetime.now(UTC).replace(microsecond=0)

    reaper = Reaper(
        LeaderLease(leaseq.Leadership(conn), "op-1", ttl=15),
        queue,
        leaseq.Workers(conn),
        interval=60,
    )
    reaper.run_once()
    reaped = reaper.reclaim("workers-a", NODE, finished)
    assert reaped is not None
    assert [r.previous_owner for r in reaped] == [own.worker_id]
    assert queue.get(reaped[0].job_id).status == "pending"
    assert reaper.reclaim("workers-b", NODE, finished) == ()
    [held] = [i for i in ids if i != reaped[0].job_id]
    assert (queue.get(held).status, queue.get(held).lease_owner) == ("running", "named")
