"""Churn leaves dead entries at the head of the claim index, and keys that go idle at the head
of the keyed claim's turn order; Queue.vacuum clears both."""

from __future__ import annotations

import leaseq
from leaseq.core._store import statements


def claim_buffers(conn: leaseq.core.db.Conn, statement: str = "job_claim") -> int:
    """Shared buffers one claim touches (rolled back, so the backlog stays as it is)."""
    query = b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statements.load()[statement].query
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


def test_vacuum_keeps_the_keyed_claim_cheap_when_keys_go_idle(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    queue.enqueue_many([leaseq.JobSpec("q", "t", key="z-live") for _ in range(10)])
    conn.execute("VACUUM leaseq.flow_keys")
    fresh = claim_buffers(conn, "job_claim_keyed")
    # 20,000 keys that had work and went idle, ahead of the live key in turn order (the same
    # virtual time; their names sort first): in bulk, as releases of their last jobs do one
    # by one. Each leaves a dead entry in the turn index.
    conn.execute(
        "INSERT INTO leaseq.flow_keys (queue, key, vtime, active)"
        " SELECT 'q', 'a' || g, 0, true FROM generate_series(1, 20000) g"
    )
    conn.execute("UPDATE leaseq.flow_keys SET active = false WHERE key LIKE 'a%'")
    churned = claim_buffers(conn, "job_claim_keyed")
    assert churned > 2 * fresh  # the dead head this test is about (it can be measured)
    conn.execute("SELECT pg_stat_force_next_flush()")
    dead = queue.vacuum(min_dead_tuples=1000)
    assert dead is not None
    assert dead >= 20000
    assert claim_buffers(conn, "job_claim_keyed") <= fresh + 2
