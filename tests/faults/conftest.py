"""Fault tests: real workers against a PostgreSQL that is killed, restarted, cut off or
pooled. Each module that restarts PostgreSQL gets a private server of its own."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from faultkit import HERE, worker_args
from psycopg.conninfo import make_conninfo

import leaseq
from support.pgserver import RestartablePostgres
from support.workers import WorkerProcess, Workers

Spawn = Callable[..., WorkerProcess]


@pytest.fixture(scope="module")
def restartable() -> Iterator[RestartablePostgres]:
    """A private server this module may stop and start."""
    server = RestartablePostgres()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def restartable_url(restartable: RestartablePostgres) -> str:
    """A fresh, migrated database on the restartable server."""
    name = f"leaseq_f_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(restartable.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = make_conninfo(restartable.url, dbname=name)
    with leaseq.connect(url, action="migrate") as conn:
        leaseq.migrate(conn)
    return url


@pytest.fixture
def spawn_on(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``spawn_on(url, worker_id, **worker_args)``: a real ``leaseq worker`` on ``url``
    running fault_apps; killed at the end, logs printed on failure."""
    pools: dict[str, Workers] = {}

    def spawn(
        url: str, worker_id: str, *, env: dict[str, str] | None = None, **kw: object
    ) -> WorkerProcess:
        workers = pools.setdefault(url, Workers(url, tmp_path, pythonpath=[HERE]))
        return workers.start(worker_id, *worker_args(**kw), env=env)  # type: ignore[arg-type]

    yield spawn
    for workers in pools.values():
        workers.stop_all()


class ReaperThread:
    """Reaps every ``interval`` seconds on a fresh connection each pass, so it survives a
    restarted server (the fault tests' stand-in for a reaper that is not under test)."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.reaped: list[leaseq.Reaped] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        retry = leaseq.RetryPolicy(base_seconds=0.1, cap_seconds=0.2)
        while not self._stop.wait(self.interval):
            try:
                with leaseq.connect(self.url, action="reap") as conn:
                    self.reaped.extend(leaseq.Queue(conn, retry=retry).reap())
            except leaseq.LeaseqError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture
def reaper_on() -> Iterator[Callable[[str, float], ReaperThread]]:
    started: list[ReaperThread] = []

    def start(url: str, interval: float = 0.5) -> ReaperThread:
        started.append(ReaperThread(url, interval))
        return started[-1]

    yield start
    for reaper in started:
        reaper.stop()
