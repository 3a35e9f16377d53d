"""The `helm test` Pod's script, run here as rendered, against a real PostgreSQL and a local
metrics endpoint: it passes on a migrated database that serves the metric, and fails (with a
message saying why) on an unmigrated database or a metrics endpoint without the metric."""

from __future__ import annotations

import contextlib
import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from chartkit import Helm, one

import leaseq
from leaseq_operator.metrics import OperatorMetrics
from support import net


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        pass


@contextlib.contextmanager
def serving(body: bytes) -> Iterator[str]:
    """A local /metrics endpoint answering ``body``; yields its URL."""
    handler = type("Handler", (_Metrics,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        thread.join()


@pytest.fixture
def metrics_url() -> Iterator[str]:
    """A /metrics endpoint serving one operator sample."""
    with serving(b'leaseq_queue_jobs{state="ready"} 0\n') as url:
        yield url


def hook_script(helm: Helm) -> str:
    pod = one(helm.render(), "Pod", "test")
    script: str = pod["spec"]["containers"][0]["args"][0]
    return script


def run_script(script: str, url: str, *targets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *targets],
        env={"LEASEQ_DATABASE_URL": url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )


def test_passes_on_a_migrated_database(helm: Helm, database_url: str, metrics_url: str) -> None:
    proc = run_script(hook_script(helm), database_url, f"{metrics_url} leaseq_queue_jobs")
    assert proc.returncode == 0, proc.stderr
    assert "leaseq schema present" in proc.stdout


def test_fails_without_the_schema(helm: Helm, empty_database_url: str) -> None:
    proc = run_script(hook_script(helm), empty_database_url)
    assert proc.returncode != 0
    assert "did the migration run?" in proc.stderr


def test_fails_on_help_and_type_lines_without_a_sample(helm: Helm, database_url: str) -> None:
    body = b"# HELP leaseq_queue_jobs Jobs by queue and state\n# TYPE leaseq_queue_jobs gauge\n"
    with serving(body) as url:
        proc = run_script(hook_script(helm), database_url, f"{url} leaseq_queue_jobs")
    assert proc.returncode != 0, proc.stdout
    assert "answered without leaseq_queue_jobs samples" in proc.stderr


def test_fails_without_the_metric(helm: Helm, database_url: str, metrics_url: str) -> None:
    proc = run_script(hook_script(helm), database_url, f"{metrics_url} leaseq_jobs_claimed_total")
    assert proc.returncode != 0
    assert "answered without leaseq_jobs_claimed_total" in proc.stderr


def test_passes_on_an_idle_release_scaled_to_zero(helm: Helm, database_url: str) -> None:
    """The real operator metrics of an idle release (no job, no worker, the pool at 0): the
    WorkerPool's queues are exported at 0, so the hook finds its samples (issue 17)."""
    objects = helm.render(sets={"worker.pool.minReplicas": "0"})
    [pool] = [o for o in objects if o["kind"] == "WorkerPool"]
    metrics = OperatorMetrics()
    port = net.free_port()
    with leaseq.open_pool(database_url, timeout=5) as db:
        metrics.watch_queues(leaseq.Queue(db), leaseq.Workers(db))
        metrics.known_queues(tuple(pool["spec"]["queues"]))  # what the pool's first tick does
        metrics.serve(port, "127.0.0.1")
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            proc = run_script(hook_script(helm), database_url, f"{url} leaseq_queue_jobs")
        finally:
            metrics.close()
    assert proc.returncode == 0, proc.stderr
    assert "leaseq_queue_jobs samples" in proc.stdout
