"""Local development without flags: off a Kubernetes pod, every worker listens on loopback on
a free port and logs the address it serves, so a second worker on one machine starts (the
fixed 9100 made it fail). In a pod the defaults stay every interface and 9100."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseq import config
from leaseq.runtime.settings import WorkerSettings
from support import net
from support.polling import wait_for

pytestmark = pytest.mark.process

HERE = Path(__file__).parent
SERVING = re.compile(r"serving /metrics, /healthz and /readyz on (\S+) port (\d+)")


@pytest.fixture
def start(database_url: str, tmp_path: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASEQ_", "KUBERNETES_"))}
    env |= {"LEASEQ_DATABASE_URL": database_url, "PYTHONPATH": str(HERE)}

    def run(name: str) -> tuple[str, int]:
        log = tmp_path / f"{name}.log"
        cmd = [sys.executable, "-m", "leaseq.cli", "worker", "--app", "apps:registry",
               "--queue", "q", "--worker-id", name]  # fmt: skip
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
            )
        proc = procs[-1]
        found = wait_for(
            lambda: proc.poll() is not None or SERVING.search(log.read_text()),
            f"{name} to say where it serves",
        )
        assert proc.poll() is None, log.read_text()
        assert isinstance(found, re.Match)
        return found.group(1), int(found.group(2))

    yield run
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)


def test_two_workers_on_one_machine_start_without_flags(start: object) -> None:
    first, second = start("w-one"), start("w-two")  # type: ignore[operator]
    assert first[0] == second[0] == "127.0.0.1"
    assert first[1] != second[1]
    for _, port in (first, second):
        assert net.get(f"http://127.0.0.1:{port}/healthz")[0] == 200


@pytest.mark.parametrize(
    ("environ", "port", "address"),
    [
        ({}, None, "127.0.0.1"),
        ({config.POD_MARKER: "10.96.0.1"}, 9100, "0.0.0.0"),
        ({config.POD_MARKER: "10.96.0.1", "LEASEQ_METRICS_PORT": "9200"}, 9200, "0.0.0.0"),
        ({"LEASEQ_METRICS_ADDRESS": "0.0.0.0"}, None, "0.0.0.0"),
    ],
)
def test_endpoint_defaults_in_a_pod_and_elsewhere(
    environ: dict[str, str], port: int | None, address: str
) -> None:
    env = {"LEASEQ_DATABASE_URL": "postgresql://db/x", "LEASEQ_APP": "a:b", "LEASEQ_QUEUES": "q"}
    s = WorkerSettings.from_args(argparse.Namespace(), {**env, **environ})
    assert (s.metrics_port, s.metrics_address) == (port, address)
