"""Scenario (issue 60): how late a durable sleep wakes and how soon a signal resumes its job,
leaseq beside DBOS Transact, and what an idle worker costs the database per second.

leaseq: one ``leaseq worker`` (``bench.apps``, ``--concurrency 4``, its default poll of 5 s,
LISTEN on). The load: ``sparse`` jobs, one at a time, each sleeping ``seconds`` once
(``ctx.sleep``: the job is handed back and claimed again at its wake time), so the worker is
idle while each sleeps; ``sleepers`` jobs enqueued ``gap`` seconds apart, each sleeping
``seconds`` once, so about ``seconds / gap`` sleep at once and enqueues keep waking the
worker; then ``signals`` jobs, one at a time, each waiting (``ctx.wait_for``) for a signal
the producer sends ``pause`` seconds after the job shows it waits. A sleep's lateness runs from the
handler's wall-clock time before the sleep (a step, so the attempt after the wake reads it
back) plus the sleep, to the code after the sleep running; a signal's round trip from the
sender's wall-clock time, carried in the signal, to the code after the wait running.

DBOS: the same load in one DBOS process (its workflows run in the process that starts them,
DBOS's usual shape): ``DBOS.sleep`` and ``DBOS.send`` / ``DBOS.recv``, in its own virtual
environment (:mod:`bench.external`); reported as unavailable, with the reason, when it
cannot be installed.

Idle: committed transactions per second in a database of its own
(``pg_stat_database.xact_commit``: every statement the worker runs, its claims, heartbeats,
registry and leader lease, and the server's own) and the worker's claims per second (its
``leaseq_claim_latency_seconds`` count) while it has nothing to run, after a warm-up that
lets its idle poll back off to its cap; once with no job at all and once with
``far_sleepers`` jobs asleep for an hour (their wake times must not make a worker poll).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

import leaseq
from bench import external
from bench import runtime as worker_runtime
from bench.context import Context
from bench.env import reset_leaseq, scratch_database
from bench.noop import QUEUE
from bench.stats import loadavg, ms, percentile

NAME = "wakes"
#: How long the harness waits for one phase's handlers to record before it gives up.
WAIT_SECONDS = 120.0
#: The worker's poll interval: leaseq's default.
POLL_SECONDS = 5.0
#: Idle, a worker's poll backs off from 0.5 s to POLL_SECONDS within 2 * POLL_SECONDS.
WARMUP_SECONDS = 2 * POLL_SECONDS


@dataclass(frozen=True)
class Plan:
    sparse: int
    sleepers: int
    seconds: float
    gap: float
    signals: int
    pause: float
    idle_seconds: float
    far_sleepers: int

    def load(self) -> str:
        return (
            f"{self.sparse} sleeps of {self.seconds:g} s one at a time (sparse); "
            f"{self.sleepers} sleeps of {self.seconds:g} s started {self.gap:g} s apart "
            f"(~{self.seconds / self.gap:.0f} asleep at once); {self.signals} signals one at "
            f"a time, each {self.pause:g} s after its job waits; nothing else running"
        )


def _recorded(path: Path) -> dict[int, float]:
    found: dict[int, float] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            ref, value = line.split()
            found[int(ref)] = float(value)
    return found


def _wait_recorded(path: Path, count: int) -> list[float]:
    deadline = time.monotonic() + WAIT_SECONDS
    while len(found := _recorded(path)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(found)} of {count} handlers recorded in {path}")
        time.sleep(0.02)
    return list(found.values())


def _wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.005)


def _commits(conn: psycopg.Connection[Any]) -> int:
    """Transactions committed in this database so far (the snapshot cleared first)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


Samples = dict[str, list[float]]


def measure(url: str, plan: Plan, folder: Path) -> Samples:
    """The sleeps' lateness and the signals' round trips."""
    reset_leaseq(url)
    extra = ["--poll-seconds", str(POLL_SECONDS)]
    with (
        worker_runtime.running_workers(url, 1, concurrency=4, extra=extra),
        leaseq.connect(url, action="bench") as conn,
    ):
        queue = leaseq.Queue(conn)
        sparse = folder / "sparse"
        for ref in range(plan.sparse):
            queue.enqueue(QUEUE, "nap", {"ref": ref, "file": str(sparse), "seconds": plan.seconds})
            _wait_until(lambda r=ref: len(_recorded(sparse)) > r, "a sleeper to wake")
        alone = list(_recorded(sparse).values())

        naps = folder / "naps"
        for ref in range(plan.sleepers):
            payload = {"ref": ref, "file": str(naps), "seconds": plan.seconds}
            queue.enqueue(QUEUE, "nap", payload)
            time.sleep(plan.gap)
        late = _wait_recorded(naps, plan.sleepers)

        trips = folder / "trips"
        for ref in range(plan.signals):
            job_id = queue.enqueue(QUEUE, "await_go", {"ref": ref, "file": str(trips)}).job_id
            _wait_until(lambda j=job_id: queue.get(j).waiting_for == "go", "a job to wait")
            time.sleep(plan.pause)
            queue.signal(job_id, "go", {"sent": time.time()})
            _wait_until(lambda r=ref: len(_recorded(trips)) > r, "a signalled job to resume")
        trip = list(_recorded(trips).values())

    return {"sleep_late_sparse": alone, "sleep_late_busy": late, "signal_trip": trip}


def _claims(port: int) -> float:
    """The claims the worker serving metrics on ``port`` has made."""
    return max(worker_runtime.claim_buckets(port).values(), default=0.0)


def _idle_row(url: str, port: int, case: str, seconds: float) -> dict[str, Any]:
    """Committed transactions per second in the database, and the worker's claims per
    second, over ``seconds`` (the statistics are flushed at most a second late: the window
    is long against that)."""
    with psycopg.connect(url, autocommit=True) as conn:
        before, claims, start = _commits(conn), _claims(port), time.monotonic()
        time.sleep(seconds)
        after, elapsed = _commits(conn), time.monotonic() - start
        claims = _claims(port) - claims
    return {
        "case": case,
        "seconds": seconds,
        # Less the probe's own first read.
        "xact_per_s": round((after - before - 1) / elapsed, 2),
        "claims_per_s": round(claims / elapsed, 3),
    }


def _idle(url: str, plan: Plan, folder: Path) -> list[dict[str, Any]]:
    """An idle worker in a database of its own (no earlier job, so no vacuum of one in the
    window): with no job, then with ``far_sleepers`` jobs asleep for an hour."""
    extra = ["--poll-seconds", str(POLL_SECONDS)]
    with (
        worker_runtime.running_workers(url, 1, concurrency=4, extra=extra) as workers,
        leaseq.connect(url, action="bench") as conn,
    ):
        [port] = workers.ports
        time.sleep(WARMUP_SECONDS)
        rows = [_idle_row(url, port, "no job", plan.idle_seconds)]
        queue = leaseq.Queue(conn)
        far = folder / "far"
        ids = [
            queue.enqueue(QUEUE, "nap", {"ref": r, "file": str(far), "seconds": 3600}).job_id
            for r in range(plan.far_sleepers)
        ]
        _wait_until(
            lambda: all(len(queue.attempts(i)) == 1 for i in ids), "the far sleepers to sleep"
        )
        time.sleep(WARMUP_SECONDS)
        case = f"{plan.far_sleepers} jobs asleep for 1 h"
        rows.append(_idle_row(url, port, case, plan.idle_seconds))
    return rows


def _dbos(server_url: str, plan: Plan) -> Samples:
    spec = next(s for s in external.SPECS if s.name == "dbos")
    python = external.ensure_venv(spec)
    with scratch_database(server_url, "wakes_dbos", migrate=False) as url:
        config = {
            "peer": "dbos",
            "url": url,
            "sparse": plan.sparse,
            "sleepers": plan.sleepers,
            "seconds": plan.seconds,
            "gap": plan.gap,
            "signals": plan.signals,
            "pause": plan.pause,
        }
        out = external.call(python, "wakes", config)
    found: Samples = json.loads(out.strip().splitlines()[-1])
    return found


def table_rows(runtime: str, found: Samples, load: float) -> list[dict[str, Any]]:
    rows = []
    for measure, values in found.items():
        rows.append(
            {
                "runtime": runtime,
                "measure": measure,
                "n": len(values),
                "p50_ms": round(ms(percentile(values, 50)), 1),
                "p95_ms": round(ms(percentile(values, 95)), 1),
                "max_ms": round(ms(max(values)), 1),
                "load_1m": load,
            }
        )
    return rows


def run(ctx: Context) -> None:
    plan = Plan(
        sparse=10 if ctx.quick else 30,
        sleepers=30 if ctx.quick else 100,
        seconds=1.0,
        gap=0.1,
        signals=30 if ctx.quick else 100,
        pause=0.2,
        idle_seconds=20.0 if ctx.quick else 60.0,
        far_sleepers=100,
    )
    rows: list[dict[str, Any]] = []
    load = loadavg()
    with (
        scratch_database(ctx.server_url, "wakes") as url,
        tempfile.TemporaryDirectory(prefix="leaseq-wakes-") as folder,
    ):
        found = measure(url, plan, Path(folder))
    with (
        scratch_database(ctx.server_url, "wakes_idle") as url,
        tempfile.TemporaryDirectory(prefix="leaseq-wakes-") as folder,
    ):
        idle = _idle(url, plan, Path(folder))
    rows += table_rows(worker_runtime.IMPLEMENTATION, found, load)
    load = loadavg()
    try:
        rows += table_rows("dbos", _dbos(ctx.server_url, plan), load)
    except (external.PeerUnavailable, RuntimeError) as exc:
        ctx.log(f"wakes: DBOS not measured: {exc}")
        rows.append({"runtime": "dbos", "measure": f"not measured: {exc}"})
    for r in rows:
        ctx.log(f"wakes {r['runtime']} {r['measure']}: p50 {r.get('p50_ms')} ms, "
                f"p95 {r.get('p95_ms')} ms")  # fmt: skip
    for r in idle:
        ctx.log(f"wakes idle ({r['case']}): {r['xact_per_s']} transactions/s, "
                f"{r['claims_per_s']} claims/s")  # fmt: skip
    recorder = ctx.recorder(NAME)
    recorder.params({"load": plan.load(), "worker_concurrency": 4, "poll_seconds": POLL_SECONDS})
    recorder.table(NAME, rows)
    recorder.table(f"{NAME}_idle", idle)
