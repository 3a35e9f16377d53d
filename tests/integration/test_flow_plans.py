"""The keyed claim reads a key's jobs in claim order, whatever the planner believes.

With many keys of a few jobs each, the planner estimates one pending row per key, from the
number of distinct keys, and no statistics refresh changes that. While an index held every
unfinished job of a key (migration 15's jobs_key_unfinished_idx), reading it and sorting its
"one row" looked cheaper than walking jobs_key_claim_idx in claim order, and a worker's
session kept that generic plan: once one key had a backlog, each claim read and sorted all
of it (20,000 rows, 507 buffers and 22 ms per claim). Migration 23 keeps keyed jobs in two
disjoint indexes, so the claim can be planned on the claim index only.
"""

from __future__ import annotations

import psycopg

import leaseq
from leaseq.core._store import statements
from support.plans import generic, scans

BACKLOG = 5000


def test_the_keyed_claim_reads_one_row_of_a_backlogged_key(database_url: str) -> None:
    queue = leaseq.Queue(leaseq.connect(database_url, action="test"))
    # 5,000 one-job keys, then statistics: one job per key is what the planner believes.
    queue.enqueue_many([leaseq.JobSpec("small", "t", key=f"k{n}") for n in range(5000)])
    c = psycopg.connect(database_url, autocommit=True)
    c.execute("ANALYZE leaseq.jobs")
    queue.enqueue_many([leaseq.JobSpec("q", "t", key="hot") for _ in range(BACKLOG)])
    c.execute("ANALYZE leaseq.jobs")
    # As a worker's session prepares it: a generic plan, kept for every call.
    query, names = generic(statements.load()["job_claim_keyed"].query)
    c.execute("SET plan_cache_mode = force_generic_plan")
    c.execute(f"PREPARE claim AS {query}")
    values = {
        "queues": (["q"], "text[]"),
        "job_types": (None, "text[]"),
        "owner": ("probe", "text"),
        "limit": (1, "int"),
        "lease_seconds": (30.0, "float8"),
        "claim_id": (None, "uuid"),
        "now": (None, "timestamptz"),
    }
    args = ", ".join(f"%s::{values[name][1]}" for name in names)
    with c.transaction(force_rollback=True):
        # Bound on this side: a utility statement's parameters get no types from the server.
        row = (
            psycopg.ClientCursor(c)
            .execute(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim({args})",
                [values[name][0] for name in names],
            )
            .fetchone()
        )
    assert row is not None
    plan = row[0][0]["Plan"]
    on_jobs = [s for s in scans(plan) if s.get("Index Name", "").startswith("jobs_key")]
    assert [s["Index Name"] for s in on_jobs] == ["jobs_key_claim_idx"], on_jobs
    assert on_jobs[0]["Actual Rows"] == 1, on_jobs  # the key's head, not its backlog
