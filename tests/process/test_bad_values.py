"""A real worker process next to rows holding times Python cannot hold (support.badrows):
it claims, heartbeats and settles its jobs, among them one due at -infinity and one whose
max runtime is 100 million years, and the other rows of its queue stay as they were."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import leaseq
from support.badrows import BAD, plant
from support.jobs import finished
from support.workers import WorkerProcess

pytestmark = pytest.mark.process


def test_a_worker_runs_its_jobs_among_bad_rows(
    conn: leaseq.core.db.Conn, queue: leaseq.Queue, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    planted = plant(conn)
    early = queue.enqueue(BAD, "work", {"seconds": 0}).job_id
    endless = queue.enqueue(BAD, "work", {"seconds": 1.0}, timeout=60).job_id
    ordinary = queue.enqueue(BAD, "work", {"seconds": 0.5}).job_id
    conn.execute("UPDATE leaseq.jobs SET available_at = '-infinity' WHERE id = %s", (early,))
    conn.execute(
        "UPDATE leaseq.jobs SET timeout = interval '100000000 years', created_at = '-infinity'"
        " WHERE id = %s",
        (endless,),
    )
    worker = spawn_worker("w-among-bad", queue=BAD, concurrency=3, heartbeat=0.3, lease=1.0)
    for job_id in (early, endless, ordinary):
        assert finished(queue, job_id).status == "succeeded", worker.log.read_text()
    # The worker's heartbeats (every 0.3 s over a 1 s job) and settles left the rest alone.
    assert queue.get(planted.pending["infinity"]).status == "pending"
    assert queue.get(planted.dead).status == "dead"
    assert worker.proc.poll() is None
