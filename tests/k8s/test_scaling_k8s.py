"""The operator scales a Deployment from queue depth in PostgreSQL (emulated API server)."""

from __future__ import annotations

import leaseq
import pytest
from conftest import Api, StartOperator, eventually

pytestmark = pytest.mark.k8s


def test_enqueue_scales_up_then_drain_scales_to_zero(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue
) -> None:
    api.create_deployment("workers", replicas=0)
    start_operator()
    api.create_pool(
        "ocr",
        {
            "deployment": "workers",
            "queues": ["ocr"],
            "jobsPerReplica": 2,
            "maxReplicas": 4,
            "pollSeconds": 0.1,
            "scaleDownStabilizationSeconds": 0.5,
        },
    )
    for n in range(5):
        queue.enqueue("ocr", "extract", {"n": n})
    eventually(lambda: api.replicas("workers") == 3, what="ceil(5 / 2) replicas")
    status = eventually(lambda: api.pool("ocr").get("status", {}).get("desiredReplicas") == 3)
    assert status
    for job in queue.claim(["ocr"], "w1", limit=5):
        queue.complete(job.lease)
    eventually(lambda: api.replicas("workers") == 0, what="scaled to zero after the window")
    assert api.events("ScaledUp") and api.events("ScaledDown")
