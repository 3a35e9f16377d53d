"""Every console statement EXPLAINed (ANALYZE, BUFFERS) against a generated history of
2,000,000 jobs and their attempts, as the console's own role: no sequential scan of the jobs
or attempt tables, and a budget of buffers per statement. A test of plans, not of times."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import leaseq
from leaseq.core._store import statements
from leaseq.core.schema import ConsoleRole
from support.roles import login_roles

pytestmark = pytest.mark.slow

JOBS = 2_000_000
#: Shared buffers (8 kB pages, hit or read) one statement may touch: 3000 is 24 MB.
BUDGET = 3000
# The history tables are empty here (no partitions yet), so their plans mean nothing.
WATCHED = ("jobs", "job_attempts")

GENERATE = """
INSERT INTO leaseq.jobs (queue, job_type, payload, status, priority, attempt_count, max_attempts,
                         created_at, available_at, started_at, finished_at, lease_owner,
                         lease_token, lease_expires_at, heartbeat_at, last_error,
                         last_error_code, idempotency_key)
SELECT 'q' || (g % 5), 't' || (g % 7), jsonb_build_object('doc', g, 'pages', g % 40),
       s.status::leaseq.job_status, (g % 3) * 50,
       CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END, 3, c.at,
       CASE WHEN s.status = 'pending' AND g % 2 = 0 THEN now() + interval '1 hour' ELSE c.at END,
       CASE WHEN s.status <> 'pending' THEN c.at END,
       CASE WHEN s.status IN ('succeeded', 'dead') THEN c.at + interval '1 minute' END,
       CASE WHEN s.status <> 'pending' THEN 'w-' || (g % 50) END,
       CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN s.status = 'running' THEN now() + interval '30 seconds' END,
       CASE WHEN s.status = 'running' THEN now() - interval '2 seconds' END,
       CASE WHEN s.status = 'dead' THEN 'page ' || (g % 40) || ' is blank' END,
       CASE WHEN s.status = 'dead' THEN 'E' || (g % 4) END,
       CASE WHEN g % 10 = 0 THEN 'doc-' || g END
  FROM generate_series(1, %(n)s) g
 CROSS JOIN LATERAL (SELECT now() - (%(n)s - g) * interval '1 second' AS at) c
 CROSS JOIN LATERAL (SELECT CASE WHEN g % 10000 = 0 THEN 'running'
                                 WHEN g % 100 < 80 THEN 'succeeded'
                                 WHEN g % 100 < 95 THEN 'dead'
                                 ELSE 'pending' END AS status) s
"""
ATTEMPTS = """
INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at,
                                 outcome, error)
SELECT j.id, 1, 1, j.lease_owner, j.started_at, j.finished_at,
       CASE WHEN j.status = 'dead' THEN 'failed' ELSE 'succeeded' END::leaseq.attempt_outcome,
       j.last_error
  FROM leaseq.jobs j WHERE j.status IN ('succeeded', 'dead')
"""
WORKERS = """
INSERT INTO leaseq.workers (worker_id, queues, concurrency, in_flight, job_types)
SELECT 'w-' || g, ARRAY['q' || (g % 5)], 8, 4, NULL FROM generate_series(0, 49) g
"""
SCHEDULES = """
INSERT INTO leaseq.schedules (name, cron, queue, job_type, declared_by)
SELECT 'nightly-' || g, '0 3 * * *', 'q' || g, 't1', 'runtime' FROM generate_series(0, 4) g
"""


def _params(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    dead_id = conn.execute(
        "SELECT id FROM leaseq.jobs WHERE status = 'dead' ORDER BY id DESC LIMIT 1"
    ).fetchone()[0]
    pending_id = conn.execute(
        "SELECT id FROM leaseq.jobs WHERE status = 'pending' ORDER BY id DESC LIMIT 1"
    ).fetchone()[0]
    high = conn.execute("SELECT max(id) FROM leaseq.jobs").fetchone()[0]
    jobs = {
        "before": high + 1, "window": 5000, "limit": 50, "status": None, "queue": None,
        "job_type": None, "error_code": None, "key": None, "created_from": None,
        "created_to": None,
    }  # fmt: skip
    dead = {"queue": None, "job_type": None, "error_code": None, "limit": 100, "scan": 10000}
    action = {"ids": [dead_id], "actor": "plan-test", "reason": "plan", "filter": None}
    return {
        "console_bounds": {"ms": 5000},
        "console_role": {},
        "console_queues": {"limit": 200},
        "console_queue_panel": {"queue": "q1", "cap": 1000, "live_seconds": 60.0, "now": None},
        "console_id_bounds": {},
        "console_id_below": {"before": high - 5000},
        "console_jobs": jobs,
        "console_jobs/rare filters": {
            **jobs,
            "status": "dead",
            "queue": "q3",
            "job_type": "t5",
            "error_code": "E2",
            "key": "doc-1999990",
            "created_from": datetime(2020, 1, 1, tzinfo=UTC),
        },
        "console_jobs/middle": {**jobs, "before": high // 2, "status": "succeeded"},
        "console_job": {"id": dead_id},
        "console_job_attempts": {"id": dead_id, "limit": 200},
        "console_dead": dead,
        "console_dead/queue and type": {**dead, "queue": "q2", "job_type": "t3"},
        "console_dead_count": dead,
        "console_dead_count/queue": {**dead, "queue": "q4", "error_code": "E1"},
        "console_pending": {"queue": "q1", "job_type": "t2", "scan": 2000, "limit": 1000},
        "console_retry_dead": action,
        "console_cancel": {**action, "ids": [pending_id]},
        "console_workers": {"limit": 500, "now": None},
        "console_schedules": {"limit": 500},
        "console_audit": {"limit": 50},
    }


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


@pytest.fixture(scope="module")
def big_history(server_url: str, template_db: str) -> Any:
    name = f"leaseq_big_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = make_conninfo(server_url, dbname=name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            with conn.transaction():
                conn.execute(GENERATE.replace("%(n)s", str(JOBS)).encode())
                conn.execute(ATTEMPTS)
                conn.execute(WORKERS)
                conn.execute(SCHEDULES)
            conn.execute("VACUUM (ANALYZE) leaseq.jobs")
            conn.execute("VACUUM (ANALYZE) leaseq.job_attempts")
            conn.execute("ANALYZE")
        with login_roles(url, "console") as roles:
            with leaseq.connect(url, action="test") as conn:
                leaseq.migrate(conn, console=ConsoleRole(roles.names["console"], admin=True))
            yield url, roles.urls["console"]
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_every_console_statement_is_bounded_at_two_million_jobs(big_history: Any) -> None:
    owner_url, console_url = big_history
    named = {n: s for n, s in statements.load().items() if n.startswith("console_")}
    with psycopg.connect(owner_url) as conn:
        cases = _params(conn)
    assert {c.split("/")[0] for c in cases} == set(named) - {"console_grants_apply"}
    report = []
    with psycopg.connect(console_url) as conn:
        for case, params in cases.items():
            statement = named[case.split("/")[0]]
            with conn.transaction(force_rollback=True):
                conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                row = conn.execute(
                    b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement.query,
                    {**params, "ids": params.get("ids")} if "ids" in params else params,
                ).fetchone()
            plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
            nodes = _nodes(plan)
            seq = sorted(
                {n.get("Relation Name", "") for n in nodes if n["Node Type"] == "Seq Scan"}
                & set(WATCHED)
            )
            buffers = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
            report.append((case, buffers, seq))
            print(f"{case:34} {buffers:6d} buffers  seq scans: {seq or '-'}")
    bad = [r for r in report if r[2] or r[1] > BUDGET]
    assert not bad, f"unbounded console statements (budget {BUDGET} buffers): {bad}"
