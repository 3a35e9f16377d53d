"""A refused pod annotation patch never stops scaling (issue 17): the emulated API server
denies every pod PATCH as a ValidatingAdmissionPolicy does (HTTP 422, a Status body; see
LeaseqEmulator._denied), and the pool still scales up and down, while the WorkerPool says why
(condition, Warning Event with the server's message) and the failures are counted."""

from __future__ import annotations

import pytest
from emulator import EmulatorServer
from harness import Api, StartOperator, register_worker

import leaseq
from leaseq_operator.protection import SAFE_TO_EVICT
from support.polling import wait_for

pytestmark = pytest.mark.k8s

POLICY = "leaseq-operator-pods-jobs"
DENIAL = "expression 'request.subResource == ''' resulted in error: no such key: subResource"


def test_denied_annotations_do_not_stop_scaling_and_are_reported(
    api: Api,
    emulator: EmulatorServer,
    start_operator: StartOperator,
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
) -> None:
    api.create_deployment("workers", replicas=1)
    api.create_pod("pod-a", "workers")  # idle: the operator wants it safe-to-evict
    register_worker(conn, "w-a", "pod-a")
    emulator.emulator.deny_updates("pods", POLICY, DENIAL)
    for n in range(6):
        queue.enqueue("ocr", "extract", {"n": n})
    operator = start_operator()
    api.create_pool(
        "ocr",
        {
            "deployment": "workers",
            "queues": ["ocr"],
            "jobsPerReplica": 1,
            "maxReplicas": 6,
            "pollSeconds": 0.1,
            "scaleDownStabilizationSeconds": 0,
        },
    )
    wait_for(lambda: api.replicas("workers") == 6, what="scaled up despite the denied patches")

    condition = wait_for(lambda: api.condition("ocr", "PodsAnnotated"), what="the condition")
    assert condition["status"] == "False"
    assert condition["reason"] == "AnnotationFailed"
    server_says = f"pods \"pod-a\" is forbidden: ValidatingAdmissionPolicy '{POLICY}'"
    assert server_says in condition["message"], condition
    assert DENIAL in condition["message"]
    [event] = wait_for(lambda: api.events("AnnotationFailed"), what="the Warning event")
    assert event.type == "Warning"
    assert server_says in event.message and "HTTP 422" in event.message
    involved = event.involved_object
    assert (involved.kind, involved.name) == ("WorkerPool", "ocr")
    registry = operator.app.metrics.registry
    failures = "leaseq_workerpool_annotation_failures_total"
    assert (registry.get_sample_value(failures, {"workerpool": "default/ocr"}) or 0) >= 1
    assert SAFE_TO_EVICT not in api.annotations("pod-a")  # the denial held

    # The work is done: the pool shrinks even though deletion costs cannot be written.
    for job in queue.claim(["ocr"], "w-other", limit=6):
        queue.complete(job.lease)
    wait_for(lambda: api.replicas("workers") == 0, what="scaled down despite the denials")

    # The policy is fixed: the annotation is written and the condition recovers.
    emulator.emulator.denied_updates.clear()
    wait_for(lambda: api.annotations("pod-a").get(SAFE_TO_EVICT) == "true", "pod-a annotated")
    recovered = wait_for(
        lambda: (c := api.condition("ocr", "PodsAnnotated")) and c["status"] == "True" and c
    )
    assert recovered["reason"] == "Annotated"
