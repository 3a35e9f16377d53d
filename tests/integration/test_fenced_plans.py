"""Every fenced statement finds its rows by primary key, whatever the statistics say.

Right after a backlog is enqueued and analyzed, the statistics say no job is running. Once
the jobs run, a fenced statement whose predicate implies the partial index
``jobs_running_idx`` (``WHERE status = 'running'``) may be planned as a scan of that index,
which the planner believes empty and which holds every running job: measured at 10,000
running jobs (with the reaper's index of the time, keyed by lease_expires_at), 365 buffers
and 1.1 ms per heartbeat instead of 12 buffers and 0.05 ms. The worker's sessions plan
generically (``plan_cache_mode = force_generic_plan``), so this is the plan every call would
reuse. These plans are read as that session's are: prepared, and explained under
``plan_cache_mode = force_generic_plan`` (every parameter NULL: a generic plan does not look
at them).

A small table is the other trap: at 1,000 jobs, statistics fresh, a statement that joins the
jobs to its arguments' rows (a batch given as arrays) was planned as a hash join over a scan
of the whole table, every call: about 1,000,000 server instructions per completion of one
job (PostgreSQL 18.6, counted with an instruction-counting profiler), where the primary key
reads one row.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.core._store import statements
from support.plans import generic, scans

FENCED = [
    "job_heartbeat",
    "job_heartbeat_many",
    "job_checkpoint",
    "job_complete",
    "job_fail",
    "job_release",
    "job_back_off",
    "job_sleep",
    "job_wait_lock",
    "job_wait",
    "signal_read",
    "step_intend",
    "step_record",
    "step_withdraw",
    "stream_emit",
]


@pytest.fixture(params=["stale", "small"])
def misled(database_url: str, request: pytest.FixtureRequest) -> psycopg.Connection[Any]:
    """Running jobs whose statistics mislead: 10,000, with statistics taken while they were
    all pending ("stale"), or 1,000, with statistics taken while they run ("small")."""
    jobs = 10_000 if request.param == "stale" else 1_000
    queue = leaseq.Queue(leaseq.connect(database_url, action="test"))
    queue.enqueue_many([leaseq.JobSpec("q", "t") for _ in range(jobs)])
    c = psycopg.connect(database_url, autocommit=True)
    if request.param == "stale":
        c.execute("ANALYZE leaseq.jobs")
    # As the claims would leave them, in one statement (the claim is not what is tested).
    c.execute(
        "UPDATE leaseq.jobs SET status = 'running', attempt_count = 1, lease_token = 1,"
        " lease_owner = 'w1', started_at = now(), heartbeat_at = now(),"
        " lease_expires_at = now() + interval '1 hour'"
    )
    if request.param == "small":
        c.execute("VACUUM ANALYZE leaseq.jobs")
    c.execute("SET plan_cache_mode = force_generic_plan")
    return c


@pytest.mark.parametrize("name", FENCED)
def test_a_fenced_statement_uses_the_primary_key_whatever_the_statistics(
    misled: psycopg.Connection[Any], name: str
) -> None:
    query, names = generic(statements.load()[name].query)
    misled.execute(f"PREPARE fenced AS {query}")
    nulls = ", ".join(["NULL"] * len(names))
    (plan,) = misled.execute(f"EXPLAIN (FORMAT JSON) EXECUTE fenced({nulls})").fetchone()  # type: ignore[misc]
    found = [
        (s["Node Type"], s.get("Index Name") or s.get("Relation Name", ""))
        for s in scans(plan[0]["Plan"])
    ]
    on_jobs = [s for s in found if s[1].startswith("jobs")]
    assert on_jobs, json.dumps(plan, indent=1)
    assert all(index == "jobs_pkey" for _, index in on_jobs), on_jobs
