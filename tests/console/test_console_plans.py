"""Every console statement EXPLAINed (ANALYZE, BUFFERS) against a generated history of
2,000,000 jobs and their attempts (about 60,000 of them in pipelines, one waiting for 5,000
parents), durable steps and streams (STEPPED jobs with a few, one with STEPS of each) and
keyed work under flow control (FLOW_KEYS keys, a hot saturated key with HOT_READY ready
jobs, BLOCKED aggregates blocked by a dead head), as the console's own role: no sequential
scan of the jobs, attempt, steps, stream or flow tables, and a budget of buffers per
statement.
A test of plans, not of times."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import leaseq
from bench.console_pages import generate_history
from leaseq.core._store import statements
from leaseq.core.schema import ConsoleRole
from support.roles import login_roles

pytestmark = pytest.mark.slow

JOBS = 2_000_000
#: Shared buffers (8 kB pages, hit or read) one statement may touch: 3000 is 24 MB.
BUDGET = 3000
# The history tables are empty here (no partitions yet), so their plans mean nothing.
WATCHED = ("jobs", "job_attempts", "job_deps", "pipelines", "flow_keys", "flow_slots",
           "flow_aggregates", "job_steps", "job_stream")  # fmt: skip
#: Flow control's part of the history: keys with work in queue FQ (two jobs each), a hot key
#: in FH limited to 2 with both units held and HOT_READY more ready, BLOCKED aggregates in queue
#: FO whose head is dead (2 jobs behind each).
FQ, FO, FH = "flowq", "flowo", "flowh"
FLOW_KEYS = 300
HOT_READY = 3000
BLOCKED = 150
#: Durable steps: STEPPED jobs with 3 recorded steps and 3 stream items each, and one job with
#: STEPS steps (the last one uncertain) and as many stream items.
STEPPED = 20_000
STEPS = 5000


def _steps_history(url: str) -> int:
    """Steps and streams for the newest jobs; the id of the job with STEPS of them."""
    with psycopg.connect(url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(
            "SELECT id FROM leaseq.jobs ORDER BY id DESC LIMIT %s", (STEPPED + 1,)
        )]  # fmt: skip
        big, rest = ids[0], ids[1:]
        conn.execute(
            "INSERT INTO leaseq.job_steps (job_id, name, attempt, lease_token, intended_at,"
            " finished_at, result) SELECT j, 'step-' || n, 1, 1, now(), now(), to_jsonb(n)"
            " FROM unnest(%s::bigint[]) j, generate_series(1, 3) n",
            (rest,),
        )
        conn.execute(
            "INSERT INTO leaseq.job_stream (job_id, seq, value)"
            " SELECT j, n, to_jsonb(n) FROM unnest(%s::bigint[]) j, generate_series(1, 3) n",
            (rest,),
        )
        conn.execute(
            "INSERT INTO leaseq.job_steps (job_id, name, attempt, lease_token, intended_at,"
            " finished_at, result) SELECT %(id)s, format('page-%%s', lpad(n::text, 5, '0')), 1,"
            " 1, now(), CASE WHEN n < %(steps)s THEN now() END,"
            " CASE WHEN n < %(steps)s THEN jsonb_build_object('page', n) END"
            " FROM generate_series(1, %(steps)s) n",
            {"id": big, "steps": STEPS},
        )
        conn.execute(
            "INSERT INTO leaseq.job_stream (job_id, seq, value)"
            " SELECT %s, n, to_jsonb(n) FROM generate_series(1, %s) n",
            (big, STEPS),
        )
        for table in ("job_steps", "job_stream"):
            conn.execute(f"VACUUM (ANALYZE) leaseq.{table}".encode())
    return big


def _flow_history(url: str) -> None:
    specs = [leaseq.JobSpec(FH, "t", key="hot") for _ in range(HOT_READY + 2)]
    specs += [
        leaseq.JobSpec(FQ, "t", key=f"tenant-{n:04d}") for n in range(FLOW_KEYS) for _ in "ab"
    ]
    specs += [
        leaseq.JobSpec(FO, "t", {"n": n}, ordering_key=f"order-{a:04d}")
        for a in range(BLOCKED) for n in range(3)
    ]  # fmt: skip
    with leaseq.connect(url, action="test") as conn:
        flow = leaseq.FlowControl(conn)
        flow.set_limit(FH, "hot", max_running=2, per_second=100.0, burst=10.0)
        flow.set_limit(FQ, "tenant-*", max_running=4, weight=2.0)
        q = leaseq.Queue(conn)
        q.enqueue_many(specs)
        assert len(q.claim([FH], "plans", limit=50)) == 2, "the hot key runs at its limit"
        for _ in range(0, BLOCKED, 50):
            for head in q.claim([FO], "plans", limit=50):
                q.fail(head.lease, "poison", retryable=False)
        blocked = conn.execute(
            "SELECT count(*) FROM leaseq.flow_aggregates WHERE blocked_by IS NOT NULL"
        ).fetchone()
        assert blocked is not None and blocked[0] == BLOCKED
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("jobs", "flow_keys", "flow_slots", "flow_aggregates", "flow_limits"):
            conn.execute(f"VACUUM (ANALYZE) leaseq.{table}".encode())


def _params(conn: psycopg.Connection[Any], stepped: int) -> dict[str, dict[str, Any]]:
    dead_id = conn.execute(
        "SELECT id FROM leaseq.jobs WHERE status = 'dead' ORDER BY id DESC LIMIT 1"
    ).fetchone()[0]
    pending_id = conn.execute(
        "SELECT id FROM leaseq.jobs WHERE status = 'pending' ORDER BY id DESC LIMIT 1"
    ).fetchone()[0]
    high = conn.execute("SELECT max(id) FROM leaseq.jobs").fetchone()[0]
    # The wide fan-in's child (5,000 parents), one of its parents, an unfinished pipeline.
    wide = conn.execute(
        "SELECT child_id FROM leaseq.job_deps GROUP BY child_id ORDER BY count(*) DESC LIMIT 1"
    ).fetchone()[0]
    parent = conn.execute(
        "SELECT parent_id FROM leaseq.job_deps WHERE child_id = %s LIMIT 1", (wide,)
    ).fetchone()[0]
    open_pipeline = conn.execute(
        "SELECT min(id) FROM leaseq.pipelines WHERE finished_at IS NULL"
    ).fetchone()[0]
    assert wide and parent and open_pipeline, "the history has no pipelines"
    jobs = {
        "before": high + 1, "window": 5000, "limit": 50, "status": None, "queue": None,
        "job_type": None, "error_code": None, "key": None, "created_from": None,
        "created_to": None,
    }  # fmt: skip
    steps = {"id": stepped, "after": "", "limit": 51, "max_bytes": 65536}
    dead = {"queue": None, "job_type": None, "error_code": None, "limit": 100, "scan": 10000}
    pipeline_jobs = {"id": 1, "after": 0, "status": None, "window": 1000, "limit": 101}
    action = {"ids": [dead_id], "actor": "plan-test", "reason": "plan", "filter": None}
    flow = {
        "queue": None, "after_queue": "", "after_key": "", "limit": 101, "cap": 1000,
        "now": None,
    }  # fmt: skip
    return {
        "console_bounds": {"ms": 5000},
        "console_role": {},
        "console_privileges": {},
        "console_queues": {"limit": 200, "scan": 1000, "rank_cap": 100, "now": None},
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
        "console_job": {"id": dead_id, "max_bytes": 65536},
        "console_job_attempts": {"id": dead_id, "limit": 200},
        "console_job_steps": steps,
        "console_job_steps/last page": {**steps, "after": "page-04990"},
        "console_job_step_facts": {"id": stepped, "cap": 1000},
        "console_job_step_state": {"id": stepped, "name": "page-04990"},
        "console_held": {"limit": 50},
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
        "console_job_links": {"id": wide},
        "console_job_parents": {"id": wide, "after": 0, "limit": 51},
        "console_job_parents/last page": {"id": wide, "after": high, "limit": 51},
        "console_job_children": {"id": parent, "after": 0, "limit": 51},
        "console_pipelines": {"before": None, "unfinished": False, "limit": 51},
        "console_pipelines/unfinished": {"before": None, "unfinished": True, "limit": 51},
        "console_pipelines/older": {"before": 100, "unfinished": False, "limit": 51},
        "console_pipeline": {"id": 1},
        # Pipeline 1 has only finished jobs (about 15,000), none of them cancelled: a state
        # filter looks at one window of them.
        "console_pipeline_jobs/all finished": pipeline_jobs,
        "console_pipeline_jobs/rare state": {**pipeline_jobs, "status": "cancelled"},
        "console_pipeline_jobs": {**pipeline_jobs, "id": open_pipeline},
        "console_cancel_pipeline": {"id": open_pipeline, "actor": "plan-test", "reason": "plan"},
        # The job of 5,000 steps is not dead: the function's two updates find nothing, by key.
        "console_resolve_step": {
            "id": stepped,
            "name": "page-02500",
            "result": None,
            "retry": True,
            "actor": "plan-test",
            "reason": "plan",
        },
        "console_flow_limits": flow,
        "console_flow_limits/queue": {**flow, "queue": FQ},
        "console_flow_keys": flow,
        "console_flow_keys/queue, second page": {
            **flow,
            "queue": FQ,
            "after_queue": FQ,
            "after_key": "tenant-0100",
        },
        # A page of 100 keys (limited to 4, none held) and the hot key (both units held).
        "console_flow_holders": {
            "queues": [FQ] * 100,
            "keys": [f"tenant-{n:04d}" for n in range(100)],
            "per_key": 20,
            "live_seconds": 60.0,
            "now": None,
        },
        "console_flow_holders/hot key": {
            "queues": [FH],
            "keys": ["hot"],
            "per_key": 20,
            "live_seconds": 60.0,
            "now": None,
        },
        "console_flow_blocked": flow,
        "console_flow_blocked/queue, second page": {
            **flow,
            "queue": FO,
            "after_queue": FO,
            "after_key": "order-0100",
        },
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
        generate_history(url, JOBS)
        _flow_history(url)
        stepped = _steps_history(url)
        with login_roles(url, "console") as roles:
            with leaseq.connect(url, action="test") as conn:
                leaseq.migrate(conn, console=ConsoleRole(roles.names["console"], admin=True))
            yield url, roles.urls["console"], stepped
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_every_console_statement_is_bounded_at_two_million_jobs(big_history: Any) -> None:
    owner_url, console_url, stepped = big_history
    named = {n: s for n, s in statements.load().items() if n.startswith("console_")}
    with psycopg.connect(owner_url) as conn:
        cases = _params(conn, stepped)
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
