"""Slow jobs into idle workers: from enqueue to the handler's start (issue 19: p99 at most
10 ms), for each queue's own worker runtime at its defaults.

W worker processes of one runtime wait, idle: ``leaseq worker`` processes (one slot each, its
default), pgqueuer's QueueManager (its default batch of 10) and procrastinate's worker (its
default concurrency of 1). A producer enqueues one job at a time, ``gap`` seconds apart,
longer than a job's ``job_seconds`` of work, so an idle worker is always there when the next
job arrives. Each handler's first act is to append its job's reference and the wall-clock
time to a file (:func:`bench.apps.record_start`); a job's latency runs from just before the
producer's enqueue call (its commit and notification included) to that time. Each runtime's
first ``2 * W`` jobs warm it up (connections, prepared statements, listeners) and are not
counted. Every runtime runs in each of ``rounds`` rounds, in alternating order; each row says
the machine's load average when it started. The fallback poll is 1 s for leaseq and pgqueuer
(as in the no-op runs); procrastinate's worker listens with its defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import leaseq
from bench import peers
from bench import runtime as worker_runtime
from bench.context import Context
from bench.env import reset_leaseq, scratch_database
from bench.gang import run_gang
from bench.noop import QUEUE, NoopArgs
from bench.stats import ms, percentile

NAME = "start"
#: How long one run may wait for its jobs' handlers to start before it gives up.
WAIT_SECONDS = 60.0


@dataclass(frozen=True)
class Plan:
    """One runtime's run: processes, counted jobs, seconds between enqueues, a job's work."""

    workers: int
    jobs: int
    gap: float
    job_seconds: float

    @property
    def warmup(self) -> int:
        return 2 * self.workers


def _starts(path: Path) -> dict[int, float]:
    """The references and start times the handlers have written so far."""
    found: dict[int, float] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            ref, at = line.split()
            found[int(ref)] = float(at)
    return found


def _wait_started(path: Path, refs: range) -> dict[int, float]:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        found = _starts(path)
        if all(ref in found for ref in refs) or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def _produce(enqueue: Callable[[int], object], plan: Plan, path: Path) -> list[float]:
    """Warm up, then enqueue ``plan.jobs`` jobs one at a time: each one's latency (s)."""
    for ref in range(plan.warmup):
        enqueue(ref)
        time.sleep(plan.gap)
    _wait_started(path, range(plan.warmup))
    enqueued: dict[int, float] = {}
    for ref in range(plan.warmup, plan.warmup + plan.jobs):
        enqueued[ref] = time.time()
        enqueue(ref)
        time.sleep(plan.gap)
    started = _wait_started(path, range(plan.warmup, plan.warmup + plan.jobs))
    return [started[ref] - at for ref, at in enqueued.items() if ref in started]


def _payload(ref: int, path: Path, plan: Plan) -> dict[str, Any]:
    return {"ref": ref, "file": str(path), "seconds": plan.job_seconds}


# -- the three runtimes --------------------------------------------------------------------


def _leaseq(url: str, plan: Plan, path: Path) -> list[float]:
    reset_leaseq(url)
    with (
        worker_runtime.running_workers(url, plan.workers, concurrency=1),
        leaseq.connect(url, action="bench") as conn,
    ):
        queue = leaseq.Queue(conn)
        return _produce(
            lambda ref: queue.enqueue(QUEUE, "stamp", _payload(ref, path, plan)),
            plan,
            path,
        )


def _peer(
    name: str, url: str, plan: Plan, path: Path,
    enqueue: Callable[[Any, int], Coroutine[Any, Any, object]],
    opened: Callable[[], Coroutine[Any, Any, Any]],
) -> list[float]:  # fmt: skip
    """A peer's own worker runtime (the one the peers' no-op runs use, at its default) in
    child processes, this process producing on ``opened()``'s handle."""
    latencies: list[float] = []
    worker = {"pgqueuer": peers.pgqueuer_noop_worker,
              "procrastinate": peers.procrastinate_noop_worker}[name]  # fmt: skip
    args = [NoopArgs(url, f"s{i}", peers.DEFAULTS[name]) for i in range(plan.workers)]
    with asyncio.Runner() as runner:
        handle = runner.run(opened())

        def produce() -> bool:
            latencies.extend(_produce(lambda ref: runner.run(enqueue(handle, ref)), plan, path))
            return True

        try:
            run_gang(worker, args, until=produce)
        finally:
            runner.run(handle.close())
    return latencies


def _pgqueuer(url: str, plan: Plan, path: Path) -> list[float]:
    import asyncpg
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def opened() -> Any:
        conn = await asyncpg.connect(**peers.asyncpg_kwargs(url))
        await conn.execute("TRUNCATE pgqueuer")
        return conn

    async def enqueue(conn: Any, ref: int) -> None:
        payload = json.dumps(_payload(ref, path, plan)).encode()
        await Queries(AsyncpgDriver(conn)).enqueue("stamp", payload, 0)

    return _peer("pgqueuer", url, plan, path, enqueue, opened)


class _ProcrastinateProducer:
    def __init__(self, url: str) -> None:
        self.app = peers.procrastinate_app(url, pool=1)

    async def open(self) -> _ProcrastinateProducer:
        await self.app.open_async()
        await self.app.connector.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")
        return self

    async def close(self) -> None:
        await self.app.close_async()


def _procrastinate(url: str, plan: Plan, path: Path) -> list[float]:
    async def opened() -> Any:
        return await _ProcrastinateProducer(url).open()

    async def enqueue(producer: Any, ref: int) -> None:
        await producer.app.tasks["stamp"].defer_async(**_payload(ref, path, plan))

    return _peer("procrastinate", url, plan, path, enqueue, opened)


RUNTIMES: dict[str, tuple[Callable[[str, Plan, Path], list[float]], str]] = {
    worker_runtime.IMPLEMENTATION: (_leaseq, "leaseq"),
    "pgqueuer": (_pgqueuer, "pgqueuer"),
    "procrastinate": (_procrastinate, "procrastinate"),
}


def measure(name: str, url: str, plan: Plan) -> dict[str, Any]:
    """One runtime's run on a database where it is installed: one CSV row."""
    run, package = RUNTIMES[name]
    load = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="leaseq-bench-start-") as folder:
        latencies = run(url, plan, Path(folder) / "starts")
    return {
        "implementation": name,
        "version": peers.version(package),
        "workers": plan.workers,
        "default_batch": peers.DEFAULTS[name],
        "jobs": plan.jobs,
        "started": len(latencies),
        "gap_s": plan.gap,
        "job_seconds": plan.job_seconds,
        "start_p50_ms": ms(percentile(latencies, 50)),
        "start_p99_ms": ms(percentile(latencies, 99)),
        "start_max_ms": ms(max(latencies, default=float("nan"))),
        "loadavg": load,
    }


def run(ctx: Context) -> None:
    rounds, plan = (1, Plan(2, 8, 0.1, 0.02)) if ctx.quick else (2, Plan(4, 60, 0.15, 0.05))
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        for name in RUNTIMES:
            url = stack.enter_context(scratch_database(ctx.server_url, f"start_{name[:8]}"))
            try:
                if name == "pgqueuer":
                    peers.Pgqueuer().install(url)
                elif name == "procrastinate":
                    peers.Procrastinate().install(url)
                urls[name] = url
            except Exception as exc:  # a peer that cannot be installed is reported, not fatal
                ctx.log(f"start {name} failed: {exc}")
                rows.append({"implementation": name, "error": f"{type(exc).__name__}: {exc}"})
        for round_ in range(1, rounds + 1):
            order = list(urls) if round_ % 2 else list(reversed(urls))
            for name in order:
                try:
                    row = measure(name, urls[name], plan)
                except Exception as exc:  # a peer that cannot run is reported, not fatal
                    ctx.log(f"start {name} failed: {exc}")
                    row = {"implementation": name, "error": f"{type(exc).__name__}: {exc}"}
                else:
                    ctx.log(
                        f"start {name}: p50 {row['start_p50_ms']} ms, p99 {row['start_p99_ms']} ms"
                    )
                rows.append({"round": round_, **row})
    recorder = ctx.recorder(NAME)
    recorder.params({"rounds": rounds, **vars(plan)})
    recorder.table(NAME, rows)
