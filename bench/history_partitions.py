"""Scenario: does a large partitioned history cost the hot paths anything? (issue: history
that grows without slowing anything.)

EXPLAIN (ANALYZE, BUFFERS) of the claim (``job_claim``), the reaper's pass (``job_reap``),
the operator's work estimate (``pool_work``) and ``jobs show`` (``job_whereabouts`` and
``job_attempts_anywhere``, for a job in the hot table and one in history) over an empty
history, then over N finished jobs (and N attempts, N ledger rows) generated straight into
the history's day partitions with generate_series. Then one day's partition is dropped by
the retention step: how long it took and the disk it returned (pg_total_relation_size of the
day's job and attempt leaves).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import psycopg

import leaseq
from bench.context import Context
from bench.env import scratch_database
from bench.history import CLAIM_PARAMS, QUEUE, explain
from leaseq.core._store import statements
from leaseq.core.history import History

NAME = "history_partitions"
BACKLOG = 500
RUNNING = 50
RECENT_ATTEMPTS = 2000
DAYS = 7
SUCCEEDED_KEEP = 7

# Finished jobs, their attempts and ledger rows, spread evenly over DAYS days ending now.
GENERATE = [
    """
INSERT INTO leaseq.job_history (
    id, queue, job_type, payload, status, priority, attempt_count, max_attempts, created_at,
    available_at, started_at, finished_at, lease_owner, lease_token, result, enqueued_by,
    keep_days, moved_at)
SELECT 1000000000::bigint + i, %(queue)s, 'history', '{"doc": 1}', 'succeeded', 100, 1, 5,
       f, f, f, f, 'w1', 1, '{"ok": true}', current_user, %(keep)s, now()
  FROM generate_series(1, %(rows)s) i,
       LATERAL (SELECT now() - make_interval(secs => %(span)s::float8 * i / %(rows)s) AS f) t
""",
    """
INSERT INTO leaseq.job_attempt_history (job_id, attempt, lease_token, worker, started_at,
                                        ended_at, outcome, finished_at, keep_days)
SELECT id, 1, 1, 'w1', started_at, finished_at, 'succeeded', finished_at, keep_days
  FROM leaseq.job_history
""",
    """
INSERT INTO leaseq.job_ledger (id, queue, job_type, status, created_at, finished_at, attempts,
                               keep_days, moved_at)
SELECT id, queue, job_type, status, created_at, finished_at, attempt_count, keep_days, moved_at
  FROM leaseq.job_history
""",
]


def _setup_hot(url: str) -> dict[str, Any]:
    """A backlog to claim, running jobs whose leases expired (to reap), recent attempts (for
    pool_work) and one finished job in the hot table (to show)."""
    with leaseq.connect(url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        past = datetime.now().astimezone() - timedelta(minutes=5)
        queue.enqueue_many([leaseq.JobSpec(QUEUE, "expired") for _ in range(RUNNING)], now=past)
        queue.claim([QUEUE], "gone", limit=RUNNING, lease_seconds=1, now=past)
        queue.enqueue_many([leaseq.JobSpec(QUEUE, "work") for _ in range(RECENT_ATTEMPTS)])
        done = 0
        while done < RECENT_ATTEMPTS:
            jobs = queue.claim([QUEUE], "w1", limit=100)
            for job in jobs:
                queue.complete(job.lease, {"ok": True})
            done += len(jobs)
        hot = queue.enqueue(QUEUE, "show").job_id
        [job] = queue.claim([QUEUE], "w1")
        queue.complete(job.lease, {"ok": True})
        queue.enqueue_many([leaseq.JobSpec(QUEUE, "backlog") for _ in range(BACKLOG)])
        conn.execute("VACUUM ANALYZE")
    return {"hot_job": hot}


def _costs(conn: psycopg.Connection[Any], rows: int, show: dict[str, int]) -> list[dict[str, Any]]:
    named = statements.load()
    cases: list[tuple[str, bytes, dict[str, Any]]] = [
        ("job_claim", named["job_claim"].query, CLAIM_PARAMS),
        (
            "job_reap",
            named["job_reap"].query,
            {"limit": 1000, "reaper": "bench", "owners": None, "now": None},
        ),
        (
            "pool_work",
            named["pool_work"].query,
            {"queues": [QUEUE], "window": 900.0, "horizon": 10.0, "max_samples": 2000, "now": None},
        ),
    ]
    for where, job in show.items():
        cases.append((f"job_whereabouts ({where})", named["job_whereabouts"].query, {"id": job}))
        cases.append(
            (f"job_attempts_anywhere ({where})", named["job_attempts_anywhere"].query, {"id": job})
        )
    return [
        {"history_rows": rows, "statement": name, **explain(conn, query, params)}
        for name, query, params in cases
    ]


def _generate(url: str, rows: int) -> int:
    """N finished jobs straight into the history; returns one of their ids."""
    with leaseq.connect(url, action="bench") as conn:
        History(conn).ensure_partitions(
            ahead=DAYS + 1, timeout=600, now=datetime.now().astimezone() - timedelta(days=DAYS)
        )
        for sql in GENERATE:
            conn.execute(
                sql.encode(),
                {"queue": QUEUE, "rows": rows, "keep": SUCCEEDED_KEEP, "span": DAYS * 86400},
            )
        conn.execute("VACUUM ANALYZE")
    return 1000000000 + rows // 2


def _drop_one_day(url: str) -> dict[str, Any]:
    """Drop the oldest day's leaf by the retention step; its time and the disk returned."""
    with leaseq.connect(url, action="bench") as conn:
        day = conn.execute(
            "SELECT min(c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'leaseq.job_history'::regclass"
            "   AND EXISTS (SELECT 1 FROM pg_inherits x WHERE x.inhparent = c.oid)"
        ).fetchone()
        assert day is not None
        leaf = f"{day[0]}_k{SUCCEEDED_KEEP}"
        twin = leaf.replace("job_history_", "job_attempt_history_")
        row = conn.execute(
            f"SELECT (SELECT count(*) FROM leaseq.{leaf}),"
            "        pg_total_relation_size(%s::regclass) + pg_total_relation_size(%s::regclass),"
            "        pg_database_size(current_database())",
            (f"leaseq.{leaf}", f"leaseq.{twin}"),
        ).fetchone()
        assert row is not None
        rows, leaf_bytes, db_before = row
        stamp = datetime.strptime(day[0][-8:], "%Y%m%d").astimezone()
        at = stamp + timedelta(days=SUCCEEDED_KEEP + 1, hours=12)
        started = time.perf_counter()
        step = History(conn).expire_step(batch=10000, timeout=600, now=at)
        took = time.perf_counter() - started
        assert step is not None and step.dropped and step.leaf == leaf, step
        after = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        assert after is not None
    return {
        "leaf": leaf,
        "rows": rows,
        "leaf_and_attempts_bytes": leaf_bytes,
        "database_bytes_returned": db_before - after[0],
        "drop_ms": round(took * 1000, 1),
    }


def run(ctx: Context) -> None:
    rows = 20_000 if ctx.quick else 2_000_000
    recorder = ctx.recorder(NAME)
    with scratch_database(ctx.server_url, "history_partitions") as url:
        show = _setup_hot(url)
        with psycopg.connect(url, autocommit=True) as conn:
            plans = _costs(conn, 0, {"hot": show["hot_job"]})
        ctx.log(f"generating {rows} finished jobs in history")
        started = time.perf_counter()
        moved = _generate(url, rows)
        ctx.log(f"generated in {time.perf_counter() - started:.0f} s")
        with psycopg.connect(url, autocommit=True) as conn:
            plans += _costs(conn, rows, {"hot": show["hot_job"], "history": moved})
        dropped = _drop_one_day(url)
    for p in plans:
        ctx.log(
            f"{p['history_rows']} in history, {p['statement']}: {p['buffers']} buffers, "
            f"{p['execution_ms']} ms, planning {p['planning_ms']} ms"
        )
    ctx.log(f"dropped {dropped}")
    recorder.params({"history_rows": rows, "days": DAYS, "backlog": BACKLOG, "running": RUNNING})
    recorder.table(f"{NAME}_explain", plans)
    recorder.table(f"{NAME}_drop", [dropped])
