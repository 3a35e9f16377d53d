"""Real ``leaseq worker`` processes under the benchmarks' workloads: the runtime users run.

W worker processes (``leaseq worker --app bench.apps:registry``) start, register, and are
then stopped (SIGSTOP) while the jobs are enqueued, so none starts early. The run lasts from
their SIGCONT until the database says no job is left unfinished (polled, as for the peers).
CPU per job is read from /proc for the worker processes (all their threads) and for the
server's processes over the same interval. The database's own timestamps give the span from
the first claim to the last completion; claim latency comes from the workers' own
``leaseq_claim_latency_seconds`` histograms (interpolated within buckets).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families

import leaseq
from bench.env import reset_leaseq
from bench.gang import machine_cpu_seconds, process_cpu_seconds, server_cpu_meter
from bench.noop import QUEUE
from bench.stats import ms

ROOT = Path(__file__).resolve().parents[1]
APP = "bench.apps:registry"
IMPLEMENTATION = "leaseq worker"
GUARANTEES = (
    "the runtime: lease with expiry and fencing token per claim, heartbeats past one "
    "interval, attempt row (and an effect row for keyed jobs) written by the completing "
    "statement; claims fill "
    "free slots in one statement, results within 2 ms share one complete_many commit, and "
    "a result is durable before the slot is reused"
)


@dataclass(frozen=True)
class RuntimeRun:
    """What one run measured: wall seconds, the database's span, CPU seconds, and the
    workers' claim latency histogram (upper bound -> cumulative count)."""

    seconds: float
    db_seconds: float
    client_cpu: float
    server_cpu: float | None
    machine_cpu: float
    finished: int
    executions: int
    claim_buckets: dict[float, float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(
    url: str, worker_id: str, concurrency: int, port: int, logdir: Path, extra: Sequence[str]
) -> Any:
    cmd = [
        sys.executable, "-m", "leaseq.cli", "worker",
        "--app", APP, "--queue", QUEUE,
        "--worker-id", worker_id,
        "--concurrency", str(concurrency),
        "--metrics-port", str(port),
        "--poll-seconds", "1",
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "LEASEQ_DATABASE_URL": url}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    log = (logdir / f"{worker_id}.log").open("wb")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


@dataclass(frozen=True)
class Workers:
    """Running ``leaseq worker`` processes and the ports their metrics are served on."""

    procs: list[Any]
    ports: list[int]


@contextmanager
def running_workers(
    url: str, count: int, concurrency: int, extra: Sequence[str] = ()
) -> Iterator[Workers]:
    """``count`` real worker processes (``w1``, ``w2``, ...), with the options ``extra``
    after the harness's own, each registered in
    leaseq.workers before this yields; on exit each is sent SIGCONT (in case it was stopped)
    and SIGTERM, and reaped (killed if it has not exited within 30 s)."""
    with tempfile.TemporaryDirectory(prefix="leaseq-bench-") as logdir:
        ports = [_free_port() for _ in range(count)]
        procs = [
            _start(url, f"w{i + 1}", concurrency, port, Path(logdir), extra)
            for i, port in enumerate(ports)
        ]
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                deadline = time.monotonic() + 120.0
                while _state(conn, "SELECT count(*) FROM leaseq.workers") < count:
                    if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                        tail = (Path(logdir) / "w1.log").read_text()[-2000:]
                        raise RuntimeError(f"workers did not start: {tail}")
                    time.sleep(0.05)
            yield Workers(procs, ports)
        finally:
            for p in procs:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def claim_buckets(port: int) -> dict[float, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "leaseq_claim_latency_seconds_bucket":
                found[float(s.labels["le"])] = s.value
    return found


def histogram_percentile(buckets: dict[float, float], p: float) -> float:
    """The p-th percentile of a cumulative histogram, linear within the bucket it falls in."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if not total:
        return float("nan")
    rank, low, below = total * p / 100.0, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return low
            inside = buckets[bound] - below
            return low + (bound - low) * ((rank - below) / inside if inside else 1.0)
        low, below = bound, buckets[bound]
    return low


def _state(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    return row[0] if row else None


def run_workers(
    url: str,
    *,
    jobs: int,
    workers: int,
    concurrency: int,
    job_type: str = "noop",
    payload: Any = None,
    cap_seconds: float = 120.0,
) -> RuntimeRun:
    """Enqueue ``jobs`` jobs of ``job_type`` and drain them with ``workers`` real workers."""
    reset_leaseq(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE leaseq.workers")
        with running_workers(url, workers, concurrency) as running:
            procs = running.procs
            for p in procs:
                p.send_signal(signal.SIGSTOP)
            queue = leaseq.Queue(conn)
            for start in range(0, jobs, 1000):
                count = min(1000, jobs - start)
                queue.enqueue_many(leaseq.JobSpec(QUEUE, job_type, payload) for _ in range(count))
            conn.execute("VACUUM ANALYZE leaseq.jobs")
            meter = server_cpu_meter(url)
            cpu0 = {p.pid: process_cpu_seconds(p.pid) for p in procs}
            machine0 = machine_cpu_seconds()
            server0 = meter() if meter else 0.0
            t0 = time.perf_counter()
            for p in procs:
                p.send_signal(signal.SIGCONT)
            unfinished = (
                "SELECT EXISTS (SELECT 1 FROM leaseq.jobs WHERE status = 'pending')"
                " OR EXISTS (SELECT 1 FROM leaseq.jobs WHERE status = 'running')"
            )
            while _state(conn, unfinished) and time.perf_counter() - t0 < cap_seconds:
                time.sleep(0.02)
            seconds = time.perf_counter() - t0
            client = sum(process_cpu_seconds(p.pid) - cpu0[p.pid] for p in procs)
            machine = machine_cpu_seconds() - machine0
            server = meter() - server0 if meter else None
            claims: dict[float, float] = {}
            for port in running.ports:
                for bound, seen in claim_buckets(port).items():
                    claims[bound] = claims.get(bound, 0.0) + seen
        finished = _state(conn, "SELECT count(*) FROM leaseq.jobs WHERE status = 'succeeded'")
        span = _state(
            conn,
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8"
            "  FROM leaseq.jobs WHERE status = 'succeeded'",
        )
        executions = _state(conn, "SELECT count(*) FROM leaseq.job_attempts")
    return RuntimeRun(seconds, span or 0.0, client, server, machine, finished, executions, claims)


def noop_row(run: RuntimeRun, *, workers: int, concurrency: int, jobs: int) -> dict[str, Any]:
    """A no-op row with the peers' columns (``batch`` is the worker's concurrency)."""
    per = 1000.0 / max(run.finished, 1)
    return {
        "implementation": IMPLEMENTATION,
        "workers": workers,
        "batch": concurrency,
        "jobs": jobs,
        "finished": run.finished,
        "seconds": round(run.seconds, 4),
        "db_seconds": round(run.db_seconds, 4),
        "jobs_per_second": round(run.finished / run.seconds, 1),
        "client_cpu_ms_per_job": round(run.client_cpu * per, 3),
        "server_cpu_ms_per_job": "" if run.server_cpu is None else round(run.server_cpu * per, 3),
        "machine_cpu_ms_per_job": round(run.machine_cpu * per, 3),
        "claim_p50_ms": ms(histogram_percentile(run.claim_buckets, 50)),
    }


def sleep_row(run: RuntimeRun, *, workers: int, jobs: int, job_seconds: float) -> dict[str, Any]:
    """Scenario 1's workload through real workers (one slot each): efficiency from the
    database's timestamps, claim latency from the workers' histograms."""
    per = 1000.0 / max(run.finished, 1)
    return {
        "kind": "sleep",
        "implementation": IMPLEMENTATION,
        "workers": workers,
        "jobs": jobs,
        "job_seconds": job_seconds,
        "executions": run.executions,
        "duplicates": run.executions - run.finished,
        "unfinished": jobs - run.finished,
        "seconds": round(run.db_seconds, 4),
        "jobs_per_second": round(run.finished / run.db_seconds, 2) if run.db_seconds else "",
        "efficiency": round(jobs * job_seconds / workers / run.db_seconds, 4)
        if run.db_seconds
        else "",
        "claim_p50_ms": ms(histogram_percentile(run.claim_buckets, 50)),
        "claim_p99_ms": ms(histogram_percentile(run.claim_buckets, 99)),
        "client_cpu_ms_per_job": round(run.client_cpu * per, 3),
        "server_cpu_ms_per_job": "" if run.server_cpu is None else round(run.server_cpu * per, 3),
        "machine_cpu_ms_per_job": round(run.machine_cpu * per, 3),
    }
