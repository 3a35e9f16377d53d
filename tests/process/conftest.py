"""Real worker processes for the process tests: spawn, watch, signal, scrape."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

import leaseq
from support.polling import wait_for

HERE = Path(__file__).parent
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class WorkerProcess:
    worker_id: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample on /metrics, keyed by (name, sorted labels)."""
        status, text = self.get("/metrics")
        assert status == 200
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def serving(self) -> bool:
        try:
            return self.get("/healthz")[0] == 200
        except OSError:
            return False


@pytest.fixture
def spawn_worker(database_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``leaseq worker`` processes (apps:registry); killed at the end if still alive.
    Their logs are printed when a test fails."""
    started: list[WorkerProcess] = []

    def spawn(
        worker_id: str,
        *,
        queue: str = "q",
        concurrency: int = 1,
        lease: float = 1.0,
        heartbeat: float = 0.3,
        poll: float = 0.5,
        drain: float = 5.0,
        listen: bool = True,
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        port = free_port()
        log = tmp_path / f"{worker_id}.log"
        cmd = [
            sys.executable, "-m", "leaseq.cli", "worker",
            "--app", "apps:registry",
            "--queue", queue,
            "--concurrency", str(concurrency),
            "--lease-seconds", str(lease),
            "--heartbeat-seconds", str(heartbeat),
            "--poll-seconds", str(poll),
            "--drain-seconds", str(drain),
            "--listen", str(listen).lower(),
            "--worker-id", worker_id,
            "--metrics-port", str(port),
            "--log-level", "DEBUG",
        ]  # fmt: skip
        full_env = {
            **os.environ,
            "LEASEQ_DATABASE_URL": database_url,
            # Never an empty entry: that would put the checkout (with its operator/) first.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
            **(env or {}),
        }
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path
            )
        worker = WorkerProcess(worker_id, proc, port, log)
        started.append(worker)
        with leaseq.connect(database_url, action="test") as conn:
            queue = leaseq.Queue(conn)
            wait_for(
                lambda: (
                    proc.poll() is not None
                    or any(w.worker_id == worker_id for w in queue.workers())
                ),
                f"worker {worker_id} to register",
            )
        assert proc.poll() is None, log.read_text()
        wait_for(worker.serving, f"worker {worker_id} to serve HTTP")
        return worker

    yield spawn
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(timeout=10)
        print(f"----- {worker.worker_id} (exit {worker.proc.returncode}) -----")
        print(worker.log.read_text(errors="replace")[-20000:])


@pytest.fixture
def reaper(database_url: str) -> Iterator[list[leaseq.Reaped]]:
    """Run the reaper every 0.2 s (the operator's job in production), short retry backoff.
    Yields the list of everything it reaped."""
    reaped: list[leaseq.Reaped] = []
    stop = threading.Event()

    def loop() -> None:
        with leaseq.connect(database_url, action="reap") as conn:
            queue = leaseq.Queue(conn, retry=leaseq.RetryPolicy(base_seconds=0.1, cap_seconds=0.2))
            while not stop.wait(0.2):
                reaped.extend(queue.reap())

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield reaped
    stop.set()
    thread.join(timeout=5)


@pytest.fixture
def job_state(queue: leaseq.Queue) -> Callable[[int], Any]:
    return queue.get
