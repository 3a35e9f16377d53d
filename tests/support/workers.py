"""Real ``leaseq worker`` processes for tests: start one, wait until it has registered and
serves HTTP, scrape it, and kill whatever is still running at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import leaseq
from support import net
from support.polling import wait_for


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
        return net.get(f"http://127.0.0.1:{self.port}{path}")

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


class Workers:
    """Starts ``leaseq worker`` processes on one database, each logging to a file in
    ``workdir`` (also their working directory). ``pythonpath`` is put in front of theirs, for
    ``--app`` modules that live in a test folder."""

    def __init__(self, database_url: str, workdir: Path, pythonpath: Sequence[Path] = ()) -> None:
        self.database_url = database_url
        self.workdir = workdir
        self.pythonpath = [str(p) for p in pythonpath]
        self.started: list[WorkerProcess] = []

    def start(
        self, worker_id: str, *args: str, env: dict[str, str] | None = None, own_id: bool = False
    ) -> WorkerProcess:
        """``leaseq worker --worker-id <worker_id> --metrics-port <free port> <args>``, once
        it has registered in the database and answers /healthz. ``own_id``: no
        ``--worker-id``, the worker makes its own id (``worker_id`` names only its log, and
        ``env`` must give it a ``LEASEQ_POD_NAME`` no other worker registers with)."""
        port = net.free_port()
        log = self.workdir / f"{worker_id}.log"
        cmd = [
            sys.executable, "-m", "leaseq.cli", "worker",
            *([] if own_id else ["--worker-id", worker_id]),
            "--metrics-port", str(port),
            *args,
        ]  # fmt: skip
        # Never an empty PYTHONPATH entry: that would put the current directory first.
        pythonpath = [*self.pythonpath, os.environ.get("PYTHONPATH", "")]
        full_env = {
            **os.environ,
            "LEASEQ_DATABASE_URL": self.database_url,
            "PYTHONPATH": os.pathsep.join(filter(None, pythonpath)),
            # Tests bring their own reaper (or none, on purpose); the ones about a worker's
            # leadership turn it on.
            "LEASEQ_LEAD": "false",
            **(env or {}),
        }
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        worker = WorkerProcess(worker_id, proc, port, log)
        self.started.append(worker)
        pod = full_env.get("LEASEQ_POD_NAME") if own_id else None

        def registered() -> list[str]:
            return [
                w.worker_id
                for w in registry.list()
                if (w.pod == pod if own_id else w.worker_id == worker_id)
            ]

        with leaseq.connect(self.database_url, action="test") as conn:
            registry = leaseq.Workers(conn)
            wait_for(
                lambda: proc.poll() is not None or registered(),
                f"worker {worker_id} to register",
            )
            assert proc.poll() is None, log.read_text()
            [worker.worker_id] = registered()
        wait_for(worker.serving, f"worker {worker_id} to serve HTTP")
        return worker

    def stop_all(self) -> None:
        """Kill the workers still running and print every worker's log (shown on failure)."""
        for worker in self.started:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait(timeout=10)
            print(f"----- {worker.worker_id} (exit {worker.proc.returncode}) -----")
            print(worker.log.read_text(errors="replace")[-20000:])
