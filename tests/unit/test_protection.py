"""Scale-down protection as pure functions: loads per pod, deletion costs, the busy floor."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubernetes.client import V1LabelSelector, V1LabelSelectorRequirement

from leaseq.core.models import WorkerRecord
from leaseq_operator.kube import label_selector
from leaseq_operator.protection import (
    DELETION_COST,
    SAFE_TO_EVICT,
    PodLoad,
    cost_changes,
    deletion_cost,
    eviction_changes,
    limit_scale_down,
    pod_loads,
    safe_to_evict,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def worker(worker_id: str, pod: str | None, running: int, age: float | None) -> WorkerRecord:
    return WorkerRecord(worker_id, pod, "node", ["ocr"], 4, "running", T0, T0, 1.0, running, age)


def test_loads_add_up_per_pod_and_unknown_pods_are_idle() -> None:
    loads = pod_loads(
        ["p1", "p2", "p3"],
        [
            worker("w1", "p1", 2, 30.0),
            worker("w2", "p1", 1, 300.0),  # two worker processes in one pod
            worker("w3", "p2", 0, None),
            worker("w4", "elsewhere", 5, 9.0),  # not a pod of this Deployment
            worker("w5", None, 1, 1.0),
        ],
    )
    assert loads == {
        "p1": PodLoad("p1", 3, 300.0),
        "p2": PodLoad("p2", 0, None),
        "p3": PodLoad("p3", 0, None),
    }


def test_costs_order_idle_then_fewer_then_younger_jobs() -> None:
    idle = deletion_cost(PodLoad("a"))
    young = deletion_cost(PodLoad("b", 1, 5.0))
    old = deletion_cost(PodLoad("c", 1, 3600.0))
    busier = deletion_cost(PodLoad("d", 2, 5.0))
    assert idle == 0
    assert 0 < young < old < busier
    assert deletion_cost(PodLoad("e", 100_000, 10**9)) == 2**31 - 1  # int32 bound


def test_cost_changes_only_patch_what_differs() -> None:
    loads = {"a": PodLoad("a"), "b": PodLoad("b", 1, 90.0), "c": PodLoad("c", 1, 95.0)}
    annotations = {
        "a": {DELETION_COST: "0"},
        "b": {DELETION_COST: str(deletion_cost(loads["b"]))},
        "c": {},
    }
    # b and c are in the same minute: c gets the same cost b already has.
    assert cost_changes(loads, annotations) == {"c": str(deletion_cost(loads["b"]))}


@pytest.mark.parametrize(
    ("current", "desired", "busy", "result"),
    [
        (5, 1, 3, 3),  # three busy pods: shrink only the two idle ones
        (5, 1, 0, 1),
        (5, 4, 3, 4),
        (3, 0, 5, 3),  # more busy pods than replicas (a rollout): never grow by protection
        (2, 6, 1, 6),  # scale-ups are not touched
        (4, 2, 4, 4),
    ],
)
def test_scale_down_never_needs_a_busy_pod(
    current: int, desired: int, busy: int, result: int
) -> None:
    assert limit_scale_down(current, desired, busy) == result


def test_deployment_selectors_become_label_selectors() -> None:
    selector = V1LabelSelector(
        match_labels={"app": "workers", "tier": "jobs"},
        match_expressions=[
            V1LabelSelectorRequirement(key="track", operator="In", values=["stable", "canary"]),
            V1LabelSelectorRequirement(key="legacy", operator="DoesNotExist"),
            V1LabelSelectorRequirement(key="zone", operator="Exists"),
            V1LabelSelectorRequirement(key="env", operator="NotIn", values=["dev"]),
        ],
    )
    assert label_selector(selector) == (
        "app=workers,tier=jobs,track in (stable,canary),!legacy,zone,env notin (dev)"
    )


def test_safe_to_evict_follows_busyness_and_only_changes_are_patched() -> None:
    loads = {
        "idle": PodLoad("idle"),
        "busy": PodLoad("busy", 2, 30.0),
        "was-busy": PodLoad("was-busy"),
        "new": PodLoad("new", 1, 1.0),
    }
    assert safe_to_evict(loads["idle"]) == "true"
    assert safe_to_evict(loads["busy"]) == "false"
    annotations = {
        "idle": {SAFE_TO_EVICT: "true"},
        "busy": {SAFE_TO_EVICT: "false", DELETION_COST: "7"},
        "was-busy": {SAFE_TO_EVICT: "false"},
        "new": {},  # a pod the operator has not seen yet
    }
    assert eviction_changes(loads, annotations) == {"was-busy": "true", "new": "false"}
