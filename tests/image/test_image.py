"""The image, run as the chart runs it: migrate, a worker that releases its jobs on `podman
stop` (the same SIGTERM-then-SIGKILL a pod deletion sends), and the operator with no passwd
entry for its uid."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kubernetes.client
import pytest
import yaml
from k8s.emulator import CRD_PATH, EmulatorServer, leaseq_server
from k8s.harness import Api
from podmankit import MEASURED, PODMAN, Container, podman

import leaseq
from support import net
from support.polling import wait_for

pytestmark = pytest.mark.image

DRAIN_SECONDS = 3
STOP_TIMEOUT = 30  # podman stop's SIGKILL deadline, as terminationGracePeriodSeconds


def _status(pid: int) -> dict[str, str]:
    """/proc/PID/status of the container's process, as the host sees it."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def test_migrate(
    run_container: Callable[..., Container],
    empty_database_url: str,
    reachable: Callable[[str], str],
) -> None:
    container = run_container("migrate", env={"LEASEQ_DATABASE_URL": reachable(empty_database_url)})
    wait_for(lambda: not container.running, what="leaseq migrate to finish", timeout=120)
    state = container.inspect()["State"]
    assert state["ExitCode"] == 0, container.logs()
    with leaseq.connect(empty_database_url, action="test") as conn:
        assert leaseq.check_schema(conn) >= 1


def _children(pid: int) -> list[int]:
    """The pids (host's view) of the processes whose parent is ``pid``, zombies included."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = _status(int(entry.name))
            except OSError:
                continue
            if status.get("PPid") == str(pid):
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_worker_as_pid_1_runs_a_job_releases_on_stop_and_exits_zero(
    run_container: Callable[..., Container],
    database_url: str,
    reachable: Callable[[str], str],
    queue: leaseq.Queue,
    isolation: str,
) -> None:
    # Every mode the chart offers (worker.isolation), the entrypoint as PID 1: a kubelet
    # starts the container's entrypoint with no init in front of it (podman run without
    # --init does the same), so the worker is PID 1 of its PID namespace.
    quick = queue.enqueue("infer", "infer", {"seconds": 0.2, "doc": "quick"}).job_id
    port = net.free_port()
    worker = run_container(
        "worker",
        env={
            "LEASEQ_DATABASE_URL": reachable(database_url),
            "LEASEQ_APP": "leaseq.demo.app:registry",
            "LEASEQ_QUEUES": "infer",
            "LEASEQ_CONCURRENCY": "2",
            "LEASEQ_ISOLATION": isolation,
            "LEASEQ_DRAIN_SECONDS": str(DRAIN_SECONDS),
            "LEASEQ_METRICS_PORT": str(port),
        },
        # The chart's memory-backed /dev/shm for process isolation (worker.shmSizeLimit).
        flags=("--shm-size=256m",) if isolation == "process" else (),
    )
    wait_for(
        lambda: queue.get(quick).status == "succeeded" or not worker.running,
        what=f"a job done by the worker in {isolation} mode",
        timeout=120,
    )
    assert worker.running, worker.logs()
    assert queue.get(quick).status == "succeeded"
    info = worker.inspect()
    host_pid = int(info["State"]["Pid"])
    if isolation == "process":
        # A child killed (as the OOM killer does) leaves its guard an orphan of PID 1, which
        # only PID 1 can reap; the worker does, and replaces the child.
        slot = next(p for p in _children(host_pid) if "spawn_main" in _cmdline(p))
        [guard] = _children(slot)
        os.kill(slot, signal.SIGKILL)
        wait_for(
            lambda: not Path(f"/proc/{guard}").exists() and not Path(f"/proc/{slot}").exists(),
            what="the killed child and its guard reaped by PID 1",
        )
    ids = [queue.enqueue("infer", "infer", {"seconds": 600, "doc": n}).job_id for n in range(2)]
    wait_for(
        lambda: all(queue.get(i).status == "running" for i in ids) or not worker.running,
        what="both slow jobs claimed",
        timeout=120,
    )
    assert worker.running, worker.logs()

    # As a pod: PID 1, uid 10001 (no passwd entry), no capabilities, read-only root.
    status = _status(host_pid)
    assert status["NSpid"].split()[-1] == "1", status["NSpid"]  # its pid inside the container
    assert "worker" in _cmdline(host_pid)
    assert status["Uid"].split()[:2] == ["10001", "10001"]
    assert int(status["CapEff"], 16) == 0
    assert info["HostConfig"]["ReadonlyRootfs"] is True
    if isolation == "process":
        # The two slots' children run the jobs, each with its guard; no zombie anywhere.
        # (The replacement may still be starting: its guard comes before its app.)
        def tree() -> dict[int, list[int]]:
            slots = [p for p in _children(host_pid) if "spawn_main" in _cmdline(p)]
            found = {p: _children(p) for p in slots}
            assert len(found) == 2 and all(len(g) == 1 for g in found.values()), found
            return found

        slots = wait_for(tree, what="two children, each with its guard")
        processes = [host_pid, *_children(host_pid), *(g for p in slots for g in slots[p])]
        assert not [p for p in processes if _status(p)["State"].startswith("Z")]
    for path in ("/healthz", "/readyz"):
        code, body = net.get(f"http://127.0.0.1:{port}{path}")
        assert code == 200, f"{path}: {code} {body}"
    code, body = net.get(f"http://127.0.0.1:{port}/metrics")
    assert code == 200
    assert 'leaseq_jobs_claimed_total{job_type="infer",queue="infer"} 3.0' in body

    started = time.monotonic()
    podman("stop", f"--time={STOP_TIMEOUT}", worker.name, timeout=STOP_TIMEOUT + 30)
    MEASURED[f"release after podman stop ({isolation})"] = (
        f"{time.monotonic() - started:.1f} s (drain window {DRAIN_SECONDS} s, 2 jobs of 600 s)"
    )
    # 137: SIGKILLed at the deadline (PID 1 has no default action for SIGTERM: the worker's
    # own handler must end it).
    assert worker.inspect()["State"]["ExitCode"] == 0, worker.logs()
    for job_id in ids:
        job = queue.get(job_id)
        assert job.status == "pending"
        assert job.attempt_count == 0  # a graceful release costs no attempt
        [attempt] = queue.attempts(job_id)
        assert attempt.outcome == "released"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[EmulatorServer, Path]]:
    """The kopf emulator on the host, and a kubeconfig folder pointing at it (readable by
    uid 10001)."""
    with leaseq_server(yaml.safe_load(CRD_PATH.read_text())) as server:
        folder = tmp_path / "kube"
        folder.mkdir()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": server.url}}],
            "users": [{"name": "anonymous", "user": {}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "anonymous"}}
            ],
            "current-context": "emulator",
        }
        (folder / "config").write_text(yaml.safe_dump(config))
        for path in (tmp_path, folder, folder / "config"):
            os.chmod(path, os.stat(path).st_mode | stat.S_IRGRP | stat.S_IROTH | stat.S_IXOTH)
        yield server, folder


def test_operator_runs_as_a_uid_without_a_passwd_entry(
    run_container: Callable[..., Container],
    database_url: str,
    reachable: Callable[[str], str],
    cluster: tuple[EmulatorServer, Path],
    queue: leaseq.Queue,
) -> None:
    server, kube = cluster
    health = net.free_port()
    operator = run_container(
        "operator",
        env={
            "LEASEQ_DATABASE_URL": reachable(database_url),
            "KUBECONFIG": "/kube/config",
            "LEASEQ_NAMESPACE": "default",
            "LEASEQ_HEALTH_PORT": str(health),
            "LEASEQ_METRICS_PORT": str(net.free_port()),
            "LEASEQ_OPERATOR_ID": "operator-in-image",
        },
        flags=(f"--volume={kube}:/kube:ro",),
    )
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=server.url))
    api = Api(client)
    api.create_deployment("workers", replicas=0)
    api.create_pool("ocr", {"deployment": "workers", "queues": ["ocr"], "pollSeconds": 1})
    queue.enqueue("ocr", "extract")
    wait_for(
        lambda: api.replicas("workers") == 1 or not operator.running,
        what="the operator in the image scaled the pool up",
        timeout=120,
    )
    assert operator.running, operator.logs()
    assert api.replicas("workers") == 1
    # The condition that crashed it in every cluster: its uid has no passwd entry.
    lookup = subprocess.run(
        [
            *PODMAN,
            "exec",
            operator.name,
            "python",
            "-c",
            "import os, pwd; pwd.getpwuid(os.getuid())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "uid not found: 10001" in lookup.stderr, lookup.stderr
    code, body = net.get(f"http://127.0.0.1:{health}/healthz")
    assert code == 200, body
    client.close()  # type: ignore[no-untyped-call]
