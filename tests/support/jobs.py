"""Jobs seen from outside a worker: wait for one to finish, take one over."""

from __future__ import annotations

from datetime import timedelta

import leaseq
from support.dbtime import db_now
from support.polling import wait_for


def finished(queue: leaseq.Queue, job_id: int) -> leaseq.JobRecord:
    """Wait until the job has succeeded or is dead; its record."""
    return wait_for(
        lambda: (j := queue.get(job_id)).status in ("succeeded", "dead") and j,
        f"job {job_id} to finish",
    )


def take_over(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, job_id: int, owner: str = "thief"
) -> leaseq.ClaimedJob:
    """What happens to a worker that stalls: the running job's lease expires, the reaper
    returns it, ``owner`` claims it (a new token). The worker's token is stale from then on."""
    conn.execute(
        "UPDATE leaseq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        (job_id,),
    )
    assert [r.job_id for r in queue.reap()] == [job_id]
    (job,) = queue.claim(["q"], owner, now=db_now(conn) + timedelta(minutes=5))
    assert job.id == job_id
    return job
