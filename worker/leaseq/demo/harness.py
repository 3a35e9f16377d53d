"""What the demos that run real workers share: starting ``leaseq worker`` processes with
JSON logs in a scratch folder, a reaper thread (the operator's job in production), the list of
checks each demo ends with, and an embedded PostgreSQL when no database URL is given."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import leaseq
from leaseq.demo.embedded import EmbeddedPostgres
from leaseq.demo.run import stop_processes


class Harness:
    """Workers, a reaper and checks for one demo run on its own queue ``PREFIX-<hex>``."""

    def __init__(
        self, url: str, prefix: str, app: str, worker_args: Sequence[str],
        worker_env: dict[str, str] | None = None, spawn_note: str = "",
    ) -> None:  # fmt: skip
        """``worker_args`` are added to every worker's command line (its lease and heartbeat
        times, its concurrency), ``worker_env`` to its environment."""
        self.url = url
        self.app = app
        self.worker_args = list(worker_args)
        self.worker_env = dict(worker_env or {})
        self.spawn_note = spawn_note
        self.queue_name = f"{prefix}-{secrets.token_hex(3)}"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"leaseq-{prefix}-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: list[int] = []
        self.failures: list[str] = []
        self.start = time.monotonic()
        self._stop = threading.Event()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {text}", flush=True)

    def worker_name(self, key: str) -> str:
        return f"{self.queue_name}-{key}"

    def spawn(self, key: str) -> None:
        """Start ``leaseq worker`` named ``<queue>-<key>`` on this demo's queue, its output
        (JSON lines) in ``<workdir>/<key>.log``."""
        name = self.worker_name(key)
        cmd = [
            sys.executable, "-m", "leaseq.cli", "worker",
            "--app", self.app,
            "--queue", self.queue_name,
            "--poll-seconds", "1",
            "--worker-id", name,
            "--metrics-port", "0",
            "--log-format", "json",
            "--lead", "false",  # the demo's reaper thread reaps, with the demo's retry policy
            *self.worker_args,
        ]  # fmt: skip
        env = {**os.environ, "LEASEQ_DATABASE_URL": self.url, **self.worker_env}
        with (self.workdir / f"{key}.log").open("wb") as out:
            self.procs[key] = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        self.say(f"started worker {name}{self.spawn_note}")

    def _reap_loop(self, retry: leaseq.RetryPolicy, every: float) -> None:
        with leaseq.connect(self.url, action="reap") as conn:
            queue = leaseq.Queue(conn, retry=retry)
            while not self._stop.wait(every):
                for job in queue.reap():
                    self.say(f"reaper: job {job.job_id}'s lease expired -> {job.status}")

    def run_workers(
        self, keys: Sequence[str], watch: Callable[[], bool], retry: leaseq.RetryPolicy,
        reap_every: float,
    ) -> bool:  # fmt: skip
        """Start a reaper and the workers ``keys``, return what ``watch`` returns, and stop
        every worker (SIGTERM, then SIGKILL after 30 s) and the reaper whatever happened."""
        reaper = threading.Thread(target=self._reap_loop, args=(retry, reap_every), daemon=True)
        reaper.start()
        try:
            for key in keys:
                self.spawn(key)
            return watch()
        finally:
            self._stop.set()
            stop_processes(list(self.procs.values()), timeout=30)
            reaper.join(timeout=5)

    def check(self, ok: bool, claim: str) -> None:
        """Print one of the demo's checks; a broken one makes :meth:`verdict` return 1."""
        print(f"  {'ok  ' if ok else 'FAIL'} {claim}")
        if not ok:
            self.failures.append(claim)

    def verdict(self) -> int:
        """Say whether every check held, and where the workers' logs are; the exit status."""
        logs = ", ".join(str(self.workdir / f"{key}.log") for key in self.procs)
        if self.failures:
            print(f"\n{len(self.failures)} check(s) FAILED. Worker logs: {logs}")
            return 1
        print(f"\nall checks hold. Worker logs (JSON lines): {logs}")
        return 0


def with_server(url: str | None, demo: Callable[[str], int]) -> int:
    """Run ``demo`` against ``url``, or against an embedded PostgreSQL (stopped afterwards)
    when it is None."""
    logging.basicConfig(level=logging.ERROR)
    if url is not None:
        return demo(url)
    print("starting an embedded PostgreSQL (pass --database-url to use your own) ...")
    server = EmbeddedPostgres()
    try:
        return demo(server.url)
    finally:
        server.stop()
