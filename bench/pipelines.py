"""Scenario 9 (issue 23): pipelines. Numbers only, on a real PostgreSQL.

- ``fan_out``: 1 -> N. A graph of N page jobs and their merge enqueued in one transaction
  (``enqueue_graph``), that graph cancelled by its pipeline's id (``cancel_pipeline``, one
  transaction), and the same fan-out spawned by a running job in its completion's
  transaction (``complete_many(spawns=...)``): seconds and jobs per second.
- ``fan_in``: N -> 1. N claimed parents of one merge are completed by 4 threads in batches of
  20 (the worker's group commit); every completion decrements the merge's count under its row
  lock, so this is the hot-row case: seconds and completions per second. The same N jobs
  without a child, and as N chains (each parent with a child of its own), give the
  completion rate with and without dependencies.
- ``unblock``: the time from the last parent's completion to the child's claim, per sample
  (one parent, one child; a claimer thread that LISTENs on the queue and claims on each
  wake-up, as a worker's dispatcher does): from sending the completion, so it includes the
  completion's own round trip (reported as well), p50/p99.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

import leaseq
from bench.context import Context
from bench.env import scratch_database
from bench.stats import ms, percentile

NAME = "pipelines"
THREADS = 4
BATCH = 20


def _claim_all(queue: leaseq.Queue, q: str, job_type: str, n: int) -> list[leaseq.ClaimedJob]:
    claimed: list[leaseq.ClaimedJob] = []
    while len(claimed) < n:
        got = queue.claim([q], "bench", limit=100, job_types=[job_type], lease_seconds=3600)
        if not got:
            raise RuntimeError(f"only {len(claimed)} of {n} {job_type} jobs claimable")
        claimed.extend(got)
    return claimed


def _complete_all(pool: leaseq.Pool, jobs: list[leaseq.ClaimedJob]) -> float:
    """Seconds to complete ``jobs`` from THREADS threads in batches of BATCH."""
    batches = [jobs[i : i + BATCH] for i in range(0, len(jobs), BATCH)]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        queue = leaseq.Queue(pool)
        while True:
            with lock:
                if not batches:
                    return
                batch = batches.pop()
            try:
                answers = queue.complete_many([j.lease for j in batch], [{"ok": 1}] * len(batch))
                assert all(isinstance(a, leaseq.Completed) for a in answers)
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def fan_out(url: str, n: int) -> list[dict[str, Any]]:
    rows = []
    with leaseq.connect(url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        graph = leaseq.Graph("fan-out")
        pages = [graph.add("fo", "page", {"i": i}, name=f"p{i}") for i in range(n)]
        graph.add("fo", "merge", name="merge", after=pages)
        t0 = time.perf_counter()
        made = queue.enqueue_graph(graph)
        took = time.perf_counter() - t0
        rows.append(
            {
                "case": "enqueue_graph",
                "jobs": n + 1,
                "seconds": round(took, 3),
                "jobs_per_s": round((n + 1) / took),
            }
        )
        t0 = time.perf_counter()
        cancelled = queue.cancel_pipeline(made.pipeline_id).cancelled
        took = time.perf_counter() - t0
        rows.append(
            {
                "case": "cancel_pipeline",
                "jobs": cancelled,
                "seconds": round(took, 3),
                "jobs_per_s": round(cancelled / took),
            }
        )
        splitter = queue.enqueue("fo2", "split").job_id
        (job,) = queue.claim(["fo2"], "bench", job_types=["split"])
        assert job.id == splitter
        spawned = leaseq.Graph("spawned")
        parts = [spawned.add("fo2", "page", {"i": i}, name=f"p{i}") for i in range(n)]
        spawned.add("fo2", "merge", name="merge", after=parts)
        t0 = time.perf_counter()
        (done,) = queue.complete_many([job.lease], [None], spawns=[spawned])
        took = time.perf_counter() - t0
        assert isinstance(done, leaseq.Completed)
        rows.append(
            {
                "case": "spawn_in_completion",
                "jobs": n + 1,
                "seconds": round(took, 3),
                "jobs_per_s": round((n + 1) / took),
            }
        )
    return rows


def completion_rates(url: str, n: int) -> list[dict[str, Any]]:
    """Completion rate of n jobs: plain, as parents of one merge (fan-in), as n chains."""
    rows = []
    with leaseq.open_pool(url, min_size=THREADS, max_size=THREADS + 1) as pool:
        queue = leaseq.Queue(pool)
        setups: list[tuple[str, Callable[[str], object]]] = [
            (
                "no_dependencies",
                lambda q: queue.enqueue_many([leaseq.JobSpec(q, "job") for _ in range(n)]),
            ),
            ("fan_in_parents_of_one", lambda q: _fan_in_graph(queue, q, n)),
            ("chains_parent_of_own_child", lambda q: _chains_graph(queue, q, n)),
        ]
        for case, setup in setups:
            q = f"rate-{case}"[:40]
            setup(q)
            jobs = _claim_all(queue, q, "job", n)
            took = _complete_all(pool, jobs)
            children = queue.stats([q])
            ready = children[0].ready if children else 0
            rows.append(
                {
                    "case": case,
                    "completions": n,
                    "seconds": round(took, 3),
                    "completions_per_s": round(n / took),
                    "children_ready": ready,
                }
            )
    return rows


def _fan_in_graph(queue: leaseq.Queue, q: str, n: int) -> None:
    graph = leaseq.Graph("fan-in")
    parents = [graph.add(q, "job", name=f"p{i}") for i in range(n)]
    graph.add(q, "merge", name="merge", after=parents)
    queue.enqueue_graph(graph)


def _chains_graph(queue: leaseq.Queue, q: str, n: int) -> None:
    graph = leaseq.Graph("chains")
    for i in range(n):
        graph.add(q, "child", name=f"c{i}", after=[graph.add(q, "job", name=f"p{i}")])
    queue.enqueue_graph(graph)


def unblock(url: str, samples: int) -> dict[str, Any]:
    """Seconds from sending the last parent's completion to the child's claim."""
    claimed: dict[int, float] = {}
    stop = threading.Event()
    ready = threading.Event()

    def claimer() -> None:
        with (
            psycopg.connect(url, autocommit=True) as listen,
            leaseq.connect(url, action="bench") as conn,
        ):
            queue = leaseq.Queue(conn)
            listen.execute("LISTEN leaseq_jobs")
            ready.set()
            while not stop.is_set():
                for _ in listen.notifies(timeout=0.5, stop_after=1):
                    pass
                for job in queue.claim(["unblock"], "claimer", limit=10, job_types=["child"]):
                    claimed[job.id] = time.perf_counter()

    thread = threading.Thread(target=claimer, daemon=True)
    thread.start()
    ready.wait(10)
    latencies, completes = [], []
    with leaseq.connect(url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        for _ in range(samples):
            parent = queue.enqueue("unblock", "parent").job_id
            child = queue.enqueue("unblock", "child", after=[parent]).job_id
            (job,) = queue.claim(["unblock"], "bench", job_types=["parent"])
            t0 = time.perf_counter()
            queue.complete(job.lease)
            completes.append(time.perf_counter() - t0)
            deadline = time.monotonic() + 10
            while child not in claimed:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"child {child} not claimed within 10 s")
                time.sleep(0.0005)
            latencies.append(claimed[child] - t0)
    stop.set()
    thread.join(5)
    return {
        "samples": samples,
        "p50_ms": ms(percentile(latencies, 50)),
        "p99_ms": ms(percentile(latencies, 99)),
        "max_ms": ms(max(latencies)),
        "completion_p50_ms": ms(percentile(completes, 50)),
    }


def measure(url: str, *, width: int, samples: int) -> dict[str, list[dict[str, Any]]]:
    return {
        "pipelines_fan_out": fan_out(url, width),
        "pipelines_completion_rate": completion_rates(url, width),
        "pipelines_unblock": [unblock(url, samples)],
    }


def run(ctx: Context) -> None:
    width = 1000 if ctx.quick else 10_000
    samples = 50 if ctx.quick else 500
    with scratch_database(ctx.server_url, "pipelines") as url:
        tables = measure(url, width=width, samples=samples)
    for row in tables["pipelines_unblock"]:
        ctx.log(f"unblock: p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms")
    recorder = ctx.recorder(NAME)
    recorder.params(
        {"width": width, "unblock_samples": samples, "threads": THREADS, "batch": BATCH}
    )
    for name, rows in tables.items():
        recorder.table(name, rows)
