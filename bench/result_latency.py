"""Scenario 8 (issue 22): enqueue to ``result()`` returning, for a no-op job.

One real ``leaseq worker`` process (``--app bench.apps:registry``, concurrency 4, 1 s poll)
runs the jobs. A producer in this process enqueues one job with ``wait=True``, then blocks in
``result()`` until it returns, one job at a time, so each sample is one job's whole round
trip: the enqueue commit, the worker's wake-up and claim, the no-op, the completion's commit
and its ``leaseq_done`` notification, the waiter's wake-up and read. The sync face
(:class:`leaseq.Queue` on a pool) and the asyncio face (:class:`leaseq.aio.AsyncQueue`) each
run the same number of jobs, after a few warm-up jobs that are not counted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from psycopg_pool import AsyncConnectionPool

import leaseq
from bench.context import Context
from bench.env import reset_leaseq, scratch_database
from bench.noop import QUEUE
from bench.runtime import running_workers
from bench.stats import ms, percentile
from leaseq.aio import AsyncQueue
from leaseq.core import waiters

NAME = "result_latency"
WARMUP = 10


def _row(face: str, samples: list[float]) -> dict[str, Any]:
    return {
        "face": face,
        "jobs": len(samples),
        "p50_ms": ms(percentile(samples, 50)),
        "p99_ms": ms(percentile(samples, 99)),
        "max_ms": ms(max(samples)),
        "mean_ms": ms(sum(samples) / len(samples)),
    }


def sync_samples(url: str, jobs: int) -> list[float]:
    """Seconds from enqueue to result(), per job, on the sync face."""
    samples = []
    with leaseq.open_pool(url, min_size=2, max_size=4) as pool:
        queue = leaseq.Queue(pool)
        for i in range(WARMUP + jobs):
            t0 = time.perf_counter()
            job = queue.enqueue(QUEUE, "noop", wait=True)
            queue.result(job.job_id, timeout=60)
            if i >= WARMUP:
                samples.append(time.perf_counter() - t0)
        # The process's listening connection outlives the pool unless closed.
        waiters.shared_listener(str(pool.conninfo)).close()
    return samples


def async_samples(url: str, jobs: int) -> list[float]:
    """Seconds from enqueue to result(), per job, on the asyncio face."""

    async def main() -> list[float]:
        samples = []
        async with AsyncConnectionPool(
            url, min_size=2, max_size=4, kwargs={"autocommit": True}
        ) as pool:
            queue = AsyncQueue(pool)
            for i in range(WARMUP + jobs):
                t0 = time.perf_counter()
                job = await queue.enqueue(QUEUE, "noop", wait=True)
                await queue.result(job.job_id, timeout=60)
                if i >= WARMUP:
                    samples.append(time.perf_counter() - t0)
            await waiters.shared_async_listener(str(pool.conninfo)).close()
        return samples

    return asyncio.run(main())


def measure(url: str, jobs: int) -> list[dict[str, Any]]:
    """Both faces against one real worker process; one row per face."""
    reset_leaseq(url)
    with running_workers(url, 1, 4):
        return [_row("sync", sync_samples(url, jobs)), _row("async", async_samples(url, jobs))]


def run(ctx: Context) -> None:
    jobs = 200 if ctx.quick else 2000
    with scratch_database(ctx.server_url, "result") as url:
        rows = measure(url, jobs)
    for r in rows:
        ctx.log(f"result latency {r['face']}: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms")
    recorder = ctx.recorder(NAME)
    recorder.params({"jobs_per_face": jobs, "warmup": WARMUP, "worker_concurrency": 4})
    recorder.table(NAME, rows)
