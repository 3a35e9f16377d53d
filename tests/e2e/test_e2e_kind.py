"""End to end on kind: the image, the chart, the operator's scaling and the queue's guarantees.

Run it (needs a running Docker engine, kind, kubectl and helm; the rest comes from the venv):

    scripts/fetch-tools.sh && PATH="$PWD/.tools/bin:$PATH" pytest -m e2e tests/e2e -v

One test, in the order a user would see it: create the cluster from kind-config.yaml, build
the image and load it, `helm install` with the in-cluster PostgreSQL (ci/kind-values.yaml;
its hooks run before the release's own objects exist), enqueue 100 slow jobs, watch the
WorkerPool scale the workers to maxReplicas, force-delete a busy worker pod and see the
reaper take its job back, `helm upgrade` (a rolling restart) while jobs run, so that draining
pods release jobs longer than their drain window, watch the pool scale back to zero, check
every job succeeded with exactly one effect and none went dead, retry a dead job through the
web console (port-forwarded, basic auth from a Secret, its form's CSRF token and Origin) and
see a worker the pool scales up make it succeed, `helm test`, and finally
`helm uninstall` and deleting the namespace, which must both finish and leave nothing behind.

LEASEQ_E2E_KEEP_CLUSTER=1 keeps (and reuses) the cluster; LEASEQ_E2E_NODE_IMAGE picks the
node image (e.g. the oldest Kubernetes the chart claims).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import leaseq
from support.cluster import NAMESPACE, RELEASE, Cluster, wait_for, wait_replaced, worker_pods

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "leaseq"
CLUSTER = "leaseq-e2e"
IMAGE = "leaseq:e2e"  # ci/kind-values.yaml: repository leaseq, tag e2e, pullPolicy Never
QUEUE = "e2e"  # ci/kind-values.yaml: worker.queues
JOBS = 100
JOB_SECONDS = 15  # longer than ci/kind-values.yaml's worker.drainSeconds (5): see the upgrade
MAX_REPLICAS = 4  # ci/kind-values.yaml: worker.pool.maxReplicas
CLEANUP_TIMEOUT = "3m"  # uninstall and namespace deletion: a hang is a failure, not a wait
WORKER = f"{RELEASE}-worker"
POSTGRES = f"{RELEASE}-postgresql"
CONSOLE = f"{RELEASE}-console"
# ci/kind-values.yaml: console.basicAuth.existingSecret, created here before the install.
CONSOLE_USERS = "leaseq-console-users"
CONSOLE_USER, CONSOLE_PASSWORD = "oncall", "e2e-console-pass"


def missing_tools() -> str | None:
    """Why the e2e cannot run here, or None."""
    for name in ("docker", "kind", "kubectl", "helm"):
        if shutil.which(name) is None:
            return f"{name} not on PATH"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "no Docker engine answers `docker info`"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = missing_tools()
    if reason:
        pytest.skip(f"e2e needs docker (with a running engine), kind, kubectl and helm: {reason}")
    keep = os.environ.get("LEASEQ_E2E_KEEP_CLUSTER") == "1"
    existing = subprocess.run(
        ["kind", "get", "clusters"], capture_output=True, text=True, check=True
    ).stdout.split()
    if CLUSTER not in existing:
        create = ["kind", "create", "cluster", "--name", CLUSTER, "--wait", "180s"]
        create += ["--config", str(REPO / "kind-config.yaml")]
        if os.environ.get("LEASEQ_E2E_NODE_IMAGE"):
            create += ["--image", os.environ["LEASEQ_E2E_NODE_IMAGE"]]
        subprocess.run(create, check=True, timeout=600)
    kubeconfig = tmp_path_factory.mktemp("kube") / "config"
    kubeconfig.write_text(
        subprocess.run(
            ["kind", "get", "kubeconfig", "--name", CLUSTER],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    try:
        yield Cluster(kubeconfig)
    finally:
        if not keep:
            subprocess.run(["kind", "delete", "cluster", "--name", CLUSTER], check=False)


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    """The image built and loaded, the chart installed with the demo PostgreSQL."""
    subprocess.run(["docker", "build", "-t", IMAGE, str(REPO)], check=True, timeout=1200)
    subprocess.run(["kind", "load", "docker-image", IMAGE, "--name", CLUSTER], check=True)
    uninstall(cluster)  # a kept cluster's earlier run
    # The console's users: a Secret of user:password lines, as an operator team would make.
    cluster.run("kubectl", "create", "namespace", NAMESPACE)
    cluster.kubectl(
        "create", "secret", "generic", CONSOLE_USERS,
        f"--from-literal=users={CONSOLE_USER}:{CONSOLE_PASSWORD}",
    )  # fmt: skip
    cluster.helm(
        "install",
        RELEASE,
        str(CHART),
        "--create-namespace",
        "-f",
        str(CHART / "ci" / "kind-values.yaml"),
        "--wait",
        "--timeout",
        "10m",
    )
    return cluster


def uninstall(cluster: Cluster) -> None:
    """`helm uninstall` and the namespace deletion, each bounded: a WorkerPool held by a
    finalizer nobody can remove any more would hang both forever."""
    cluster.run(
        "helm", "uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found",
        "--wait", "--timeout", CLEANUP_TIMEOUT,
    )  # fmt: skip
    cluster.run(
        "kubectl", "delete", "namespace", NAMESPACE, "--ignore-not-found",
        "--wait", f"--timeout={CLEANUP_TIMEOUT}",
    )  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def database_url(installed: Cluster) -> Iterator[str]:
    """The in-cluster PostgreSQL, port-forwarded to this machine."""
    port = free_port()
    forward = subprocess.Popen(
        ["kubectl", "-n", NAMESPACE, "port-forward", f"svc/{POSTGRES}", f"{port}:5432"],
        env=installed.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"postgresql://leaseq:leaseq-demo@127.0.0.1:{port}/leaseq"

    def connects() -> bool:
        try:
            psycopg.connect(url, connect_timeout=3).close()
        except psycopg.OperationalError:
            return False
        return True

    try:
        wait_for("the port-forward to PostgreSQL", connects, timeout=60)
        yield url
    finally:
        forward.terminate()
        forward.wait(timeout=10)


@contextlib.contextmanager
def console_forward(cluster: Cluster) -> Iterator[str]:
    """The console's Service, port-forwarded to this machine: its base URL."""
    port = free_port()
    forward = subprocess.Popen(
        ["kubectl", "-n", NAMESPACE, "port-forward", f"svc/{CONSOLE}", f"{port}:80"],
        env=cluster.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(base + "/healthz", timeout=3).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for("the port-forward to the console", answers, timeout=60)
        yield base
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def retry_through_console(base: str, job_id: int) -> str:
    """Retry a dead job the way a browser does: sign in, open its page (the CSRF cookie and
    the form's token), post the form with the page's Origin. Returns the answer page."""
    auth = (CONSOLE_USER, CONSOLE_PASSWORD)
    with httpx.Client(base_url=base, auth=auth, timeout=10) as http:
        assert http.get("/", auth=None).status_code == 401  # never without credentials
        page = http.get(f"/jobs/{job_id}")
        assert page.status_code == 200, page.text
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token, "the job page has no retry form"
        answer = http.post(
            f"/jobs/{job_id}/retry",
            data={"csrf": token.group(1), "reason": "e2e: retried through the console"},
            headers={"Origin": base},
        )
        assert answer.status_code == 200, answer.text
        return answer.text


def replicas(cluster: Cluster) -> tuple[int, int]:
    """(spec.replicas, readyReplicas) of the worker Deployment."""
    spec = cluster.jsonpath(f"deployment/{WORKER}", "{.spec.replicas}") or "0"
    ready = cluster.jsonpath(f"deployment/{WORKER}", "{.status.readyReplicas}") or "0"
    return int(spec), int(ready)


def released_by(attempts: Sequence[leaseq.AttemptRecord], pods: set[str]) -> list[Any]:
    """The attempts a worker of one of ``pods`` ended by releasing (a graceful drain); empty
    (falsy, so wait_for polls on) until the database has one."""
    return [a for a in attempts if a.outcome == "released" and any(pod in a.worker for pod in pods)]


def test_scale_crash_upgrade_scale_down(installed: Cluster, database_url: str) -> None:
    cluster = installed
    with psycopg.connect(database_url, autocommit=True) as conn:
        queue = leaseq.Queue(conn)
        specs = [
            leaseq.JobSpec(
                queue=QUEUE,
                job_type="infer",
                payload={"seconds": JOB_SECONDS, "doc": f"doc-{i}"},
                idempotency_key=f"e2e-doc-{i}",
            )
            for i in range(JOBS)
        ]
        job_ids = [e.job_id for e in queue.enqueue_many(specs)]
        assert len(set(job_ids)) == JOBS

        # The WorkerPool scales the Deployment up to maxReplicas, and they all get ready.
        wait_for(
            f"{MAX_REPLICAS} ready workers",
            lambda: replicas(cluster) == (MAX_REPLICAS, MAX_REPLICAS) or None,
            timeout=600,
        )

        # Force-delete a pod that holds a running job: the job must run again elsewhere.
        def busy() -> tuple[str, int] | None:
            by_worker = {w.worker_id: w.pod for w in leaseq.Workers(conn).list([QUEUE]) if w.pod}
            for job in queue.jobs(status="running", queue=QUEUE):
                pod = by_worker.get(job.lease_owner or "")
                if pod:
                    return pod, job.id
            return None

        victim_pod, victim_job = wait_for("a busy worker pod", busy, timeout=120)
        cluster.kubectl("delete", "pod", victim_pod, "--grace-period=0", "--force")
        # The reaper takes it back once its lease expires. It then waits behind the jobs
        # already queued (backoff, FIFO), so its second run is checked at the end: waiting
        # for it here would start the upgrade only after every other job had finished.
        wait_for(
            f"job {victim_job} to be reaped",
            lambda: any(a.outcome == "lease_expired" for a in queue.attempts(victim_job)) or None,
            timeout=300,
        )

        # A rolling restart through helm while jobs run: every old pod gets SIGTERM with jobs
        # in flight; those with more than drainSeconds (5) left of their JOB_SECONDS (15) are
        # released back to the queue (without costing an attempt), the others finish.
        [before] = queue.stats([QUEUE])
        assert before.running > 0 and before.ready > 0, (
            f"the upgrade must start while jobs run and wait: {before}"
        )
        # The upgrade changes only the worker pods' template: they are what it replaces (the
        # operator's, the console's and PostgreSQL's pods stay, so waiting for every pod of
        # the namespace to go would never end).
        old_pods = worker_pods(cluster)
        cluster.helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "--reuse-values",
            "--set-string",
            f"worker.podAnnotations.leaseq\\.dev/e2e-restart={time.time_ns()}",
            "--wait",
            "--timeout",
            "10m",
        )
        # `--wait` returns once the new pods are ready, while the last old ones may still be
        # draining: wait for them to be gone, then for their releases to be in the database.
        new_pods = wait_replaced(cluster, old_pods, timeout=300)
        assert new_pods, "the upgrade left no worker pod, though jobs were waiting"
        wait_for(
            "a draining pod to have released a job (the release path)",
            lambda: released_by([a for j in job_ids for a in queue.attempts(j)], old_pods),
            timeout=60,
        )

        # Everything runs to the end, then the pool scales back to minReplicas (0).
        def drained() -> bool:
            return all(s.ready + s.scheduled + s.running == 0 for s in queue.stats([QUEUE]))

        wait_for("the queue to drain", drained, timeout=900, every=5)
        wait_for("the scale-down to 0", lambda: replicas(cluster) == (0, 0) or None, timeout=600)

        # Every job succeeded, exactly one effect each, nothing dead.
        records = [queue.get(job_id) for job_id in job_ids]
        assert [r.id for r in records if r.status != "succeeded"] == []
        assert queue.jobs(status="dead", queue=QUEUE) == []
        effects = conn.execute(
            "select job_id, count(*) from leaseq.job_results where job_id = any(%s) "
            "group by job_id",
            (job_ids,),
        ).fetchall()
        assert dict(effects) == dict.fromkeys(job_ids, 1)
        for i, job_id in enumerate(job_ids):
            effect = queue.effect(f"e2e-doc-{i}")
            assert effect is not None
            assert effect.job_id == job_id
        # The force-deleted pod's job ran again elsewhere, and completed once (above).
        attempts = queue.attempts(victim_job)
        assert len(attempts) >= 2
        assert any(victim_pod in a.worker for a in attempts)
        assert any(victim_pod not in a.worker for a in attempts)

        # The web console: a dead job retried through it runs again (the pool scales a
        # worker back up for it), and the audit says who did it and why.
        [dead_id] = conn.execute(
            "INSERT INTO leaseq.jobs (queue, job_type, payload, status, attempt_count,"
            " max_attempts, finished_at, last_error, last_error_code)"
            " VALUES (%s, 'infer', '{\"seconds\": 1}', 'dead', 1, 1, now(), 'e2e', 'E2E')"
            " RETURNING id",
            (QUEUE,),
        ).fetchone()
        with console_forward(cluster) as base:
            assert "1 of 1 job(s) retried" in retry_through_console(base, dead_id)
        wait_for(
            "the job retried through the console to succeed",
            lambda: queue.get(dead_id).status == "succeeded" or None,
            timeout=600,
            every=5,
        )
        actor = conn.execute(
            "SELECT actor FROM leaseq.console_audit WHERE %s = ANY(job_ids)", (dead_id,)
        ).fetchone()
        assert actor == (CONSOLE_USER,)

    cluster.helm("test", RELEASE, "--timeout", "5m")

    # Uninstall as a user does; nothing of the release is left, in the namespace or outside.
    uninstall(cluster)
    leftovers = cluster.run(
        "kubectl", "get", "clusterroles,clusterrolebindings", "-o", "name",
        "-l", f"app.kubernetes.io/instance={RELEASE}",
    )  # fmt: skip
    assert leftovers.strip() == ""
    namespaces = cluster.run("kubectl", "get", "namespaces", "-o", "name").split()
    assert f"namespace/{NAMESPACE}" not in namespaces
