"""Pods the scheduler cannot place show on their WorkerPool (issue 17): a GPU pool on a
cluster without GPU nodes says so, with the scheduler's own message, instead of looking
healthy while its pods stay Pending."""

from __future__ import annotations

from typing import Any

import pytest
from harness import NAMESPACE, Api, StartOperator

from support.polling import wait_for

pytestmark = pytest.mark.k8s

# The scheduler's message for a pod asking for a GPU no node has (kube-scheduler wording).
NO_GPU = (
    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are"
    " available: 3 No preemption victims found for incoming pod."
)


def _scheduled(status: str, reason: str | None = None, message: str | None = None) -> Any:
    """A pod status as the scheduler writes it: PodCondition (k8s.io/api/core/v1/types.go)
    has ``reason`` and ``message`` as ``omitempty`` strings, so a scheduled pod's condition
    has neither key; ``lastProbeTime`` is a metav1.Time the server serializes as null."""
    condition: dict[str, Any] = {
        "type": "PodScheduled",
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": "2026-12-01T10:00:00Z",
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return {"status": {"phase": "Pending", "conditions": [condition]}}


def test_unschedulable_pods_show_on_the_workerpool_with_the_schedulers_message(
    api: Api, start_operator: StartOperator
) -> None:
    api.create_deployment("gpu-workers", replicas=2)
    api.create_pod("gpu-a", "gpu-workers")
    api.create_pod("gpu-b", "gpu-workers")
    api.core.patch_namespaced_pod_status("gpu-a", NAMESPACE, _scheduled("True"))
    api.core.patch_namespaced_pod_status(
        "gpu-b", NAMESPACE, _scheduled("False", "Unschedulable", NO_GPU)
    )
    start_operator()
    api.create_pool(
        "gpu",
        {"deployment": "gpu-workers", "queues": ["ocr"], "minReplicas": 2, "pollSeconds": 0.1},
    )
    condition = wait_for(lambda: api.condition("gpu", "PodsScheduled"), what="the condition")
    assert condition["status"] == "False"
    assert condition["reason"] == "Unschedulable"
    assert condition["message"] == f"1 of 2 pods cannot be scheduled; gpu-b: {NO_GPU}"
    [event] = wait_for(lambda: api.events("Unschedulable"), what="the Warning event")
    assert event.type == "Warning" and NO_GPU in event.message

    # A GPU node joined: the pod is scheduled and the condition clears.
    api.core.patch_namespaced_pod_status("gpu-b", NAMESPACE, _scheduled("True"))
    cleared = wait_for(
        lambda: (c := api.condition("gpu", "PodsScheduled")) and c["status"] == "True" and c
    )
    assert cleared["reason"] == "Scheduled"
