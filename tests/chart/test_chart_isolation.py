"""What ``worker.isolation: process`` needs in the pod: a /dev/shm of a chosen size on the
read-only root (children share memory with their supervisor there), and nothing for thread
isolation. The worker runs as the container's PID 1 in both modes (no shareProcessNamespace):
it reaps its children and their orphans itself (tests/image)."""

from __future__ import annotations

import pytest
from chartkit import Helm, Obj, one


def worker_pod(objs: list[Obj]) -> Obj:
    spec: Obj = one(objs, "Deployment", "worker")["spec"]["template"]["spec"]
    return spec


def test_process_isolation_mounts_a_memory_backed_dev_shm(helm: Helm) -> None:
    pod = worker_pod(helm.render(sets={"worker.isolation": "process"}))
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Mi"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["shm"] == "/dev/shm"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "shareProcessNamespace" not in pod  # the worker is PID 1 and does its duties
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LEASEQ_ISOLATION"] == "process"
    sized = worker_pod(
        helm.render(sets={"worker.isolation": "process", "worker.shmSizeLimit": "2Gi"})
    )
    assert {v["name"]: v for v in sized["volumes"]}["shm"]["emptyDir"]["sizeLimit"] == "2Gi"


def test_thread_isolation_keeps_the_runtime_dev_shm(helm: Helm) -> None:
    pod = worker_pod(helm.render())
    assert "shm" not in {v["name"] for v in pod["volumes"]}


@pytest.mark.parametrize("sets", [{"worker.concurrency": "1025"}, {"worker.shmSizeLimit": "lots"}])
def test_the_schema_refuses_what_the_worker_would(helm: Helm, sets: dict[str, str]) -> None:
    proc = helm.template_raw(sets=sets, check=False)
    assert proc.returncode != 0
    assert next(iter(sets)).removeprefix("worker.") in proc.stderr
