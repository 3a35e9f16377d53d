"""Scenario 1 (seed 000): claim correctness and scaling with W worker processes.

Each worker loops: claim one job, "work" for ``job_seconds`` (a sleep, as in the article),
complete it; it stops when a claim finds nothing. Two claims are compared on the same jobs:

* ``naive``: the article's two statements (SELECT the head of the queue, then UPDATE it by
  id) at Read Committed. Idle workers read the same head row and all run it.
* ``leaseq``: ``Queue.claim`` (one statement, FOR UPDATE SKIP LOCKED) and ``Queue.complete``.

The run's time is measured from the database, first claim to last completion, as the article
did, so process start-up and idle exits do not count.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import psycopg

import leaseq
from bench.context import Context
from bench.env import reset_leaseq, scratch_database
from bench.gang import Signals, cpu_per_job, run_gang, server_cpu_meter
from bench.stats import ms, percentile
from leaseq.runtime.claims import ClaimPlanner

NAME = "claim_scaling"
QUEUE = "bench"

# The article's naive claim, on leaseq's table: nothing stops two workers from taking the
# same row. finished_at is cleared so the table's CHECK constraints still hold.
NAIVE_SELECT = """
SELECT id FROM leaseq.jobs
 WHERE status = 'pending' AND queue = %(queue)s AND available_at <= now()
 ORDER BY priority, available_at, id
 LIMIT 1
"""
NAIVE_MARK = """
UPDATE leaseq.jobs
   SET status = 'running', attempt_count = attempt_count + 1, lease_token = lease_token + 1,
       lease_owner = %(owner)s, started_at = now(), heartbeat_at = now(),
       lease_expires_at = now() + interval '30 seconds', finished_at = NULL
 WHERE id = %(id)s
RETURNING attempt_count, extract(epoch FROM now())::float8 AS at
"""
NAIVE_DONE = """
UPDATE leaseq.jobs
   SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL
 WHERE id = %(id)s
RETURNING extract(epoch FROM now())::float8 AS at
"""


@dataclass(frozen=True)
class WorkerArgs:
    url: str
    strategy: str
    owner: str
    job_seconds: float


@dataclass(frozen=True)
class Execution:
    """One run of one job by one worker; times are database epoch seconds."""

    job_id: int
    worker: str
    attempt: int
    claim_seconds: float
    claimed_at: float
    done_at: float


def worker(args: WorkerArgs, signals: Signals) -> list[Execution]:
    """Run jobs until a claim finds none; return every execution."""
    runs: list[Execution] = []
    with leaseq.connect(args.url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        signals.ready()
        while True:
            t0 = time.perf_counter()
            if args.strategy == "naive":
                found = conn.execute(NAIVE_SELECT, {"queue": QUEUE}).fetchone()
                if found is None:
                    return runs
                attempt, claimed_at = conn.execute(
                    NAIVE_MARK, {"owner": args.owner, "id": found[0]}
                ).fetchone() or (0, 0.0)
                claim_seconds = time.perf_counter() - t0
                time.sleep(args.job_seconds)
                done = conn.execute(NAIVE_DONE, {"id": found[0]}).fetchone()
                runs.append(
                    Execution(
                        found[0],
                        args.owner,
                        attempt,
                        claim_seconds,
                        claimed_at,
                        done[0] if done else 0.0,
                    )
                )
            else:
                jobs = queue.claim([QUEUE], args.owner, lease_seconds=60.0, plan=plan)
                claim_seconds = time.perf_counter() - t0
                if not jobs:
                    return runs
                [job] = jobs
                time.sleep(args.job_seconds)
                queue.complete(job.lease)
                runs.append(
                    Execution(
                        job.id,
                        args.owner,
                        job.attempt,
                        claim_seconds,
                        job.lease.started_at.timestamp(),
                        0.0,
                    )
                )


def _database_span(url: str, strategy: str, runs: list[Execution]) -> float:
    """First claim to last completion, in database time."""
    if strategy == "naive":
        return max(r.done_at for r in runs) - min(r.claimed_at for r in runs)
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(ended_at) - min(started_at))::float8"
            " FROM leaseq.job_attempts"
        ).fetchone()
    return float(row[0]) if row else float("nan")


def measure(url: str, strategy: str, workers: int, jobs: int, job_seconds: float) -> dict[str, Any]:
    """Enqueue ``jobs`` jobs, run ``workers`` processes with ``strategy`` over them, and
    return one CSV row of what happened."""
    reset_leaseq(url)
    with leaseq.connect(url, action="bench") as conn:
        leaseq.Queue(conn).enqueue_many(leaseq.JobSpec(QUEUE, "sleep") for _ in range(jobs))
    run = run_gang(
        worker,
        [WorkerArgs(url, strategy, f"w{i + 1}", job_seconds) for i in range(workers)],
        server_cpu=server_cpu_meter(url),
    )
    runs = [r for batch in run.results for r in batch]
    with psycopg.connect(url) as conn:
        wrong, unfinished = conn.execute(
            "SELECT count(*) FILTER (WHERE attempt_count <> 1),"
            " count(*) FILTER (WHERE status <> 'succeeded') FROM leaseq.jobs"
        ).fetchone() or (0, 0)
    by_job: dict[int, list[Execution]] = defaultdict(list)
    for r in runs:
        by_job[r.job_id].append(r)
    most = max(by_job.values(), key=len)
    span = _database_span(url, strategy, runs)
    ideal = jobs * job_seconds / workers
    latencies = [r.claim_seconds for r in runs]
    return {
        "strategy": strategy,
        "workers": workers,
        "jobs": jobs,
        "job_seconds": job_seconds,
        "executions": len(runs),
        "duplicates": len(runs) - len(by_job),
        "jobs_run_more_than_once": sum(1 for v in by_job.values() if len(v) > 1),
        "max_copies_of_one_job": len(most),
        "max_copies_window_ms": ms(
            max(r.claimed_at for r in most) - min(r.claimed_at for r in most)
        ),
        "wrong_attempt_counts": wrong,
        "unfinished": unfinished,
        "seconds": round(span, 4),
        "ideal_seconds": round(ideal, 4),
        "jobs_per_second": round(jobs / span, 2),
        "efficiency": round(ideal / span, 4),
        "claim_p50_ms": ms(percentile(latencies, 50)),
        "claim_p99_ms": ms(percentile(latencies, 99)),
        **cpu_per_job(run, jobs),
    }


def run(ctx: Context) -> None:
    jobs, job_seconds = (48, 0.2) if ctx.quick else (400, 0.2)
    counts = (4, 16) if ctx.quick else (1, 2, 4, 8, 16)
    rows = []
    with scratch_database(ctx.server_url, "claim") as url:
        for strategy in ("naive", "leaseq"):
            for workers in counts:
                row = measure(url, strategy, workers, jobs, job_seconds)
                ctx.log(
                    f"claim {strategy} W={workers}: {row['executions']} executions, "
                    f"{row['duplicates']} duplicates, {row['jobs_per_second']} jobs/s, "
                    f"efficiency {row['efficiency']}, claim p50 {row['claim_p50_ms']} ms"
                )
                rows.append(row)
    recorder = ctx.recorder(NAME)
    recorder.params({"jobs": jobs, "job_seconds": job_seconds, "workers": counts})
    recorder.table(NAME, rows)
