"""The web console's pages over a generated history (the plans test's 2,000,000-job shape):
each page requested a few times through the ASGI app, as the console's own role; prints and
returns p50 and max milliseconds per page. Not part of `python -m bench`'s scenarios: run it on
its own, e.g. ``python -m bench.console_pages --jobs 200000 --database-url URL``.

Times here are this machine's; the bounded part (buffers per statement) is asserted by
tests/console/test_console_plans.py, whatever the machine.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import leaseq
from bench.env import scratch_database
from bench.stats import ms, percentile
from leaseq.core.schema import ConsoleRole

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
#: About 60,000 jobs (one in 33) in pipelines of about 100: pipeline 1 holds only finished
#: jobs (about 15,000, the worst case for a page of its unfinished ones), the pending ones
#: elsewhere wait for a parent; one job waits for 5,000 parents (a wide fan-in). Counters are
#: set from the jobs, as the transitions would have kept them.
PIPELINES = """
UPDATE leaseq.jobs j
   SET pipeline_id = CASE WHEN j.status = 'succeeded' AND j.id % 2 = 0 AND j.id < 1000000 THEN 1
                          ELSE 2 + j.id / 3300 END,
       status = CASE WHEN j.status = 'pending' AND j.id % 2 = 1 THEN 'waiting' ELSE j.status END,
       deps_left = CASE WHEN j.status = 'pending' AND j.id % 2 = 1 THEN 1 ELSE 0 END
 WHERE j.id % 33 = 0;
INSERT INTO leaseq.job_deps (parent_id, child_id, after, counted)
SELECT j.id - 33, j.id, 'succeeded', false FROM leaseq.jobs j WHERE j.status = 'waiting';
INSERT INTO leaseq.job_deps (parent_id, child_id, after, counted)
SELECT p.id, (SELECT max(w.id) FROM leaseq.jobs w WHERE w.status = 'waiting'), 'succeeded', true
  FROM (SELECT id FROM leaseq.jobs WHERE pipeline_id = 1 ORDER BY id LIMIT 5000) p
    ON CONFLICT DO NOTHING;
UPDATE leaseq.jobs j SET has_children = true
 WHERE j.id IN (SELECT d.parent_id FROM leaseq.job_deps d);
INSERT INTO leaseq.pipelines (id, name, created_at, total, succeeded, dead, cancelled, finished_at)
OVERRIDING SYSTEM VALUE
SELECT j.pipeline_id, 'pipeline-' || j.pipeline_id, min(j.created_at), count(*),
       count(*) FILTER (WHERE j.status = 'succeeded'), count(*) FILTER (WHERE j.status = 'dead'),
       count(*) FILTER (WHERE j.status = 'cancelled'),
       CASE WHEN bool_and(j.finished_at IS NOT NULL) THEN max(j.finished_at) END
  FROM leaseq.jobs j WHERE j.pipeline_id IS NOT NULL GROUP BY j.pipeline_id;
SELECT setval(pg_get_serial_sequence('leaseq.pipelines', 'id'),
              (SELECT max(id) FROM leaseq.pipelines));
"""
SCHEDULES = """
INSERT INTO leaseq.schedules (name, cron, queue, job_type, declared_by)
SELECT 'nightly-' || g, '0 3 * * *', 'q' || g, 't1', 'runtime' FROM generate_series(0, 4) g
"""


def generate_history(url: str, jobs: int) -> None:
    """``jobs`` jobs in every state over 5 queues (80% succeeded, 15% dead, 5% pending, one in
    10,000 running), an attempt per finished job, 50 workers, 5 schedules, one job in 33 in
    pipelines (:data:`PIPELINES`); vacuumed and analyzed. One INSERT ... SELECT
    generate_series per table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        with conn.transaction():
            conn.execute(GENERATE.replace("%(n)s", str(int(jobs))).encode())
            conn.execute(ATTEMPTS.encode())
            conn.execute(WORKERS.encode())
            conn.execute(SCHEDULES.encode())
            conn.execute(PIPELINES.encode())
        conn.execute("VACUUM (ANALYZE) leaseq.jobs")
        conn.execute("VACUUM (ANALYZE) leaseq.job_attempts")
        conn.execute("VACUUM (ANALYZE) leaseq.job_deps")
        conn.execute("VACUUM (ANALYZE) leaseq.pipelines")
        conn.execute("ANALYZE")


def pages(url: str, repeats: int) -> dict[str, tuple[float, float]]:
    """p50 and max milliseconds of each page over ``repeats`` requests."""
    from starlette.testclient import TestClient

    from leaseq.console import create_app

    with psycopg.connect(url) as conn:
        dead = conn.execute(
            "SELECT id FROM leaseq.jobs WHERE status = 'dead' ORDER BY id DESC LIMIT 1"
        ).fetchone()
    paths = [
        "/",
        "/jobs",
        "/jobs?status=dead&queue=q3&job_type=t5&error_code=E2",
        f"/jobs/{dead[0] if dead else 1}",
        "/dead",
        "/dead?queue=q2&job_type=t3",
        "/cancel?queue=q1&job_type=t2",
        "/workers",
        "/schedules",
        "/pipelines",
        "/pipelines/1",
        "/pipelines/2",
    ]
    out = {}
    local = {"client": ("127.0.0.1", 50000), "base_url": "http://127.0.0.1:8089"}
    with TestClient(create_app(url), **local) as client:
        for path in paths:
            took = []
            for _ in range(repeats):
                start = time.perf_counter()
                answer = client.get(path)
                took.append(time.perf_counter() - start)
                assert answer.status_code == 200, (path, answer.status_code)
            out[path] = (ms(percentile(took, 50)), ms(max(took)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.console_pages", description=__doc__)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("LEASEQ_BENCH_DATABASE_URL"),
        help="server to use (a scratch database is created and dropped)",
    )
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("--database-url (or LEASEQ_BENCH_DATABASE_URL) is required")
    with scratch_database(args.database_url, "console") as url:
        start = time.perf_counter()
        generate_history(url, args.jobs)
        print(f"generated {args.jobs} jobs in {time.perf_counter() - start:.1f} s")
        role = f"bench_console_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        try:
            with leaseq.connect(url, action="migrate") as conn:
                leaseq.migrate(conn, console=ConsoleRole(role, admin=False))
            for path, (p50, worst) in pages(make_conninfo(url, user=role), args.repeats).items():
                print(f"{path:60} p50 {p50:8.1f} ms   max {worst:8.1f} ms")
        finally:
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
