"""``python -m bench.reclaim --database-url URL [--repeats N]``: how long a SIGKILLed worker's
job waits before it is back in the queue, with and without the kubelet's report of the kill.

Per run: a real ``leaseq worker`` process (``--lease-seconds 30``, the default; thread
isolation; ``LEASEQ_POD_NAME``/``LEASEQ_NODE_NAME`` set as the chart's downward API sets them)
claims one ``sleep`` job, and is SIGKILLed (what the kernel's OOM killer sends) once the job
runs. A real operator (kopf, the chart's defaults: reap every 5 s, leader TTL 15 s) leads
against the kmock Kubernetes emulator of the operator's tests (tests/k8s/emulator.py), which
holds the worker's pod. ``lease``: nothing more happens (a node that stopped reporting, or a
leaseq before the operator watched pods): the job waits for its lease and the next reap pass.
``oom_report``: right after the kill, the bench writes the pod status the kubelet writes for
an OOM-killed container (``state.terminated``, reason OOMKilled, exit code 137,
``finishedAt`` in whole seconds). No kubelet, container runtime or network is involved: the
kubelet's own delay in noticing the exit (its PLEG relists every second) is not in these
numbers.

Measured, in database time: from the kill to the end of the job's attempt (outcome
``lease_expired``), i.e. until the job is pending again. Rows go to
``bench/results/reclaim.csv``.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes.client
import psycopg
import yaml

import leaseq
from bench.env import reset_leaseq, scratch_database
from leaseq_operator.app import OperatorApp
from leaseq_operator.config import OperatorConfig
from leaseq_operator.kube import Cluster
from leaseq_operator.runner import run as run_operator

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tests" / "k8s"))  # the operator tests' emulator
from emulator import CRD_PATH, leaseq_server  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "reclaim.csv"
QUEUE, NAMESPACE, NODE, POD = "bench", "default", "node-1", "workers-5d8f7-oom"
LEASE = 30.0
MODES = ("lease", "oom_report")


def _pod() -> dict[str, Any]:
    env = [{"name": "LEASEQ_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "labels": {"app": "workers"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "worker", "image": "x", "env": env}]},
    }


def _status(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "worker",
                    "image": "x",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
    }


def _wait(check: Any, what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return found


def one_run(url: str, core: kubernetes.client.CoreV1Api, mode: str) -> dict[str, Any]:
    reset_leaseq(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM leaseq.workers")
        job_id = leaseq.Queue(conn).enqueue(QUEUE, "sleep", {"seconds": 3600}).job_id
        core.create_namespaced_pod(NAMESPACE, _pod())
        env = {
            **os.environ,
            "LEASEQ_DATABASE_URL": url,
            "LEASEQ_POD_NAME": POD,
            "LEASEQ_NODE_NAME": NODE,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *(str(ROOT / p) for p in ("worker", "operator", "sql"))]
            ),
        }
        worker = subprocess.Popen(
            [sys.executable, "-m", "leaseq.cli", "worker", "--app", "bench.apps:registry",
             "--queue", QUEUE, "--lease-seconds", str(LEASE), "--lead", "false",
             "--metrics-port", "0", "--log-level", "WARNING"],
            env=env, cwd=ROOT,
        )  # fmt: skip
        try:
            _wait(
                lambda: conn.execute(
                    "SELECT 1 FROM leaseq.jobs WHERE id = %s AND status = 'running'", [job_id]
                ).fetchone(),
                "the job to run",
                60,
            )
            # The kubelet dates the end in whole seconds: a worker killed in the second it
            # started would not be known to have started before it.
            time.sleep(1.0)
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        killed_at = row[0]
        if mode == "oom_report":
            ended = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            core.patch_namespaced_pod_status(POD, NAMESPACE, _status({"terminated": {
                "reason": "OOMKilled", "exitCode": 137, "finishedAt": ended}}))  # fmt: skip
        ended_at = _wait(
            lambda: conn.execute(
                "SELECT extract(epoch FROM ended_at)::float8 FROM leaseq.job_attempts"
                " WHERE job_id = %s AND outcome = 'lease_expired'",
                [job_id],
            ).fetchone(),
            "the job back in the queue",
            LEASE * 3,
        )[0]
        core.delete_namespaced_pod(POD, NAMESPACE)
    return {"mode": mode, "lease_s": LEASE, "back_after_s": round(ended_at - killed_at, 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = []
    crd = yaml.safe_load(CRD_PATH.read_text())
    with scratch_database(args.database_url, "reclaim") as url, leaseq_server(crd) as server:
        config = OperatorConfig(
            database_url=url, namespace=NAMESPACE, health_port=0, metrics_port=0
        )
        app = OperatorApp(config, Cluster.at(server.url))
        stop = threading.Event()
        thread = threading.Thread(
            target=run_operator, args=(config, app.cluster), kwargs={"stop_flag": stop, "app": app}
        )
        thread.start()
        client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=server.url))
        try:
            _wait(lambda: app.leading, "the operator to lead", 60)
            core = kubernetes.client.CoreV1Api(client)
            for repeat in range(args.repeats):
                for mode in MODES:
                    row = {"repeat": repeat, **one_run(url, core, mode)}
                    print(row, flush=True)
                    rows.append(row)
        finally:
            stop.set()
            thread.join(60)
            client.close()
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
