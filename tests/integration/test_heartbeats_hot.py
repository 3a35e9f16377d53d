"""Renewing a lease writes no index entry (migration 21).

A heartbeat sets heartbeat_at, lease_expires_at and progress; a checkpoint sets checkpoint.
When no index of leaseq.jobs names one of them (as a key, an included column, in an
expression or in a predicate), PostgreSQL can update the row in place on its page (a
heap-only tuple), and the renewal writes nothing into any index.
"""

from __future__ import annotations

import re

import psycopg

import leaseq
from support.polling import wait_for

# What job_heartbeat, job_heartbeat_many and job_checkpoint set (sql/leaseq_sql/queries/jobs.sql).
RENEWED = {"heartbeat_at", "lease_expires_at", "progress", "checkpoint"}


def test_no_index_of_jobs_names_a_column_a_renewal_sets(conn: leaseq.core.db.Conn) -> None:
    """Keys and included columns by attribute number; expressions and predicates by name."""
    rows = conn.execute(
        "SELECT c.relname,"
        " array(SELECT a.attname FROM unnest(i.indkey::int2[]) k(n)"
        "  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n)::text[],"
        " coalesce(pg_get_expr(i.indexprs, i.indrelid), ''),"
        " coalesce(pg_get_expr(i.indpred, i.indrelid), '')"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = 'leaseq.jobs'::regclass"
    ).fetchall()
    assert len(rows) > 10  # every index of the table was read
    offending = {
        name: sorted(set(columns) & RENEWED) + re.findall(rf"\b({'|'.join(RENEWED)})\b", text)
        for name, columns, exprs, pred in rows
        for text in [f"{exprs} {pred}"]
    }
    assert {name: found for name, found in offending.items() if found} == {}


def _updates(url: str) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relid = 'leaseq.jobs'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_renewals_are_heap_only_updates(database_url: str) -> None:
    """Heartbeats of 4 running jobs, one at a time and all in one statement, and a
    checkpoint: every one of their row updates is counted as heap-only by the server. (Few
    jobs, so that their page has room for every new row version: a full page makes an
    update leave it whatever the indexes.)"""
    with leaseq.connect(database_url, action="test") as conn:
        queue = leaseq.Queue(conn)
        queue.enqueue_many([leaseq.JobSpec("q", "t") for _ in range(4)])
        leases = [job.lease for job in queue.claim(["q"], "w", limit=4)]
        assert len(leases) == 4
        # This session's counts reach the shared statistics once it is idle, however soon.
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.commit()
        # The claim's updates are counted first.
        before = wait_for(
            lambda: (u := _updates(database_url))[0] >= 4 and u, "the claim's updates counted"
        )

        for lease in leases[:2]:
            assert (
                queue.heartbeat(lease, progress={"page": 1}).status
                is leaseq.HeartbeatStatus.RENEWED
            )
        assert len(queue.heartbeat_many(leases)) == 4
        assert queue.checkpoint(leases[0], {"page": 2})
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.commit()

        renewals = 2 + 4 + 1
        after = wait_for(
            lambda: (u := _updates(database_url))[0] >= before[0] + renewals and u,
            "the renewals counted",
        )
    assert after[0] - before[0] == renewals
    assert after[1] - before[1] == renewals
