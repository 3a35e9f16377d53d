"""Scenario 4: no-op throughput vs workers and claim batch size, and wake-up latency.

Throughput: see :mod:`bench.noop`. Wake-up latency: one idle worker process waits for work
either with LISTEN on ``leaseq_jobs`` (enqueue sends pg_notify in its transaction; polling
stays as the fallback) or by polling every P seconds; the producer enqueues one job at a time
at random gaps. Latency is from the moment the producer's enqueue has committed to the moment
the worker's claim has returned (both wall-clock on this machine).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import leaseq
from bench import noop
from bench.context import Context
from bench.env import reset_leaseq, scratch_database
from bench.gang import Signals, run_gang
from bench.stats import ms, percentile
from leaseq.runtime.claims import ClaimPlanner

NAME = "throughput"
QUEUE = noop.QUEUE


@dataclass(frozen=True)
class WakeArgs:
    url: str
    mode: str  # "notify" or "poll"
    poll_seconds: float


def wake_worker(args: WakeArgs, signals: Signals) -> list[tuple[int, float]]:
    """Wait for jobs (LISTEN or polling), claim and complete them; return (job id, claimed at)."""
    claimed: list[tuple[int, float]] = []
    with leaseq.connect(args.url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        if args.mode == "notify":
            conn.execute("LISTEN leaseq_jobs")
        signals.ready()
        while not signals.stopping():
            jobs = queue.claim([QUEUE], "waker", plan=plan)
            at = time.time()
            for job in jobs:
                claimed.append((job.id, at))
                queue.complete(job.lease)
            if jobs:
                continue
            if args.mode == "notify":
                # Notifications that arrived during the claim are kept by psycopg and returned here.
                for _ in conn.notifies(timeout=args.poll_seconds, stop_after=1):
                    pass
            else:
                time.sleep(args.poll_seconds)
    return claimed


def wakeup(url: str, mode: str, poll_seconds: float, jobs: int) -> dict[str, Any]:
    committed: dict[int, float] = {}
    rng = random.Random(6)
    reset_leaseq(url)
    with leaseq.connect(url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        produced = 0

        def produce() -> bool:
            nonlocal produced
            if produced < jobs:
                job_id = queue.enqueue(QUEUE, "wake").job_id
                committed[job_id] = time.time()
                produced += 1
                time.sleep(rng.uniform(0.05, 0.25))
                return False
            # Give the last job time to be claimed (polling needs up to one interval).
            time.sleep((poll_seconds if mode == "poll" else 0.0) + 0.3)
            return True

        run = run_gang(wake_worker, [WakeArgs(url, mode, poll_seconds)], until=produce)
    latencies = [at - committed[job_id] for job_id, at in run.results[0]]
    return {
        "kind": "wakeup",
        "wake_mode": mode,
        "poll_seconds": poll_seconds,
        "jobs": jobs,
        "claimed": len(latencies),
        "wakeup_p50_ms": ms(percentile(latencies, 50)),
        "wakeup_p99_ms": ms(percentile(latencies, 99)),
        "wakeup_max_ms": ms(max(latencies, default=float("nan"))),
    }


def run(ctx: Context) -> None:
    counts: tuple[int, ...]
    batches: tuple[int, ...]
    if ctx.quick:
        jobs, cap, counts, batches, wake_jobs = 1000, 10.0, (2, 8), (1, 10), 8
    else:
        jobs, cap, counts, batches, wake_jobs = 10_000, 30.0, (1, 2, 4, 8, 16), (1, 10, 50), 30
    rows: list[dict[str, Any]] = []
    with scratch_database(ctx.server_url, "throughput") as url:
        for impl in noop.leaseq_variants():
            for batch in batches:
                for workers in counts:
                    row = noop.measure(
                        impl, url, jobs=jobs, workers=workers, batch=batch, cap_seconds=cap
                    )
                    ctx.log(
                        f"noop {impl.name} W={workers} batch={batch}: "
                        f"{row['jobs_per_second']} jobs/s"
                    )
                    rows.append({"kind": "noop", **row})
        for mode, poll in (("notify", 5.0), ("poll", 0.1), ("poll", 1.0)):
            row = wakeup(url, mode, poll, wake_jobs)
            ctx.log(f"wake-up {mode} (poll {poll} s): p50 {row['wakeup_p50_ms']} ms")
            rows.append(row)
    recorder = ctx.recorder(NAME)
    recorder.params(
        {
            "jobs": jobs,
            "cap_seconds": cap,
            "workers": counts,
            "batches": batches,
            "wakeup_jobs": wake_jobs,
        }
    )
    recorder.table(NAME, rows)
