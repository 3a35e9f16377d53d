"""Real worker processes for the process tests (support.workers), running apps:registry."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import leaseq
from support.workers import WorkerProcess, Workers

HERE = Path(__file__).parent


@pytest.fixture
def spawn_worker(database_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``leaseq worker`` processes (apps:registry); killed at the end if still alive.
    Their logs are printed when a test fails."""
    workers = Workers(database_url, tmp_path, pythonpath=[HERE])

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
        isolation: str = "thread",
        env: dict[str, str] | None = None,
        app: str = "apps:registry",
        own_id: bool = False,
    ) -> WorkerProcess:
        return workers.start(
            worker_id,
            "--app", app,
            "--queue", queue,
            "--concurrency", str(concurrency),
            "--lease-seconds", str(lease),
            "--heartbeat-seconds", str(heartbeat),
            "--poll-seconds", str(poll),
            "--drain-seconds", str(drain),
            "--listen", str(listen).lower(),
            "--isolation", isolation,
            "--log-level", "DEBUG",
            env=env,
            own_id=own_id,
        )  # fmt: skip

    yield spawn
    workers.stop_all()


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
