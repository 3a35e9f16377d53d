"""The operator scales on claimable work: a backlog of a key at its concurrency limit adds no
pods (emulated API server, real PostgreSQL)."""

from __future__ import annotations

import pytest
from harness import Api, StartOperator

import leaseq
from support.polling import wait_for

pytestmark = pytest.mark.k8s


def test_a_saturated_backlog_adds_no_pods(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    leaseq.FlowControl(conn).set_limit("ocr", "tenant-1", max_running=2)
    api.create_deployment("workers", replicas=0)
    start_operator()
    spec = {
        "deployment": "workers",
        "queues": ["ocr"],
        "jobsPerReplica": 2,
        "maxReplicas": 10,
        "pollSeconds": 0.1,
        "scaleDownStabilizationSeconds": 0.5,
    }
    api.create_pool("ocr", spec)
    queue.enqueue_many([leaseq.JobSpec("ocr", "extract", key="tenant-1") for _ in range(40)])
    # 40 ready, but only 2 claimable: one replica's worth.
    wait_for(lambda: api.pool("ocr").get("status", {}).get("claimable") == 2, "claimable read")
    wait_for(lambda: api.replicas("workers") == 1, what="ceil(2 claimable / 2) replicas")
    held = [j for _ in range(2) for j in queue.claim(["ocr"], "w1", lease_seconds=3600)]
    assert len(held) == 2

    # Saturated: 38 ready, 0 claimable, 2 running -> still one replica, never more. The
    # depth and the claimable count are separate reads of one poll, so a poll between the two
    # claims' commits can show 39 ready and 0 claimable: wait for both.
    def saturated() -> bool:
        status = api.pool("ocr").get("status", {})
        return bool(status.get("claimable") == 0 and status.get("ready") == 38)

    wait_for(saturated, "saturated: 38 ready, 0 claimable")
    status = api.pool("ocr")["status"]
    assert status["desiredReplicas"] == 1
    assert api.replicas("workers") == 1
    # Raise the limit: the same backlog is claimable now, and the pool grows.
    leaseq.FlowControl(conn).set_limit("ocr", "tenant-1", max_running=10)
    wait_for(lambda: api.replicas("workers") == 5, what="ceil((8 claimable + 2 running) / 2)")
