"""Scenario 2 (seed 000): one transaction held across the work vs two short ones.

8 worker processes run leaseq's own claim and complete either inside one transaction that
stays open while the job "works" (``held``), or each as its own short transaction
(``two_short``: what leaseq does). A sampler reads pg_stat_activity every 100 ms: sessions
idle in transaction, the oldest open transaction's age, and the oldest snapshot's xmin age
(how far back VACUUM is held).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

import leaseq
from bench.context import Context
from bench.env import reset_leaseq, scratch_database
from bench.gang import Signals, cpu_per_job, run_gang, server_cpu_meter
from bench.stats import ms, percentile
from leaseq.runtime.claims import ClaimPlanner

NAME = "txn_scope"
QUEUE = "bench"
SAMPLE = """
SELECT count(*) FILTER (WHERE state = 'idle in transaction') AS idle_in_transaction,
       coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)::float8
           AS oldest_transaction_s,
       coalesce(max(age(backend_xmin)), 0) AS oldest_xmin_age
  FROM pg_stat_activity
 WHERE datname = current_database() AND backend_type = 'client backend'
   AND pid <> pg_backend_pid()
"""


@dataclass(frozen=True)
class ScopeArgs:
    url: str
    held: bool
    owner: str
    job_seconds: float


@dataclass(frozen=True)
class ScopeRun:
    """One worker's claim latencies (s) and its first claim / last completion (wall clock)."""

    latencies: list[float]
    first: float
    last: float


def worker(args: ScopeArgs, signals: Signals) -> ScopeRun:
    """Run jobs until none is left."""
    latencies: list[float] = []
    with leaseq.connect(args.url, action="bench", autocommit=not args.held) as conn:
        queue = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        signals.ready()
        first = last = time.time()
        while True:
            # Held: the tidy-looking mistake, where the row lock, the snapshot and the
            # connection are held for as long as the work runs. Otherwise two short ones.
            with conn.transaction() if args.held else contextlib.nullcontext():
                t0 = time.perf_counter()
                jobs = queue.claim([QUEUE], args.owner, lease_seconds=60.0, plan=plan)
                latencies.append(time.perf_counter() - t0)
                if not jobs:
                    return ScopeRun(latencies[:-1], first, last)
                time.sleep(args.job_seconds)
                queue.complete(jobs[0].lease)
            last = time.time()


class Sampler(threading.Thread):
    """Samples pg_stat_activity every ``every`` seconds until stopped."""

    def __init__(self, url: str, every: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.every = every
        self.samples: list[dict[str, Any]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            t0 = time.perf_counter()
            while not self.halt.is_set():
                row = conn.execute(SAMPLE).fetchone()
                if row:
                    self.samples.append(
                        {
                            "t": round(time.perf_counter() - t0, 3),
                            "idle_in_transaction": row[0],
                            "oldest_transaction_s": round(row[1], 3),
                            "oldest_xmin_age": row[2],
                        }
                    )
                self.halt.wait(self.every)


def measure(
    url: str, held: bool, workers: int, rounds: int, job_seconds: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    reset_leaseq(url)
    jobs = workers * rounds
    with leaseq.connect(url, action="bench") as conn:
        leaseq.Queue(conn).enqueue_many(leaseq.JobSpec(QUEUE, "sleep") for _ in range(jobs))
    sampler = Sampler(url)
    sampler.start()
    try:
        run = run_gang(
            worker,
            [ScopeArgs(url, held, f"w{i + 1}", job_seconds) for i in range(workers)],
            server_cpu=server_cpu_meter(url),
        )
    finally:
        sampler.halt.set()
        sampler.join()
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM leaseq.job_attempts").fetchone()
    attempts = int(row[0]) if row else 0
    # Wall clock, not database time: inside one held transaction now() is the transaction's
    # start, so the completion would be stamped with the claim's time.
    span = max(r.last for r in run.results) - min(r.first for r in run.results)
    scope = "held" if held else "two_short"
    latencies = [s for r in run.results for s in r.latencies]
    samples = sampler.samples
    summary = {
        "scope": scope,
        "workers": workers,
        "job_seconds": job_seconds,
        "jobs": jobs,
        "attempts": attempts,
        "seconds": round(span, 4),
        "jobs_per_second": round(jobs / span, 3),
        "claim_p50_ms": ms(percentile(latencies, 50)),
        "max_idle_in_transaction": max((s["idle_in_transaction"] for s in samples), default=0),
        "mean_idle_in_transaction": round(
            sum(s["idle_in_transaction"] for s in samples) / max(len(samples), 1), 2
        ),
        "max_transaction_age_s": max((s["oldest_transaction_s"] for s in samples), default=0),
        "max_xmin_age": max((s["oldest_xmin_age"] for s in samples), default=0),
        "samples": len(samples),
        **cpu_per_job(run, jobs),
    }
    series = [{"scope": scope, "job_seconds": job_seconds, **s} for s in samples]
    return summary, series


def run(ctx: Context) -> None:
    workers = 8
    plan = ((0.2, 3), (1.0, 2)) if ctx.quick else ((0.2, 10), (1.0, 4), (3.0, 2))
    summaries, series = [], []
    with scratch_database(ctx.server_url, "scope") as url:
        for job_seconds, rounds in plan:
            for held in (True, False):
                summary, samples = measure(url, held, workers, rounds, job_seconds)
                ctx.log(
                    f"scope {summary['scope']} {job_seconds}s: {summary['jobs_per_second']} jobs/s,"
                    f" idle in txn max {summary['max_idle_in_transaction']},"
                    f" oldest txn {summary['max_transaction_age_s']} s"
                )
                summaries.append(summary)
                series.extend(samples)
    recorder = ctx.recorder(NAME)
    recorder.params({"workers": workers, "job_seconds_and_rounds": plan, "sample_every_s": 0.1})
    recorder.table(NAME, summaries)
    recorder.table(f"{NAME}_samples", series)
