"""A worker container the kubelet saw terminate gives its jobs back at once; a pod whose death
is not confirmed keeps them until their leases end (emulated API server, real PostgreSQL,
real kopf).

The emulator has no kubelet and no node lifecycle controller: each test writes the pod status
they would write. What they write, by the Kubernetes source (kubernetes/kubernetes):

- The kubelet reports a container that exited in ``status.containerStatuses[]``: as
  ``state.terminated`` (reason ``OOMKilled`` for the kernel's OOM kill, exit code 137) until
  it restarts, then as ``lastState.terminated`` of the new container, each with
  ``finishedAt`` (staging/src/k8s.io/api/core/v1/types.go, ContainerStatus,
  ContainerStateTerminated). A restart is a new container: one that terminated never runs
  again.
- When a node stops reporting (its Ready condition Unknown), the node lifecycle controller
  only sets its pods' Ready condition to False and their reason to NodeUnreachable
  (pkg/controller/util/node/controller_utils.go, MarkPodsNotReady, SetPodTerminationReason):
  the container statuses keep saying ``running``, whatever happens on the node.
- The kubelet removes a pod object (its final delete) only once the pod's phase is terminal
  (pkg/kubelet/status/status_manager.go, canBeDeleted), so a pod that disappears while its
  statuses say ``running`` was force-deleted (or taken by the pod garbage collector): its
  containers may still run on an unreachable node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from harness import NAMESPACE, Api, RunningOperator, StartOperator, register_worker

import leaseq
from leaseq_operator import handlers
from support.polling import wait_for

pytestmark = pytest.mark.k8s

NODE = "node-1"  # where harness.register_worker registers workers
LEASE = 300.0  # seconds: every wait below is far shorter, so only a reclaim can end these
WAIT = 30.0


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")  # as the API writes times: whole seconds


def _create_worker_pod(api: Api, name: str) -> None:
    """A pod as the chart's worker Deployment makes it: one container that gets the pod's
    name through the downward API (what its worker registers as its pod), on ``NODE``."""
    api.core.create_namespaced_pod(
        NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "workers"}},
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {
                        "name": "worker",
                        "image": "leaseq:test",
                        "env": [
                            {
                                "name": "LEASEQ_POD_NAME",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                            }
                        ],
                    },
                    {"name": "sidecar", "image": "proxy:test"},
                ],
            },
        },
    )


def _set_status(api: Api, pod: str, status: Mapping[str, Any]) -> None:
    api.core.patch_namespaced_pod_status(pod, NAMESPACE, {"status": dict(status)})


def _running(started: datetime) -> dict[str, Any]:
    return {"running": {"startedAt": _time(started)}}


def _oom_killed(started: datetime, finished: datetime) -> dict[str, Any]:
    return {
        "terminated": {
            "reason": "OOMKilled",
            "exitCode": 137,
            "startedAt": _time(started),
            "finishedAt": _time(finished),
        }
    }


def _worker_status(state: Mapping[str, Any], last: Mapping[str, Any] | None = None) -> Any:
    return {
        "name": "worker",
        "image": "leaseq:test",
        "imageID": "",
        "ready": "running" in state,
        "state": dict(state),
        "lastState": dict(last or {}),
        "restartCount": 0 if last is None else 1,
    }


def _claim(queue: leaseq.Queue, worker: str, count: int = 1) -> list[int]:
    ids = [queue.enqueue("ocr", "extract").job_id for _ in range(count)]
    claimed = queue.claim(["ocr"], worker, limit=count, lease_seconds=LEASE)
    assert sorted(job.id for job in claimed) == sorted(ids)
    return ids


def _leader(start_operator: StartOperator) -> RunningOperator:
    operator = start_operator()
    wait_for(lambda: operator.app.leading, what="the operator leads", timeout=WAIT)
    return operator


def _seen(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[tuple[str, bool]]]:
    """Record each pod event the operator's handler finished with (pod name, deleted)."""
    done: list[tuple[str, bool]] = []
    lock = threading.Lock()
    original = handlers.reclaim_terminated

    def recording(app: Any, body: Mapping[str, Any], deleted: bool) -> None:
        original(app, body, deleted)
        with lock:
            done.append((str(body["metadata"]["name"]), deleted))

    monkeypatch.setattr(handlers, "reclaim_terminated", recording)

    def seen() -> list[tuple[str, bool]]:
        with lock:
            return list(done)

    return seen


def test_an_oom_killed_worker_gives_its_jobs_back_at_once(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """Jobs on 300 s leases come back within the test's wait (the lease would take 300 s):
    pending, the attempt spent as for any crash, the reaper named on it."""
    operator = _leader(start_operator)
    booted = datetime.now(UTC) - timedelta(seconds=60)
    _create_worker_pod(api, "workers-a")
    register_worker(conn, "workers-a-1-aaaaaa", "workers-a", boot_at=booted)
    ids = _claim(queue, "workers-a-1-aaaaaa", count=2)
    _set_status(api, "workers-a", {"phase": "Running", "containerStatuses": [
        _worker_status(_running(booted))]})  # fmt: skip

    finished = booted + timedelta(seconds=30)
    _set_status(api, "workers-a", {"phase": "Running", "containerStatuses": [
        _worker_status(_oom_killed(booted, finished))]})  # fmt: skip
    wait_for(
        lambda: all(queue.get(i).status == "pending" for i in ids),
        what="the OOM-killed worker's jobs pending again",
        timeout=WAIT,
    )
    for job_id in ids:
        job = queue.get(job_id)
        assert job.attempt_count == 1  # a crash spends the attempt (a job that OOMs dies)
        assert job.last_error_code == "LEASE_EXPIRED"
        assert "its worker terminated" in (job.last_error or "")
        [attempt] = queue.attempts(job_id)
        assert attempt.outcome == "lease_expired"
        assert attempt.worker == "workers-a-1-aaaaaa"
        assert operator.app.config.operator_id in (attempt.error or "")


def test_a_restarted_containers_worker_keeps_its_leases(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """The container was OOM-killed and restarted: the old worker's job comes back, the job
    the new worker (started after the kill, by the node's clock) already claimed stays its."""
    _leader(start_operator)
    booted = datetime.now(UTC) - timedelta(seconds=60)
    finished = booted + timedelta(seconds=30)
    restarted = finished + timedelta(seconds=1)
    _create_worker_pod(api, "workers-b")
    register_worker(conn, "workers-b-1-aaaaaa", "workers-b", boot_at=booted)
    [old] = _claim(queue, "workers-b-1-aaaaaa")
    register_worker(conn, "workers-b-1-bbbbbb", "workers-b", boot_at=restarted)
    [new] = _claim(queue, "workers-b-1-bbbbbb")

    _set_status(api, "workers-b", {"phase": "Running", "containerStatuses": [
        _worker_status(_running(restarted), _oom_killed(booted, finished))]})  # fmt: skip
    wait_for(lambda: queue.get(old).status == "pending", what="the old worker's job back")
    # Both were decided by the same statement: the new worker's lease is untouched.
    job = queue.get(new)
    assert (job.status, job.lease_owner) == ("running", "workers-b-1-bbbbbb")


def test_a_pod_on_an_unreachable_node_keeps_its_jobs_until_their_leases_end(
    api: Api,
    start_operator: StartOperator,
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node stopped reporting: its pod is marked not ready, evicted, and finally
    removed by a force delete, all with statuses still saying ``running``. Nothing confirms
    that the worker stopped, so its job keeps its lease."""
    seen = _seen(monkeypatch)
    _leader(start_operator)
    booted = datetime.now(UTC) - timedelta(seconds=60)
    _create_worker_pod(api, "workers-c")
    register_worker(conn, "workers-c-1-aaaaaa", "workers-c", boot_at=booted)
    [job_id] = _claim(queue, "workers-c-1-aaaaaa")
    running = [_worker_status(_running(booted))]
    _set_status(api, "workers-c", {"phase": "Running", "containerStatuses": running})
    # The operator watches pods from here on (a pod created and removed before its watch
    # began would never be seen at all).
    wait_for(lambda: ("workers-c", False) in seen(), what="the pod seen", timeout=WAIT)
    # The node lifecycle controller's MarkPodsNotReady and SetPodTerminationReason:
    _set_status(api, "workers-c", {
        "phase": "Running",
        "reason": "NodeUnreachable",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": running,
    })  # fmt: skip
    api.core.delete_namespaced_pod("workers-c", NAMESPACE, grace_period_seconds=0)
    wait_for(lambda: ("workers-c", True) in seen(), what="the deletion handled", timeout=WAIT)

    job = queue.get(job_id)
    assert (job.status, job.lease_owner) == ("running", "workers-c-1-aaaaaa")
    assert job.lease_expires_at is not None
    assert job.lease_expires_at > datetime.now(UTC) + timedelta(seconds=LEASE / 2)
