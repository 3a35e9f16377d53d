"""The operator keeps cluster-autoscaler.kubernetes.io/safe-to-evict on worker pods in step
with their busyness on every tick, not only when it scales down (emulated API server, real
PostgreSQL, real kopf)."""

from __future__ import annotations

import pytest
from harness import Api, StartOperator, register_worker

import leaseq
from leaseq_operator.protection import DELETION_COST, SAFE_TO_EVICT
from support.polling import wait_for

pytestmark = pytest.mark.k8s


def test_busy_pods_are_not_safe_to_evict_and_idle_ones_are(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    api.create_deployment("workers", replicas=2)
    for pod, worker in [("pod-a", "w-a"), ("pod-b", "w-b")]:
        api.create_pod(pod, "workers")
        register_worker(conn, worker, pod)
    queue.enqueue("ocr", "ocr", {"doc": 1})
    [job] = queue.claim(["ocr"], "w-a", lease_seconds=3600)
    start_operator()
    api.create_pool(
        "ocr",
        {
            "deployment": "workers",
            "queues": ["ocr"],
            "minReplicas": 2,  # no scale-down: the annotation must follow busyness anyway
            "pollSeconds": 0.1,
        },
    )

    def evictable() -> dict[str, str | None]:
        return {p: api.annotations(p).get(SAFE_TO_EVICT) for p in ("pod-a", "pod-b")}

    wait_for(lambda: evictable() == {"pod-a": "false", "pod-b": "true"}, "busy pod-a protected")
    assert api.replicas("workers") == 2
    assert DELETION_COST not in api.annotations("pod-a")  # costs are for scale-downs only

    queue.complete(job.lease)  # pod-a goes idle; then pod-b starts a job
    wait_for(lambda: evictable() == {"pod-a": "true", "pod-b": "true"}, "idle pod-a evictable")
    queue.enqueue("ocr", "ocr", {"doc": 2})
    queue.claim(["ocr"], "w-b", lease_seconds=3600)
    wait_for(lambda: evictable() == {"pod-a": "true", "pod-b": "false"}, "busy pod-b protected")
