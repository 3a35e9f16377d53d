"""The operator scales a Deployment from queue depth in PostgreSQL (emulated API server)."""

from __future__ import annotations

import json

import psycopg
import pytest
from harness import Api, StartOperator, register_worker
from psycopg.conninfo import conninfo_to_dict

import leaseq
from leaseq_operator.kube import POOL_LABEL
from leaseq_operator.protection import DELETION_COST
from support import net
from support.polling import wait_for

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
    wait_for(lambda: api.replicas("workers") == 3, what="ceil(5 / 2) replicas")
    status = wait_for(lambda: api.pool("ocr").get("status", {}).get("desiredReplicas") == 3)
    assert status
    for job in queue.claim(["ocr"], "w1", limit=5):
        queue.complete(job.lease)
    wait_for(lambda: api.replicas("workers") == 0, what="scaled to zero after the window")
    assert api.events("ScaledUp")
    assert api.events("ScaledDown")


def test_scale_down_spares_busy_pods_and_marks_them_expensive(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    api.create_deployment("workers", replicas=5)
    pods = ["pod-a", "pod-b", "pod-c", "pod-d", "pod-e"]
    for pod in pods:
        api.create_pod(pod, "workers")
    for worker, pod in zip(["w-a", "w-b", "w-c", "w-d"], pods, strict=False):
        register_worker(conn, worker, pod)
    long_ago = conn.execute("SELECT now() - interval '10 minutes'").fetchone()[0]  # type: ignore[index]
    for n in range(4):
        queue.enqueue("ocr", "extract", {"n": n}, now=long_ago)
    # pod-a: two jobs for 10 minutes; pod-b: one for 10 minutes; pod-c: one just started.
    queue.claim(["ocr"], "w-a", limit=2, lease_seconds=3600, now=long_ago)
    queue.claim(["ocr"], "w-b", lease_seconds=3600, now=long_ago)
    [recent] = queue.claim(["ocr"], "w-c", lease_seconds=3600)
    start_operator()
    api.create_pool(
        "ocr",
        {
            "deployment": "workers",
            "queues": ["ocr"],
            "jobsPerReplica": 4,  # 4 running jobs ask for 1 replica ...
            "pollSeconds": 0.1,
            "scaleDownStabilizationSeconds": 0,
        },
    )
    # ... but three pods are busy: the pool shrinks to 3, never below its busy pods.
    wait_for(lambda: api.replicas("workers") == 3, what="shrunk to the busy pods")
    cost = {pod: int(api.annotations(pod)[DELETION_COST]) for pod in pods}
    assert cost["pod-d"] == cost["pod-e"] == 0
    assert cost["pod-a"] > cost["pod-b"] > cost["pod-c"] > 0
    versions = {
        pod: api.core.read_namespaced_pod(pod, "default").metadata.resource_version for pod in pods
    }

    # pod-c's job ends: it is idle now; the next scale-down re-marks only pod-c.
    queue.complete(recent.lease)
    wait_for(lambda: api.replicas("workers") == 2, what="shrunk to the two busy pods")
    assert api.annotations("pod-c")[DELETION_COST] == "0"
    unchanged = [p for p in pods if p != "pod-c"]
    assert {
        p: api.core.read_namespaced_pod(p, "default").metadata.resource_version for p in unchanged
    } == {p: versions[p] for p in unchanged}


def test_database_down_holds_replicas_and_sets_a_condition(
    api: Api,
    start_operator: StartOperator,
    queue: leaseq.Queue,
    server_url: str,
    database_url: str,
) -> None:
    api.create_deployment("workers", replicas=0)
    for n in range(3):
        queue.enqueue("ocr", "extract", {"n": n})
    # The replica that led reports the outage for one lease TTL after its last renewal: the
    # failed read must be written within it. The suite's 2 s TTL is short for a loaded
    # machine (the read waits up to database_timeout first); this test is about the outage,
    # not failover, so its TTL leaves ample room.
    start_operator(leader_ttl_seconds=60.0)
    api.create_pool(
        "ocr",
        {
            "deployment": "workers",
            "queues": ["ocr"],
            "pollSeconds": 0.1,
            "scaleDownStabilizationSeconds": 0,
        },
    )
    wait_for(lambda: api.replicas("workers") == 3, what="scaled up to 3")
    name = conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        condition = wait_for(
            lambda: (
                (c := api.condition("ocr", "DatabaseReachable")) and c["status"] == "False" and c
            )
        )
        assert "unreachable" in condition["message"] or "connect" in condition["message"]
        assert api.replicas("workers") == 3  # held: nothing was scaled on missing data
        # The operator posts the Event after it writes the status (PoolTick.flush): seeing
        # the condition does not mean the Event exists yet, so wait for it.
        wait_for(lambda: api.events("DatabaseUnreadable"), what="the DatabaseUnreadable event")
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    # The database is back: the jobs are still there, and so are the replicas.
    wait_for(lambda: (api.condition("ocr", "DatabaseReachable") or {}).get("status") == "True")
    assert api.replicas("workers") == 3


def test_invalid_workerpool_is_refused_with_a_readable_message(
    api: Api, start_operator: StartOperator
) -> None:
    api.create_deployment("workers", replicas=2)
    start_operator()
    # The emulator does not enforce the CRD schema (tests/unit/test_crd.py does): this spec
    # reaches the operator, whose own check must refuse it.
    api.create_pool(
        "bad",
        {"deployment": "workers", "queues": ["ocr"], "minReplicas": 5, "maxReplicas": 2},
    )
    condition = wait_for(lambda: api.condition("bad", "SpecValid"))
    assert condition["status"] == "False"
    assert condition["message"] == (
        "spec.maxReplicas (2) must be greater than or equal to spec.minReplicas (5)"
    )
    [event] = api.events("InvalidSpec")
    assert event.type == "Warning"
    assert api.replicas("workers") == 2

    # Fixed in place: the next tick accepts it.
    api.custom.patch_namespaced_custom_object(
        "leaseq.dev", "v1", "default", "workerpools", "bad", {"spec": {"maxReplicas": 8}}
    )
    wait_for(lambda: (api.condition("bad", "SpecValid") or {}).get("status") == "True")


def test_no_finalizers_liveness_and_deletion(api: Api, start_operator: StartOperator) -> None:
    api.create_deployment("workers", replicas=1, labels={POOL_LABEL: "ocr"})  # cluster-wide
    port = net.free_port()
    operator = start_operator(health_port=port, namespace="")  # cluster-wide, the default
    api.create_pool("ocr", {"deployment": "workers", "queues": ["ocr"], "pollSeconds": 0.1})
    wait_for(lambda: api.pool("ocr").get("status", {}).get("desiredReplicas") is not None)
    # Nothing the operator touches is held by it: a finalizer would outlive the operator's
    # RBAC on uninstall (tests/k8s/test_lifecycle_k8s.py).
    assert not api.pool("ocr")["metadata"].get("finalizers")
    deployment = api.apps.read_namespaced_deployment("workers", "default")
    assert not deployment.metadata.finalizers

    status, body = net.get(f"http://127.0.0.1:{port}/healthz")
    assert status == 200, body
    health = json.loads(body)
    assert health["reaper"] == {"leading": True}

    registry = operator.app.metrics.registry
    gauge = "leaseq_workerpool_desired_replicas"
    assert registry.get_sample_value(gauge, {"workerpool": "default/ocr"}) is not None
    api.custom.delete_namespaced_custom_object("leaseq.dev", "v1", "default", "workerpools", "ocr")
    wait_for(
        lambda: (
            not api.custom.list_namespaced_custom_object(
                "leaseq.dev", "v1", "default", "workerpools"
            )["items"]
        ),
        what="the WorkerPool is gone",
    )
    wait_for(lambda: registry.get_sample_value(gauge, {"workerpool": "default/ocr"}) is None)
    assert api.replicas("workers") == 1
