"""Server instructions per no-op job for the source tree this runs in (run by ``bench.trees``).

One session claims and completes jobs 64 at a time, as a worker's session does (generic
plans); the server runs under callgrind, which writes each backend's instruction count
when it exits (``<dumps>/cg.<pid>``). Two drains, of 5 and 15 claims' worth of jobs, each
in a session of its own: the difference over the extra jobs leaves out the session's start
and its first plans. Counted instructions do not move with the machine's load: the same
code gives the same count within 0.05%.

``python -P bench/tree_count.py URL DUMPS`` with PYTHONPATH set to a tree; prints JSON.
Uses only what both compared trees have.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psycopg

import leaseq
from bench.env import reset_leaseq
from bench.noop import QUEUE
from leaseq.runtime.claims import ClaimPlanner

BATCH = 64


def _instructions(dump: Path, timeout: float = 300.0) -> int:
    """The instruction total callgrind wrote for an exited backend."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dump.exists():
            for line in dump.read_text().splitlines():
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        time.sleep(0.5)
    raise RuntimeError(f"callgrind wrote no total to {dump} within {timeout:.0f} s")


def drain(url: str, dumps: Path, jobs: int) -> int:
    """Claim and complete ``jobs`` no-op jobs in one new session; its server instructions."""
    reset_leaseq(url)
    with leaseq.connect(url, action="bench") as conn:
        leaseq.Queue(conn).enqueue_many(leaseq.JobSpec(QUEUE, "noop") for _ in range(jobs))
        conn.execute("VACUUM ANALYZE leaseq.jobs")
    with leaseq.connect(url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        leaseq.Queue.tune_worker_session(conn)  # as a worker's session: generic plans
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        plan = ClaimPlanner()
        while claimed := queue.claim([QUEUE], "w1", limit=BATCH, plan=plan):
            queue.complete_many([job.lease for job in claimed])
    return _instructions(dumps / f"cg.{row[0]}")


if __name__ == "__main__":
    url, dumps = sys.argv[1], Path(sys.argv[2])
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("TRUNCATE leaseq.workers")
    small, large = drain(url, dumps, 5 * BATCH), drain(url, dumps, 15 * BATCH)
    print(json.dumps({"server_instructions_per_job": (large - small) / (10 * BATCH)}))
