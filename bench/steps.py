"""Scenario (issue 49): what a durable step or a stream item costs against a checkpoint.

One running job, held by this process, saves N small JSON values either as checkpoints
(``checkpoint``: one fenced UPDATE of the job's row each) or as durable steps (``step``:
``ctx.step`` with a function that returns the value, so an intent INSERT and a record UPDATE
of a ``leaseq.job_steps`` row each, both fenced and locking the job's row FOR SHARE, plus one
read of the job's steps per attempt), or as stream items (``emit``: ``ctx.emit``, one fenced
INSERT each). Measured per call: the serving backend's CPU (user +
system from /proc/<pid>/stat, so the server must be on this host), this process's CPU (the
client: the context, psycopg), the wall time, and the WAL written. Each arm ROUNDS times on
a fresh job, interleaved; the median round is reported with the range.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg

import leaseq
from bench.context import Context
from bench.env import reset_leaseq, scratch_database
from bench.lease_renewal import backend_cpu
from bench.stats import percentile
from leaseq.runtime.context import JobContext

NAME = "steps"
ARMS = ("checkpoint", "step", "emit")
ROUNDS = 5


def one_round(url: str, arm: str, calls: int) -> dict[str, float]:
    """Per call: server and client CPU (µs), wall time (µs), WAL bytes, for one fresh job."""
    reset_leaseq(url)
    with leaseq.connect(url, action="bench") as conn, psycopg.connect(url) as probe:
        leaseq.Queue.tune_worker_session(conn)
        queue = leaseq.Queue(conn)
        queue.enqueue("q", "bench")
        [job] = queue.claim(["q"], "w", lease_seconds=3600)
        ctx = JobContext(job, queue, "w", threading.Event())
        # Prepares the statements (and reads the job's steps): not counted.
        if arm == "checkpoint":
            queue.checkpoint(job.lease, {"i": -1})
        elif arm == "emit":
            ctx.emit({"i": -1})
        else:
            ctx.step("warm", lambda: {"i": -1})
        pid = conn.info.backend_pid
        lsn = probe.execute("SELECT pg_current_wal_lsn()").fetchone()
        server, client, wall = backend_cpu(pid), time.process_time(), time.perf_counter()
        for i in range(calls):
            if arm == "checkpoint":
                queue.checkpoint(job.lease, {"i": i})
            elif arm == "emit":
                ctx.emit({"i": i})
            else:
                ctx.step(f"s-{i}", lambda i=i: {"i": i})
        wall = time.perf_counter() - wall
        client = time.process_time() - client
        server = backend_cpu(pid) - server
        written = probe.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", lsn).fetchone()
    wal = float(written[0]) if written else 0.0
    return {
        "server_us": server / calls * 1e6,
        "client_us": client / calls * 1e6,
        "wall_us": wall / calls * 1e6,
        "wal_bytes": wal / calls,
    }


def measure(url: str, calls: int, rounds: int = ROUNDS) -> list[dict[str, Any]]:
    """One row per arm: the median round's per-call costs, with min and max."""
    seen: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm in ARMS:
            seen[arm].append(one_round(url, arm, calls))
    rows = []
    for arm, results in seen.items():
        row: dict[str, Any] = {"arm": arm, "calls_per_round": calls, "rounds": rounds}
        for measure_ in ("server_us", "client_us", "wall_us", "wal_bytes"):
            values = [r[measure_] for r in results]
            row[f"{measure_}_p50"] = round(percentile(values, 50), 1)
            row[f"{measure_}_min"] = round(min(values), 1)
            row[f"{measure_}_max"] = round(max(values), 1)
        rows.append(row)
    return rows


def run(ctx: Context) -> None:
    calls = 500 if ctx.quick else 2000
    with scratch_database(ctx.server_url, "steps") as url:
        with psycopg.connect(url) as probe:
            if not Path(f"/proc/{probe.info.backend_pid}/stat").exists():
                ctx.log("steps: the server is not on this host; skipped")
                return
        started = time.monotonic()
        rows = measure(url, calls)
    for r in rows:
        ctx.log(
            f"steps {r['arm']}: server {r['server_us_p50']} µs, client {r['client_us_p50']} µs,"
            f" {r['wal_bytes_p50']} WAL bytes per call"
        )
    recorder = ctx.recorder(NAME)
    recorder.params(
        {"calls": calls, "rounds": ROUNDS, "seconds": round(time.monotonic() - started, 1)}
    )
    recorder.table(NAME, rows)
