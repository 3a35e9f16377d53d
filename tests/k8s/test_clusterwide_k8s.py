"""``clusterWide`` mode (issue 46): an operator watching every namespace scales only a
Deployment labelled for the WorkerPool that names it (``leaseq.dev/worker-pool: <pool>`` in
its selector), and refuses any other with a status condition, without a single write to it."""

from __future__ import annotations

import pytest
from emulator import EmulatorServer
from harness import NAMESPACE, Api, StartOperator

import leaseq
from leaseq_operator import conditions
from leaseq_operator.kube import POOL_LABEL
from support.polling import wait_for

pytestmark = pytest.mark.k8s

DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"


def _pool(deployment: str) -> dict[str, object]:
    return {"deployment": deployment, "queues": ["ocr"], "jobsPerReplica": 2, "pollSeconds": 0.1}


def test_only_a_deployment_labelled_for_its_pool_is_scaled(
    api: Api, emulator: EmulatorServer, start_operator: StartOperator, queue: leaseq.Queue
) -> None:
    api.create_deployment("workers", replicas=0, labels={POOL_LABEL: "ocr"})
    api.create_deployment("payments", replicas=3)  # no label: someone else's Deployment
    start_operator(namespace="")  # every namespace
    api.create_pool("ocr", _pool("workers"))
    api.create_pool("rogue", _pool("payments"))
    api.create_pool("thief", _pool("workers"))  # labelled, but for another pool
    for n in range(3):
        queue.enqueue("ocr", "extract", {"n": n})
    wait_for(lambda: api.replicas("workers") == 2, what="the labelled Deployment scaled")
    for pool, found in (("rogue", "none"), ("thief", "'ocr'")):
        refused = wait_for(
            lambda pool=pool: (
                (api.condition(pool, conditions.TARGET_FOUND) or {}).get("reason")
                == "DeploymentNotLabelled"
                and api.condition(pool, conditions.TARGET_FOUND)
            ),
            what=f"{pool} refused",
        )
        assert refused["status"] == "False"
        assert f"{POOL_LABEL}: {pool}" in refused["message"], refused
        assert f"(found: {found})" in refused["message"], refused
        assert "desiredReplicas" not in api.pool(pool).get("status", {})
    assert api.events("DeploymentNotLabelled")
    assert api.replicas("payments") == 3
    touched = [
        w.path for w in emulator.emulator.writes if w.path.startswith(f"{DEPLOYMENTS}/payments")
    ]
    assert touched == []
    assert api.condition("ocr", conditions.TARGET_FOUND)["status"] == "True"  # type: ignore[index]
