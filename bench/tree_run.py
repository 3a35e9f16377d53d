"""One drain of no-op jobs by real ``leaseq worker`` processes of the source tree this runs in,
with the server's statement statistics of just that drain (run by ``bench.trees``).

It uses only what both compared trees have (``bench.runtime.running_workers``, ``bench.gang``,
``leaseq.Queue.enqueue_many``), so ``python -P bench/tree_run.py`` with PYTHONPATH set to
either tree measures that tree's code. It prints one JSON object.

The database must have the ``pg_stat_statements`` extension: its counters are reset at the
moment the stopped workers are resumed, so the figures are the workers' statements alone
(the harness's own polling statement is left out by its text). Those figures, unlike CPU,
do not move with the machine's load: statements, rows, buffers and WAL bytes per job.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any

import psycopg

import leaseq
from bench.env import reset_leaseq
from bench.gang import process_cpu_seconds, server_cpu_meter
from bench.noop import QUEUE
from bench.runtime import running_workers

UNFINISHED = (
    "SELECT EXISTS (SELECT 1 FROM leaseq.jobs WHERE status = 'pending')"
    " OR EXISTS (SELECT 1 FROM leaseq.jobs WHERE status = 'running')"
)
# The workers' statements in this database since the reset, without the harness's polling.
STATEMENTS = """
SELECT query, calls, rows, total_exec_time, shared_blks_hit + shared_blks_read AS blocks,
       shared_blks_dirtied AS dirtied, wal_bytes, wal_records
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND query NOT LIKE 'SELECT EXISTS (SELECT %% FROM leaseq.jobs WHERE status%%'
   AND query NOT LIKE '%%pg_stat_statements%%'
"""
RESET = (
    "SELECT pg_stat_statements_reset(0, "
    "(SELECT oid FROM pg_database WHERE datname = current_database()), 0)"
)


def _one(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    return row[0] if row else None


def drain(
    url: str, jobs: int, workers: int, concurrency: int, cap_seconds: float
) -> dict[str, Any]:
    """Enqueue ``jobs`` no-op jobs, drain them, and say what it cost (see the module's doc)."""
    reset_leaseq(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE leaseq.workers")
        with running_workers(url, workers, concurrency) as running:
            for p in running.procs:
                p.send_signal(signal.SIGSTOP)
            queue = leaseq.Queue(conn)
            for start in range(0, jobs, 1000):
                count = min(1000, jobs - start)
                queue.enqueue_many(leaseq.JobSpec(QUEUE, "noop") for _ in range(count))
            conn.execute("VACUUM ANALYZE leaseq.jobs")
            conn.execute("CHECKPOINT")
            meter = server_cpu_meter(url)
            cpu0 = {p.pid: process_cpu_seconds(p.pid) for p in running.procs}
            conn.execute(RESET)
            lsn0 = _one(conn, "SELECT pg_current_wal_lsn()")
            server0 = meter() if meter else 0.0
            t0 = time.perf_counter()
            for p in running.procs:
                p.send_signal(signal.SIGCONT)
            while _one(conn, UNFINISHED) and time.perf_counter() - t0 < cap_seconds:
                time.sleep(0.02)
            seconds = time.perf_counter() - t0
            client = sum(process_cpu_seconds(p.pid) - cpu0[p.pid] for p in running.procs)
            server = meter() - server0 if meter else float("nan")
            wal = _one(conn, f"SELECT pg_current_wal_lsn() - '{lsn0}'::pg_lsn")
            stats = conn.execute(STATEMENTS).fetchall()
        finished = _one(conn, "SELECT count(*) FROM leaseq.jobs WHERE status = 'succeeded'")
    per = 1.0 / max(finished, 1)
    top = sorted(stats, key=lambda s: -s[3])[:6]
    return {
        "finished": finished,
        "seconds": seconds,
        "jobs_per_second": finished / seconds,
        "server_cpu_ms_per_job": server * 1000 * per,
        "client_cpu_ms_per_job": client * 1000 * per,
        "statements_per_job": sum(s[1] for s in stats) * per,
        "rows_per_job": sum(s[2] for s in stats) * per,
        "exec_us_per_job": sum(s[3] for s in stats) * 1000 * per,
        "blocks_per_job": sum(s[4] for s in stats) * per,
        "dirtied_per_job": sum(s[5] for s in stats) * per,
        "wal_bytes_per_job": float(wal) * per,
        "stmt_wal_bytes_per_job": float(sum(s[6] for s in stats)) * per,
        "top": [
            {
                "query": " ".join(s[0].split())[:90],
                "calls": s[1],
                "rows": s[2],
                "exec_us_per_job": s[3] * 1000 * per,
                "blocks_per_job": s[4] * per,
            }
            for s in top
        ],
    }


if __name__ == "__main__":
    url, jobs, workers, concurrency, cap = sys.argv[1:6]
    print(json.dumps(drain(url, int(jobs), int(workers), int(concurrency), float(cap))))
