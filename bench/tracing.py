"""What tracing costs a worker: CPU per no-op job of a real ``leaseq worker`` process with
tracing off (the code before tracing existed, from another checkout: ``--off-tree``), with the
OpenTelemetry API only (no SDK: every span a no-op), and with the SDK exporting every span
over OTLP/HTTP to a receiver on loopback that answers and discards.

Each run: a fresh database migrated by the code under test, ``--jobs`` no-op jobs enqueued
(outside any span: a traced run's first attempts are roots), one worker started, the run
over when the database says every job succeeded; the worker is stopped with SIGTERM and its
CPU (user + system, from ``wait4``, start-up included) divided by the jobs. Numbers only,
never asserted::

    python -m bench.tracing --url postgresql://postgres@127.0.0.1:5432/postgres \\
        --off-tree /path/to/checkout/before/tracing
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parents[1]
ENQUEUE = (
    "import sys, leaseq\n"
    "with leaseq.connect(sys.argv[1], action='enqueue') as c:\n"
    "    q = leaseq.Queue(c)\n"
    "    n = int(sys.argv[2])\n"
    "    for i in range(0, n, 500):\n"
    "        q.enqueue_many([leaseq.JobSpec('bench', 'noop') for _ in range(min(500, n - i))])\n"
)


@contextmanager
def sink() -> Iterator[str]:
    """An OTLP/HTTP endpoint on loopback that reads each export and answers 200."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def fresh_database(url: str) -> Iterator[str]:
    name = f"bench_tracing_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(url, dbname=name)
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def _env(tree: Path, extra: dict[str, str]) -> dict[str, str]:
    paths = [str(tree / d) for d in ("worker", "operator", "sql")] + [str(ROOT)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**env, "PYTHONPATH": os.pathsep.join(paths), **extra}


def run(url: str, tree: Path, jobs: int, otel: dict[str, str]) -> dict[str, float]:
    """One run of ``tree``'s worker on ``jobs`` no-op jobs; its CPU and wall time per job."""
    with fresh_database(url) as db:
        env = _env(tree, otel)
        py = sys.executable
        subprocess.run(
            [py, "-m", "leaseq.cli", "migrate", "--database-url", db],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run([py, "-c", ENQUEUE, db, str(jobs)], env=env, check=True)
        started = time.perf_counter()
        worker = subprocess.Popen(
            [
                py, "-m", "leaseq.cli", "worker", "--database-url", db,
                "--app", "bench.apps:registry", "--queue", "bench", "--concurrency", "4",
                "--worker-id", "bench", "--metrics-port", "0", "--log-level", "WARNING",
                "--lead", "false",
            ],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        with psycopg.connect(db, autocommit=True) as c:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and worker.poll() is None:
                row = c.execute(
                    "SELECT count(*) FROM leaseq.jobs WHERE status <> 'succeeded'"
                ).fetchone()
                if row is not None and row[0] == 0:
                    break
                time.sleep(0.05)
        seconds = time.perf_counter() - started
        worker.send_signal(signal.SIGTERM)
        _, status, usage = os.wait4(worker.pid, 0)
        worker.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return {"cpu_us_per_job": cpu / jobs * 1e6, "wall_us_per_job": seconds / jobs * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a server's URL (databases made there)")
    parser.add_argument("--off-tree", type=Path, help="a checkout from before tracing")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    conninfo_to_dict(args.url)  # a bad URL fails here, before any database is made
    with sink() as endpoint:
        sdk = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": "bench",
        }
        modes: list[tuple[str, Path, dict[str, str]]] = [
            ("api-only", ROOT, {}),
            ("sdk-otlp", ROOT, sdk),
        ]
        if args.off_tree is not None:
            modes.insert(0, ("off", args.off_tree, {}))
        print("mode,round,jobs,cpu_us_per_job,wall_us_per_job")
        # Interleaved rounds: a drift of the machine's load touches every mode alike.
        for i in range(args.rounds):
            for name, tree, otel in modes:
                r = run(args.url, tree, args.jobs, otel)
                print(
                    f"{name},{i + 1},{args.jobs},{r['cpu_us_per_job']:.0f},"
                    f"{r['wall_us_per_job']:.0f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
