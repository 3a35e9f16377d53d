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
import pytest

import leaseq
from bench.explain import function_plans
from leaseq.core._store import statements
from support.plans import generic, scans, writes

BACKLOG = 5000

#: A claim's parameters as a worker sends them (one job, every type).
CLAIM = {
    "queues": ["q"],
    "job_types": None,
    "owner": "probe",
    "limit": 1,
    "lease_seconds": 30.0,
    "claim_id": None,
    "claim_secret": b"s" * 32,
    "now": None,
}


@pytest.mark.parametrize(
    "claim", ["job_claim_keyed", "job_claim_keyed_slots", "job_claim_keyed_open"]
)
def test_the_keyed_claim_reads_one_row_of_a_backlogged_key(database_url: str, claim: str) -> None:
    queue = leaseq.Queue(leaseq.connect(database_url, action="test"))
    # 5,000 one-job keys, then statistics: one job per key is what the planner believes.
    queue.enqueue_many([leaseq.JobSpec("small", "t", key=f"k{n}") for n in range(5000)])
    c = psycopg.connect(database_url, autocommit=True)
    c.execute("ANALYZE leaseq.jobs")
    queue.enqueue_many([leaseq.JobSpec("q", "t", key="hot") for _ in range(BACKLOG)])
    c.execute("ANALYZE leaseq.jobs")
    # As a worker's session plans it: a generic plan, kept for every call.
    c.execute("SET plan_cache_mode = force_generic_plan")
    with c.transaction(force_rollback=True):
        [plan] = function_plans(c, statements.load()[claim].query, CLAIM, analyze=True)
    on_jobs = [s for s in scans(plan) if s.get("Index Name", "").startswith("jobs_key")]
    assert [s["Index Name"] for s in on_jobs] == ["jobs_key_claim_idx"], on_jobs
    assert on_jobs[0]["Actual Rows"] == 1, on_jobs  # the key's head, not its backlog


def test_a_keys_running_jobs_are_counted_from_its_own_index(database_url: str) -> None:
    """flow_status and the console count an unlimited key's running jobs in
    jobs_key_held_idx. Asked for status = 'running' alone, they also fit jobs_running_idx
    (queue, job_type), which statistics taken before any job ran show empty, and a plan on
    it reads every running job of the queue once per key."""
    queue = leaseq.Queue(leaseq.connect(database_url, action="test"))
    queue.enqueue_many([leaseq.JobSpec("small", "t", key=f"k{n}") for n in range(1000)])
    c = psycopg.connect(database_url, autocommit=True)
    c.execute("ANALYZE leaseq.jobs")
    # Key "u": 2 plain jobs and an aggregate of 3 (its head runs, 2 wait their turn).
    queue.enqueue_many([leaseq.JobSpec("q", "t", key="u") for _ in range(2)])
    queue.enqueue_many([leaseq.JobSpec("q", "t", key="u", ordering_key="o") for _ in range(3)])
    assert len(queue.claim(["q"], "w", limit=10)) == 3
    (status,) = leaseq.FlowControl(leaseq.connect(database_url, action="test")).status(["q"])
    assert (status.running, status.ready) == (3, 0)
    values = {
        "queue": ("q", "text"),
        "after_queue": ("", "text"),
        "after_key": ("", "text"),
        "limit": (10, "int"),
        # Room for one job past the 3 running: counted running first, it is not one of them.
        "cap": (3, "int"),
        "now": (None, "timestamptz"),
        "queues": (["q"], "text[]"),
        "live_seconds": (60.0, "float8"),
    }
    c.execute("SET plan_cache_mode = force_generic_plan")
    cur = psycopg.ClientCursor(c)
    for name in ("flow_status", "console_flow_keys"):
        query, names = generic(statements.load()[name].query)
        c.execute(f"PREPARE {name} AS {query}")
        execute = f"EXECUTE {name}({', '.join(f'%s::{values[n][1]}' for n in names)})"
        args = [values[n][0] for n in names]
        row = cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {execute}", args).fetchone()
        assert row is not None
        indexes = {s.get("Index Name") for s in scans(row[0][0]["Plan"])}
        assert "jobs_key_held_idx" in indexes, (name, indexes)
        assert "jobs_running_idx" not in indexes, (name, indexes)
        cur.execute(execute, args)
        assert cur.description is not None
        column = [d.name for d in cur.description].index("running")
        assert [r[column] for r in cur.fetchall()] == [3], name


@pytest.mark.parametrize(
    ("claim", "rate", "table"),
    [
        ("job_claim_keyed", None, "flow_slots"),
        ("job_claim_keyed_slots", None, "flow_slots"),
        ("job_claim_keyed", 100.0, "flow_slots"),
        ("job_claim_keyed", 100.0, "flow_buckets"),
    ],
)
def test_a_limited_keys_claim_takes_its_unit_by_index(
    database_url: str, claim: str, rate: float | None, table: str
) -> None:
    """The claim writes the units (and buckets) it locked by their ids. By (queue, key,
    slot), three arrays, PostgreSQL 15's generic plan costed an index scan as one descent
    per combination of their elements and read the whole of leaseq.flow_slots at every
    claim instead (4,000 rows at 1,000 limited keys; PostgreSQL 18 used the index). It fails
    with those statements on PostgreSQL 15, which CI's second integration run uses."""
    conn = leaseq.connect(database_url, action="test")
    leaseq.FlowControl(conn).set_limit("q", "k*", max_running=4, per_second=rate, burst=rate)
    leaseq.Queue(conn).enqueue_many([leaseq.JobSpec("q", "t", key=f"k{n}") for n in range(1000)])
    c = psycopg.connect(database_url, autocommit=True)
    c.execute("ANALYZE leaseq.jobs, leaseq.flow_keys, leaseq.flow_slots, leaseq.flow_buckets")
    assert c.execute(f"SELECT count(*) FROM leaseq.{table}").fetchone() == (
        1000 if table == "flow_buckets" else 4000,
    )
    c.execute("SET plan_cache_mode = force_generic_plan")
    with c.transaction(force_rollback=True):
        [plan] = function_plans(c, statements.load()[claim].query, CLAIM, analyze=True)
    assert any(n.get("Relation Name") == "jobs" for n in writes(plan)), "nothing claimed"
    on_table = [s for s in scans(plan) if s.get("Relation Name") == table]
    assert on_table, f"the claim read no row of {table}"
    assert all(s["Node Type"] != "Seq Scan" for s in on_table), on_table
    assert all(s["Actual Rows"] <= 1 for s in on_table), on_table
