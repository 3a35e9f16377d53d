"""Churn leaves dead entries at the head of the claim index; Queue.vacuum clears them."""

from __future__ import annotations

import leaseq
from leaseq.core._store import statements


def claim_buffers(conn: leaseq.core.db.Conn) -> int:
    """Shared buffers one claim touches (rolled back, so the backlog stays as it is)."""
    query = b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statements.load()["job_claim"].query
    params = {
        "queues": ["q"],
        "owner": "probe",
        "limit": 1,
        "lease_seconds": 30,
        "claim_id": None,
        "job_types": None,
        "now": None,
    }
    with conn.transaction(force_rollback=True):
        row = conn.execute(query, params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def test_vacuum_keeps_the_claim_cheap_under_churn(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    queue.enqueue_many([leaseq.JobSpec("q", "t") for _ in range(100)])
    conn.execute("VACUUM leaseq.jobs")
    fresh = claim_buffers(conn)
    # 20,000 jobs through their life ahead of the backlog, in bulk for speed: each leaves a
    # dead entry in the claim index, exactly as claim + complete do one by one.
    conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type, available_at)"
        " SELECT 'q', 't', now() - interval '1 hour' FROM generate_series(1, 20000)"
    )
    conn.execute(
        "UPDATE leaseq.jobs SET status = 'succeeded', finished_at = now(), lease_owner = 'w'"
        " WHERE available_at < now() - interval '30 minutes'"
    )
    churned = claim_buffers(conn)
    assert churned > 2 * fresh  # the dead head this test is about (it can be measured)
    conn.execute("SELECT pg_stat_force_next_flush()")
    assert queue.vacuum(min_dead_tuples=10**9) is None  # below the threshold: nothing done
    dead = queue.vacuum(min_dead_tuples=1000)
    assert dead is not None
    assert dead >= 20000
    assert claim_buffers(conn) <= fresh + 2
