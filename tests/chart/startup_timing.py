"""Measure how long each component's startup probe would fail after its process starts.

    python tests/chart/startup_timing.py postgresql://postgres@127.0.0.1:5432/postgres [runs]

For the operator, the console and the worker it starts the process as its chart pod does
(``leaseq operator`` / ``console`` / ``worker`` with the chart's environment, the demo app for
the worker, the operator against the test suite's API emulator) and polls the path its
startupProbe gets every 20 ms, printing the seconds from process start to the first 200
answer, every import compiled from source (before it: connection refused, or 500/503 while
the server listens but start-up is not done; each such kubelet attempt is a
``Warning Unhealthy`` Event). Numbers, not a test:
tests/chart/test_chart_lifecycle.py keeps the largest as STARTUP_PROBE_PASSES_AFTER.
The database named must let the script create and drop a database of its own.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import yaml
from psycopg import sql
from psycopg.conninfo import make_conninfo

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "k8s")]

import leaseq  # noqa: E402
from leaseq.core.schema import ConsoleRole  # noqa: E402
from support.net import free_port  # noqa: E402

DEADLINE = 60.0


def first_ok(process: subprocess.Popen[bytes], url: str, started: float) -> float:
    """Seconds from ``started`` to the first 200 from ``url``."""
    while time.monotonic() - started < DEADLINE:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url}: no 200 within {DEADLINE} s")


def timed(argv: list[str], env: dict[str, str], url: str) -> float:
    """Seconds to the first 200, imports compiled from source: the pycache prefix is an
    empty directory nothing is written to, as in an image whose venv may hold no bytecode
    (it sets PYTHONDONTWRITEBYTECODE, and its root filesystem is read-only)."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "leaseq.cli", *argv],
        env={
            **os.environ,
            **env,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPYCACHEPREFIX": tempfile.mkdtemp(prefix="no-bytecode-"),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return first_ok(process, url, started)
    finally:
        process.terminate()
        process.wait(30)


@contextmanager
def database(admin_url: str) -> Iterator[tuple[str, str]]:
    """A migrated database of its own and a console login role: (owner URL, console URL)."""
    name, role = f"lq_startup_{uuid.uuid4().hex[:8]}", f"lq_console_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    url = make_conninfo(admin_url, dbname=name)
    try:
        with leaseq.connect(url, action="measure") as conn:
            leaseq.migrate(conn, console=ConsoleRole(role, admin=True))
        yield url, make_conninfo(url, user=role)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def main(admin_url: str, runs: int) -> None:
    from emulator import CRD_PATH, leaseq_server

    times: dict[str, list[float]] = {"operator": [], "console": [], "worker": []}
    with (
        database(admin_url) as (url, console_url),
        tempfile.TemporaryDirectory() as tmp,
        leaseq_server(yaml.safe_load(CRD_PATH.read_text())) as server,
    ):
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "e", "cluster": {"server": server.url}}],
                    "users": [{"name": "e", "user": {}}],
                    "contexts": [{"name": "e", "context": {"cluster": "e", "user": "e"}}],
                    "current-context": "e",
                }
            )
        )
        for _ in range(runs):
            health, metrics = free_port(), free_port()
            times["operator"].append(
                timed(
                    ["operator"],
                    {
                        "KUBECONFIG": str(kubeconfig),
                        "LEASEQ_DATABASE_URL": url,
                        "LEASEQ_NAMESPACE": "default",
                        "LEASEQ_OPERATOR_ID": f"measure-{uuid.uuid4().hex[:6]}",
                        "LEASEQ_HEALTH_PORT": str(health),
                        "LEASEQ_METRICS_PORT": str(metrics),
                        "LEASEQ_METRICS_ADDRESS": "127.0.0.1",
                    },
                    f"http://127.0.0.1:{health}/healthz",
                )
            )
            port = free_port()
            times["console"].append(
                timed(
                    ["console"],
                    {
                        "LEASEQ_DATABASE_URL": console_url,
                        "LEASEQ_CONSOLE_ADDRESS": "127.0.0.1",
                        "LEASEQ_CONSOLE_PORT": str(port),
                    },
                    f"http://127.0.0.1:{port}/healthz",
                )
            )
            port = free_port()
            times["worker"].append(
                timed(
                    ["worker"],
                    {
                        "LEASEQ_DATABASE_URL": url,
                        "LEASEQ_APP": "leaseq.demo.app:registry",
                        "LEASEQ_QUEUES": "default",
                        "LEASEQ_LEAD": "false",
                        "LEASEQ_METRICS_PORT": str(port),
                        "LEASEQ_METRICS_ADDRESS": "127.0.0.1",
                    },
                    f"http://127.0.0.1:{port}/readyz",
                )
            )
    for component, seconds in times.items():
        print(
            f"{component}: min {min(seconds):.2f} s, median {statistics.median(seconds):.2f} s, "
            f"max {max(seconds):.2f} s over {len(seconds)} starts"
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
