"""The no-op throughput harness shared by leaseq and its peers: same jobs, same processes,
same clock, so only the queue implementation differs.

N jobs are enqueued before the workers start; the run lasts from the start signal until the
database says no job is left unfinished (polled), or ``cap_seconds``, whichever comes first.
Throughput is finished jobs over that time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

import leaseq
from bench.env import reset_leaseq
from bench.gang import Signals, cpu_per_job, run_gang, server_cpu_meter
from leaseq.runtime.claims import ClaimPlanner

QUEUE = "bench"


@dataclass(frozen=True)
class NoopArgs:
    url: str
    owner: str
    batch: int


class Implementation(Protocol):
    """A queue under test. ``worker`` must be a module-level function (it runs in a child)."""

    name: str
    guarantees: str

    def install(self, url: str) -> None: ...

    def enqueue(self, url: str, jobs: int) -> None: ...

    def unfinished(self, conn: psycopg.Connection[Any]) -> bool: ...

    def finished(self, conn: psycopg.Connection[Any]) -> int: ...

    @property
    def worker(self) -> Callable[[NoopArgs, Signals], object]: ...


def measure(
    impl: Implementation, url: str, *, jobs: int, workers: int, batch: int, cap_seconds: float
) -> dict[str, Any]:
    """One run of ``impl`` on a database where it is installed and empty; one CSV row."""
    impl.enqueue(url, jobs)
    with psycopg.connect(url, autocommit=True) as conn:
        deadline: list[float] = []

        def done() -> bool:
            if not deadline:
                deadline.append(time.perf_counter() + cap_seconds)
            return not impl.unfinished(conn) or time.perf_counter() > deadline[0]

        run = run_gang(
            impl.worker,
            [NoopArgs(url, f"w{i + 1}", batch) for i in range(workers)],
            until=done,
            server_cpu=server_cpu_meter(url),
        )
        finished = impl.finished(conn)
    return {
        "implementation": impl.name,
        "workers": workers,
        "batch": batch,
        "jobs": jobs,
        "finished": finished,
        "seconds": round(run.seconds, 4),
        "jobs_per_second": round(finished / run.seconds, 1),
        **cpu_per_job(run, finished),
    }


def leaseq_worker(args: NoopArgs, signals: Signals) -> None:
    """Claim up to ``batch`` jobs, complete each, until told to stop."""
    with leaseq.connect(args.url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        signals.ready()
        while not signals.stopping():
            jobs = queue.claim([QUEUE], args.owner, limit=args.batch, plan=plan)
            for job in jobs:
                queue.complete(job.lease)
            if not jobs:
                time.sleep(0.005)


def leaseq_batch_worker(args: NoopArgs, signals: Signals) -> None:
    """Claim up to ``batch`` jobs and complete them together with ``Queue.complete_many``."""
    with leaseq.connect(args.url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        signals.ready()
        while not signals.stopping():
            jobs = queue.claim([QUEUE], args.owner, limit=args.batch, plan=plan)
            if jobs:
                queue.complete_many([job.lease for job in jobs])
            else:
                time.sleep(0.005)


class Leaseq:
    """leaseq itself: leases, fencing tokens, one attempt row per job (the no-op jobs have no
    idempotency key, so no effect row).

    With ``batched``, the jobs of one claim are completed by one ``complete_many`` call (one
    statement, one commit) instead of one ``complete`` each."""

    def __init__(self, batched: bool = False) -> None:
        self.batched = batched
        self.name = "leaseq+complete_many" if batched else "leaseq"
        self.guarantees = (
            "lease with expiry and fencing token per claim; attempt history row (and an effect "
            "row for keyed jobs) written by the completing statement; "
            + (
                "the jobs of one claim complete in one statement and one commit (each still "
                "fenced by its own token)"
                if batched
                else "each completion is its own commit"
            )
        )

    def install(self, url: str) -> None:
        with leaseq.connect(url, action="migrate") as conn:
            leaseq.migrate(conn)

    def enqueue(self, url: str, jobs: int) -> None:
        reset_leaseq(url)
        with leaseq.connect(url, action="bench") as conn:
            queue = leaseq.Queue(conn)
            for start in range(0, jobs, 1000):
                count = min(1000, jobs - start)
                queue.enqueue_many(leaseq.JobSpec(QUEUE, "noop") for _ in range(count))
            conn.execute("VACUUM ANALYZE leaseq.jobs")

    def unfinished(self, conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM leaseq.jobs WHERE status = 'pending')"
            " OR EXISTS (SELECT 1 FROM leaseq.jobs WHERE status = 'running')"
        ).fetchone()
        return bool(row and row[0])

    def finished(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT count(*) FROM leaseq.jobs WHERE status = 'succeeded'").fetchone()
        return int(row[0]) if row else 0

    @property
    def worker(self) -> Callable[[NoopArgs, Signals], object]:
        return leaseq_batch_worker if self.batched else leaseq_worker


def leaseq_variants() -> list[Leaseq]:
    """leaseq completing one job per call, and a batch per call with ``complete_many``."""
    return [Leaseq(), Leaseq(batched=True)]
