"""Scenario 6: leaseq and its peers on the same server in the same run.

Peers: pgqueuer (asyncpg driver, batched dequeue) and procrastinate (psycopg), whatever
versions are installed, and, in full runs only, DBOS Transact, Chancy and Oban for Python,
pinned, each in an environment of its own (:mod:`bench.external`). Runtime against runtime:
leaseq's row is the real ``leaseq worker`` (:mod:`bench.runtime`), the peers' rows are their
own worker runtimes (pgqueuer's QueueManager, procrastinate's worker, DBOS's queue, Chancy's
Worker, Oban's queues). leaseq's hand-written API loops are measured too and
labelled ``loop = api``. Two measurements:

* ``noop``: no-op throughput, W worker processes, each queue at its default and at tuned
  settings (pgqueuer batches of 10, its default, 32 and 64; procrastinate concurrency 1, its
  default, and 10; ``leaseq worker`` concurrency 1, its default, 16, 32 and 64): the report
  compares best with best and default with default (:data:`DEFAULTS`).
* ``sleep``: scenario 1's workload (one job at a time per process, ``job_seconds`` of work):
  ``leaseq worker`` processes, and each peer's own claim and completion calls.
* ``limits``: DBOS, Chancy and Oban with their own concurrency limit of k over W processes;
  the most handlers running at one instant, from the handlers' own timestamps, against the
  limit (global for DBOS, per process for Chancy and Oban, as each documents).

Every configuration runs in each of ``rounds`` rounds (the machine's noise reaches 1.7x from
run to run); each row says its round and the machine's load average when it started.

A peer that cannot be installed or run gets a row with its error instead of numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

import leaseq
from bench import noop
from bench import runtime as worker_runtime
from bench.apps import record_start
from bench.context import Context
from bench.env import scratch_database
from bench.external import SPECS, ExternalArm
from bench.gang import Signals, cpu_per_job, run_gang, server_cpu_meter
from bench.noop import NoopArgs
from bench.stats import loadavg, ms, percentile
from leaseq.runtime.claims import ClaimPlanner

NAME = "peers"
QUEUE = noop.QUEUE

#: What a user gets without tuning: the batch (or concurrency) of each runtime by default.
#: DBOS's queue has no limit by default (0 here), Chancy's a core count per process through
#: a process pool (0 here: the column says no number was set), Oban's examples use 10.
DEFAULTS = {
    worker_runtime.IMPLEMENTATION: 1,
    "pgqueuer": 10,
    "procrastinate": 1,
    "dbos": 0,
    "chancy": 0,
    "oban": 10,
}


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def asyncpg_kwargs(url: str) -> dict[str, Any]:
    parts = conninfo_to_dict(url)
    return {
        "host": parts.get("host"),
        "port": int(parts.get("port") or 5432),
        "user": parts.get("user"),
        "password": parts.get("password") or None,
        "database": parts.get("dbname"),
    }


def run_async(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(main())


async def until_stopped(signals: Signals, stop: Callable[[], object]) -> None:
    while not signals.stopping():
        await asyncio.sleep(0.05)
    stop()


# -- pgqueuer ------------------------------------------------------------------------------


def pgqueuer_noop_worker(args: NoopArgs, signals: Signals) -> None:
    """pgqueuer's own QueueManager with a no-op entrypoint (and :mod:`bench.start`'s
    ``stamp``), dequeuing ``batch`` at a time."""
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.queries import Queries

    async def main() -> None:
        conn = await asyncpg.connect(**asyncpg_kwargs(args.url))
        manager = QueueManager(Queries(AsyncpgDriver(conn)))

        @manager.entrypoint("noop")
        async def work(job: object) -> None:
            return None

        @manager.entrypoint("stamp")
        async def stamp(job: Any) -> None:
            payload = json.loads(job.payload)
            record_start(payload["file"], payload["ref"])
            await asyncio.sleep(payload["seconds"])

        signals.ready()
        watcher = asyncio.create_task(until_stopped(signals, manager.shutdown.set))
        await manager.run(batch_size=args.batch, dequeue_timeout=timedelta(seconds=1))
        await watcher

    run_async(main)


class Pgqueuer:
    name = "pgqueuer"
    guarantees = (
        "no lease token or fencing: a picked job whose worker heartbeat goes stale is re-picked; "
        "completions are buffered and written in batches (a crash loses buffered completions, "
        "so those jobs run again); finished jobs are moved to a log table"
    )

    def __init__(self) -> None:
        self.enqueued = 0

    def install(self, url: str) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver
        from pgqueuer.queries import Queries

        async def main() -> None:
            conn = await asyncpg.connect(**asyncpg_kwargs(url))
            try:
                await Queries(AsyncpgDriver(conn)).install()
            finally:
                await conn.close()

        run_async(main)

    def enqueue(self, url: str, jobs: int, entrypoint: str = "noop") -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver
        from pgqueuer.queries import Queries

        async def main() -> None:
            conn = await asyncpg.connect(**asyncpg_kwargs(url))
            try:
                await conn.execute("TRUNCATE pgqueuer")
                queries = Queries(AsyncpgDriver(conn))
                for start in range(0, jobs, 1000):
                    n = min(1000, jobs - start)
                    await queries.enqueue([entrypoint] * n, [None] * n, [0] * n)
                await conn.execute("VACUUM ANALYZE pgqueuer")
            finally:
                await conn.close()

        run_async(main)
        self.enqueued = jobs

    def unfinished(self, conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute("SELECT EXISTS (SELECT 1 FROM pgqueuer)").fetchone()
        return bool(row and row[0])

    def finished(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
        return self.enqueued - (int(row[0]) if row else 0)

    @property
    def worker(self) -> Callable[[NoopArgs, Signals], object]:
        return pgqueuer_noop_worker


# -- procrastinate -------------------------------------------------------------------------


def procrastinate_app(url: str, pool: int) -> Any:
    from procrastinate import App, PsycopgConnector

    # A small pool per process keeps 16 processes under the server's max_connections.
    app = App(connector=PsycopgConnector(conninfo=url, min_size=1, max_size=pool))

    @app.task(name="noop", queue=QUEUE)
    async def noop_task() -> None:
        return None

    @app.task(name="sleep", queue=QUEUE)
    async def sleep_task() -> None:
        return None

    @app.task(name="stamp", queue=QUEUE)
    async def stamp_task(ref: int, file: str, seconds: float) -> None:
        record_start(file, ref)
        await asyncio.sleep(seconds)

    return app


def procrastinate_noop_worker(args: NoopArgs, signals: Signals) -> None:
    """procrastinate's own worker; ``batch`` is its concurrency (it fetches one job at a time)."""

    async def main() -> None:
        app = procrastinate_app(args.url, pool=4)
        async with app.open_async():
            signals.ready()
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=[QUEUE], concurrency=args.batch, wait=True, install_signal_handlers=False
                )
            )
            await until_stopped(signals, worker.cancel)
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    run_async(main)


class Procrastinate:
    name = "procrastinate"
    guarantees = (
        "no lease or fencing token: a job stays 'doing' until its worker finishes; jobs of a "
        "worker whose heartbeat stops are found by get_stalled_jobs and must be retried "
        "explicitly; one fetch and one finish statement per job"
    )

    def install(self, url: str) -> None:
        async def main() -> None:
            app = procrastinate_app(url, pool=2)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        run_async(main)

    def enqueue(self, url: str, jobs: int, task: str = "noop") -> None:
        async def main() -> None:
            app = procrastinate_app(url, pool=2)
            async with app.open_async():
                await app.connector.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")
                for start in range(0, jobs, 1000):
                    n = min(1000, jobs - start)
                    await app.tasks[task].batch_defer_async(*({} for _ in range(n)))

        run_async(main)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE procrastinate_jobs")

    def unfinished(self, conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
        ).fetchone()
        return bool(row and row[0])

    def finished(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()
        return int(row[0]) if row else 0

    @property
    def worker(self) -> Callable[[NoopArgs, Signals], object]:
        return procrastinate_noop_worker


# -- scenario 1's workload through each queue's claim and completion -----------------------


@dataclass(frozen=True)
class SleepArgs:
    url: str
    implementation: str
    owner: str
    job_seconds: float


@dataclass(frozen=True)
class Run:
    """One execution: job id, claim latency (s), claim start and completion (wall clock)."""

    job_id: int
    claim_seconds: float
    started: float
    done: float


def sleep_worker(args: SleepArgs, signals: Signals) -> list[Run]:
    """Claim one job, sleep, complete; until a claim finds nothing."""
    if args.implementation == "pgqueuer":
        return run_async(lambda: _pgqueuer_sleep(args, signals))  # type: ignore[no-any-return]
    if args.implementation == "procrastinate":
        return run_async(lambda: _procrastinate_sleep(args, signals))  # type: ignore[no-any-return]
    runs: list[Run] = []
    with leaseq.connect(args.url, action="bench") as conn:
        queue = leaseq.Queue(conn)
        plan = ClaimPlanner()  # claims as a worker does
        signals.ready()
        while True:
            started, t0 = time.time(), time.perf_counter()
            jobs = queue.claim([QUEUE], args.owner, lease_seconds=60.0, plan=plan)
            latency = time.perf_counter() - t0
            if not jobs:
                return runs
            time.sleep(args.job_seconds)
            queue.complete(jobs[0].lease)
            runs.append(Run(jobs[0].id, latency, started, time.time()))


async def _pgqueuer_sleep(args: SleepArgs, signals: Signals) -> list[Run]:
    import asyncpg
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import EntrypointExecutionParameter, Queries
    from pgqueuer.types import QueueEntrypoint, QueueManagerId

    conn = await asyncpg.connect(**asyncpg_kwargs(args.url))
    queries = Queries(AsyncpgDriver(conn))
    entrypoints = {QueueEntrypoint("sleep"): EntrypointExecutionParameter(concurrency_limit=0)}
    manager = QueueManagerId(uuid.uuid4())
    runs: list[Run] = []
    signals.ready()
    while True:
        started, t0 = time.time(), time.perf_counter()
        jobs = await queries.dequeue(1, entrypoints, manager, None, timedelta(seconds=60))
        latency = time.perf_counter() - t0
        if not jobs:
            await conn.close()
            return runs
        await asyncio.sleep(args.job_seconds)
        await queries.log_jobs([(jobs[0], "successful", None)])
        runs.append(Run(int(jobs[0].id), latency, started, time.time()))


async def _procrastinate_sleep(args: SleepArgs, signals: Signals) -> list[Run]:
    from procrastinate.jobs import Status

    app = procrastinate_app(args.url, pool=1)
    runs: list[Run] = []
    async with app.open_async():
        manager = app.job_manager
        worker_id = await manager.register_worker()
        signals.ready()
        while True:
            started, t0 = time.time(), time.perf_counter()
            job = await manager.fetch_job(queues=[QUEUE], worker_id=worker_id)
            latency = time.perf_counter() - t0
            if job is None:
                return runs
            await asyncio.sleep(args.job_seconds)
            await manager.finish_job(job, status=Status.SUCCEEDED, delete_job=False)
            runs.append(Run(int(job.id or 0), latency, started, time.time()))


def sleep_run(name: str, url: str, workers: int, jobs: int, job_seconds: float) -> dict[str, Any]:
    """Scenario 1's workload on one queue: one CSV row."""
    run = run_gang(
        sleep_worker,
        [SleepArgs(url, name, f"w{i + 1}", job_seconds) for i in range(workers)],
        server_cpu=server_cpu_meter(url),
    )
    runs = [r for batch in run.results for r in batch]
    copies = Counter(r.job_id for r in runs)
    span = max(r.done for r in runs) - min(r.started for r in runs)
    ideal = jobs * job_seconds / workers
    return {
        "kind": "sleep",
        "implementation": name,
        "workers": workers,
        "jobs": jobs,
        "job_seconds": job_seconds,
        "executions": len(runs),
        "duplicates": len(runs) - len(copies),
        "unfinished": jobs - len(copies),
        "seconds": round(span, 4),
        "jobs_per_second": round(len(copies) / span, 2),
        "efficiency": round(ideal / span, 4),
        "claim_p50_ms": ms(percentile([r.claim_seconds for r in runs], 50)),
        "claim_p99_ms": ms(percentile([r.claim_seconds for r in runs], 99)),
        **cpu_per_job(run, jobs),
    }


class PeerArm:
    """A queue driven by the gang harness (:mod:`bench.noop`): a peer's own worker runtime,
    or one of leaseq's hand-written API loops (``loop = api``, no sleep workload)."""

    def __init__(self, ctx: Context, impl: noop.Implementation, plan: dict[str, Any]) -> None:
        self.ctx, self.impl, self.plan = ctx, impl, plan
        self.name = impl.name
        self.api = isinstance(impl, noop.Leaseq)
        self.base = {
            "implementation": impl.name,
            "loop": "api" if self.api else "runtime",
            "version": version("leaseq" if self.api else impl.name),
            "guarantees": impl.guarantees,
        }

    def open(self, stack: contextlib.ExitStack) -> None:
        label = self.impl.name.replace("+", "_")
        self.url = stack.enter_context(
            scratch_database(self.ctx.server_url, f"peer_{label}", migrate=False)
        )
        self.impl.install(self.url)

    def noop(self, workers: int) -> list[dict[str, Any]]:
        rows = []
        for batch in self.plan["batches"].get(self.name, self.plan["batches"]["*"]):
            load = loadavg()
            row = noop.measure(
                self.impl,
                self.url,
                jobs=self.plan["jobs"],
                workers=workers,
                batch=batch,
                cap_seconds=self.plan["cap"],
            )
            self.ctx.log(
                f"peers noop {self.name} W={workers} batch={batch}: {row['jobs_per_second']} jobs/s"
            )
            rows.append({"kind": "noop", **self.base, **row, "loadavg": load})
        return rows

    def sleep(self) -> list[dict[str, Any]]:
        if self.api:
            return []  # leaseq's sleep workload runs through leaseq worker
        plan, impl = self.plan, self.impl
        if isinstance(impl, Pgqueuer):
            impl.enqueue(self.url, plan["sleep_jobs"], entrypoint="sleep")
        elif isinstance(impl, Procrastinate):
            impl.enqueue(self.url, plan["sleep_jobs"], task="sleep")
        load = loadavg()
        row = sleep_run(
            impl.name, self.url, plan["sleep_workers"], plan["sleep_jobs"], plan["job_seconds"]
        )
        self.ctx.log(
            f"peers sleep {impl.name}: {row['duplicates']} duplicates, "
            f"claim p50 {row['claim_p50_ms']} ms, efficiency {row['efficiency']}"
        )
        return [{**self.base, **row, "loop": "api", "loadavg": load}]


class RuntimeArm:
    """The real ``leaseq worker`` processes (:mod:`bench.runtime`)."""

    name = worker_runtime.IMPLEMENTATION

    def __init__(self, ctx: Context, plan: dict[str, Any]) -> None:
        self.ctx, self.plan = ctx, plan
        self.base = {
            "loop": "runtime",
            "version": version("leaseq"),
            "guarantees": worker_runtime.GUARANTEES,
        }

    def open(self, stack: contextlib.ExitStack) -> None:
        self.url = stack.enter_context(scratch_database(self.ctx.server_url, "peer_runtime"))

    def noop(self, workers: int) -> list[dict[str, Any]]:
        rows = []
        for concurrency in self.plan["concurrency"]:
            load = loadavg()
            run = worker_runtime.run_workers(
                self.url, jobs=self.plan["jobs"], workers=workers, concurrency=concurrency,
                cap_seconds=self.plan["cap"],
            )  # fmt: skip
            row = worker_runtime.noop_row(
                run, workers=workers, concurrency=concurrency, jobs=self.plan["jobs"]
            )
            self.ctx.log(
                f"peers noop {self.name} W={workers} concurrency={concurrency}: "
                f"{row['jobs_per_second']} jobs/s"
            )
            rows.append({"kind": "noop", **self.base, **row, "loadavg": load})
        return rows

    def sleep(self) -> list[dict[str, Any]]:
        plan = self.plan
        load = loadavg()
        run = worker_runtime.run_workers(
            self.url,
            jobs=plan["sleep_jobs"],
            workers=plan["sleep_workers"],
            concurrency=1,
            job_type="sleep",
            payload={"seconds": plan["job_seconds"]},
        )
        row = worker_runtime.sleep_row(
            run, workers=plan["sleep_workers"], jobs=plan["sleep_jobs"],
            job_seconds=plan["job_seconds"],
        )  # fmt: skip
        self.ctx.log(
            f"peers sleep {self.name}: {row['duplicates']} duplicates, "
            f"claim p50 {row['claim_p50_ms']} ms, efficiency {row['efficiency']}"
        )
        return [{**self.base, **row, "loadavg": load}]


Arm = PeerArm | RuntimeArm | ExternalArm


def _error(arm: Arm, exc: Exception) -> dict[str, Any]:
    """The row of an arm that could not be installed or run: its error instead of numbers."""
    return {
        "kind": "error",
        "implementation": arm.name,
        "version": arm.spec.version if isinstance(arm, ExternalArm) else version(arm.name),
        "error": f"{type(exc).__name__}: {exc}",
    }


def plan_for(quick: bool) -> dict[str, Any]:
    """The sizes of a quick or a full run, and which settings each runtime runs at."""
    if quick:
        return {
            "rounds": 1,
            "jobs": 1000,
            "cap": 5.0,
            "workers": (4,),
            "batches": {"*": (10,)},
            "concurrency": (4,),
            "sleep_workers": 8,
            "sleep_jobs": 48,
            "job_seconds": 0.2,
        }
    return {
        "rounds": 2,
        "jobs": 10_000,
        "cap": 30.0,
        "workers": (1, 4, 16),
        # The API loops at pgqueuer's default only: they are labelled, not compared.
        "batches": {"*": (10,), "pgqueuer": (10, 32, 64), "procrastinate": (1, 10)},
        "concurrency": (1, 16, 32, 64),
        "sleep_workers": 16,
        "sleep_jobs": 400,
        "job_seconds": 0.2,
        # Peers in environments of their own (bench.external); never in the quick run,
        # whose time CI pays. Each at its default and at its best documented setting
        # (the documentation is cited in bench/peer_child.py), then its own limit.
        "external": {
            "settings": {
                # Per process limit 1000 polled every 0.1 s: the fastest of 0 (none), 64,
                # 256 and 1000 per process tried on this machine.
                "dbos": (("default", 0), ("tuned", 1000)),
                "chancy": (("default", 0), ("tuned", 64)),
                "oban": (("default", 10), ("tuned", 64)),
            },
            "limits": {"workers": 4, "limit": 4, "jobs": 200, "job_seconds": 0.05},
        },
    }


def run(ctx: Context) -> None:
    plan = plan_for(ctx.quick)
    rows: list[dict[str, Any]] = []
    candidates: list[Arm] = [RuntimeArm(ctx, plan)]
    impls: list[noop.Implementation] = [*noop.leaseq_variants(), Pgqueuer(), Procrastinate()]
    candidates += [PeerArm(ctx, impl, plan) for impl in impls]
    if "external" in plan:
        candidates += [ExternalArm(ctx, spec, plan) for spec in SPECS]
    if ctx.peers:
        candidates = [arm for arm in candidates if arm.name in ctx.peers]
    with contextlib.ExitStack() as stack:
        arms: list[Arm] = []
        for arm in candidates:
            try:
                arm.open(stack)
                arms.append(arm)
            except Exception as exc:  # a peer that cannot be installed is reported, not fatal
                ctx.log(f"peers {arm.name} failed: {exc}")
                rows.append(_error(arm, exc))
        # Interleaved: every arm runs each configuration close in time to the others, since
        # the load from other work on the machine drifts over minutes.
        for round_ in range(1, plan["rounds"] + 1):
            steps: list[tuple[Arm, Callable[[], list[dict[str, Any]]]]] = [
                (arm, partial(arm.noop, workers)) for workers in plan["workers"] for arm in arms
            ]
            steps += [(arm, arm.sleep) for arm in arms]
            steps += [(arm, arm.limits) for arm in arms if isinstance(arm, ExternalArm)]
            for arm, step in steps:
                try:
                    found = step()
                except Exception as exc:  # a peer that cannot run is reported, not fatal
                    ctx.log(f"peers {arm.name} failed: {exc}")
                    found = [_error(arm, exc)]
                rows.extend({"round": round_, **row} for row in found)
    recorder = ctx.recorder(NAME)
    recorder.params(
        {
            **plan,
            "procrastinate_pool_per_process": 4,
            "pgqueuer_driver": "asyncpg " + version("asyncpg"),
        }
    )
    recorder.table(NAME, rows)
