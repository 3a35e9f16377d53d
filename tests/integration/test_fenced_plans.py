"""Every fenced statement finds its rows by primary key, whatever the statistics say.

Right after a backlog is enqueued and analyzed, the statistics say no job is running. Once
the jobs run, a fenced statement whose predicate implies the partial index
``jobs_running_idx`` (``WHERE status = 'running'``) may be planned as a scan of that index,
which the planner believes empty and which holds every running job: measured at 10,000
running jobs (with the reaper's index of the time, keyed by lease_expires_at), 365 buffers
and 1.1 ms per heartbeat instead of 12 buffers and 0.05 ms. The worker's sessions plan
generically (``plan_cache_mode = force_generic_plan``), so this is the plan every call would
reuse. Each fenced statement calls a function of the worker's door
(sql/leaseq_sql/definitions/lease.sql), whose statements PL/pgSQL prepares and caches as
that session would: their plans are read from auto_explain (``log_nested_statements``) while
the statement runs once under ``plan_cache_mode = force_generic_plan``, for a lease it holds.

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
from psycopg.types.json import Jsonb

import leaseq
from bench.explain import function_plans
from leaseq.core._store import statements
from support.plans import scans

FENCED = [
    "job_heartbeat_many",
    "job_checkpoint",
    "job_complete",
    "job_fail",
    "job_release",
    "job_back_off",
    "job_sleep",
    "job_wait",
    "signal_read",
    "step_intend",
    "step_record",
    "step_withdraw",
    "stream_emit",
]


#: The secret of the misled jobs' lease (their digest is set to match it).
SECRET = b"s" * 32


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
        " lease_expires_at = now() + interval '1 hour', lease_digest = sha256(%s)",
        [SECRET],
    )
    if request.param == "small":
        c.execute("VACUUM ANALYZE leaseq.jobs")
    c.execute("SET plan_cache_mode = force_generic_plan")
    return c


def held_params(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Every parameter a fenced statement takes, for the lease of the first misled job."""
    row = conn.execute("SELECT min(id), now() FROM leaseq.jobs").fetchone()
    assert row is not None
    job, now = row
    return {
        "id": job, "owner": "w1", "token": 1, "secret": SECRET, "now": None, "attempt": 1,
        "started_at": now, "lease_seconds": 30.0, "progress": None, "checkpoint": None,
        "ids": [job], "owners": ["w1"], "tokens": [1], "secrets": [SECRET],
        "progresses": [None], "results": [None], "effect_keys": [None], "notes": [None],
        "error": "e", "error_code": None, "traceback": None, "retryable": True,
        "outcome": "failed", "backoff_base": 1.0, "backoff_cap": 2.0, "reason": "r",
        "shutdown": True, "until": now, "seconds": 1.0, "name": "n", "seen_token": None,
        "result": None, "note": None, "value": Jsonb(1), "cap": 10, "call": "heartbeat",
    }  # fmt: skip


@pytest.mark.parametrize("name", FENCED)
def test_a_fenced_statement_uses_the_primary_key_whatever_the_statistics(
    misled: psycopg.Connection[Any], name: str
) -> None:
    plans = function_plans(misled, statements.load()[name].query, held_params(misled))
    assert plans, f"{name}: no statement of its function was logged"
    found = [
        (s["Node Type"], s.get("Index Name") or s.get("Relation Name", ""))
        for plan in plans
        for s in scans(plan)
    ]
    on_jobs = [s for s in found if s[1].startswith("jobs")]
    assert on_jobs, json.dumps(plans, indent=1)
    assert all(index == "jobs_pkey" for _, index in on_jobs), on_jobs
