"""WorkerPools with scaleOn Work against the emulated API server and a real PostgreSQL: the
pool is sized from recent run times in job_attempts, and pods whose workers are still
loading count as capacity already coming."""

from __future__ import annotations

from typing import Any

import pytest
from harness import Api, StartOperator

import leaseq
from support.polling import wait_for

pytestmark = pytest.mark.k8s

POOL: dict[str, Any] = {
    "deployment": "workers",
    "queues": ["ocr"],
    "jobsPerReplica": 2,
    "maxReplicas": 10,
    "pollSeconds": 0.1,
    "scaleOn": "Work",
}


def backlog(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, job_type: str, took: int, ready: int
) -> None:
    """``ready`` jobs of ``job_type``, whose three earlier jobs each ran ``took`` seconds
    and ended a minute ago (in job_attempts, where the operator reads run times)."""
    start, end = conn.execute(
        "SELECT now() - make_interval(secs => 60 + %s), now() - interval '60 seconds'", [took]
    ).fetchone()  # type: ignore[misc]
    for i in range(3):
        queue.enqueue("ocr", job_type, {"done": i}, now=start)
    for job in queue.claim(["ocr"], "w-old", limit=3, lease_seconds=3600, now=start):
        queue.complete(job.lease, now=end)
    for n in range(ready):
        queue.enqueue("ocr", job_type, {"n": n})


def start_pool(api: Api, start_operator: StartOperator, work: dict[str, Any]) -> None:
    """An empty Deployment, the operator, and a WorkerPool that scales it on work."""
    api.create_deployment("workers", replicas=0)
    start_operator()
    api.create_pool("ocr", {**POOL, "work": work})


def status(api: Api) -> dict[str, Any]:
    found: dict[str, Any] = api.pool("ocr").get("status", {})
    return found


def test_short_jobs_need_one_replica_where_counts_ask_for_ten(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    backlog(queue, conn, "thumbnail", took=1, ready=100)
    # Drain 100 work-seconds within 100 s; a new pod works 80 s of them at 2 jobs at once.
    start_pool(api, start_operator, {"targetSeconds": 100, "startupSeconds": 20})
    wait_for(lambda: api.replicas("workers") == 1, what="one replica")
    wait_for(lambda: status(api).get("workSeconds") == 100)
    assert status(api)["desiredReplicas"] == 1
    # The event is posted after the scale; wait for it rather than race its post.
    wait_for(lambda: api.events("ScaledUp"), what="the ScaledUp event")
    assert [e.message for e in api.events("ScaledUp")] == [
        "workers from 0 to 1 replicas: scale up: 100 ready, 0 due soon, 0 running at 2 per"
        " replica; 100 work-seconds within 100s (0 active, 0 loading, start-up 20s) ask for 1"
        " (bounds 0..10)"
    ]


def test_pods_loading_their_model_do_not_make_the_pool_grow_again(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    backlog(queue, conn, "extract", took=60, ready=10)
    work = {"target": "OldestReadyAge", "targetSeconds": 120, "startupSeconds": 30}
    start_pool(api, start_operator, work)
    # 600 work-seconds; a new pod works 120 - 30 s at 2 jobs at once: 180, so 4 pods.
    wait_for(lambda: api.replicas("workers") == 4, what="4 replicas for 600 work-seconds")
    # The 4 pods start, and their workers load their model for 25 s while the jobs wait.
    pods = [f"workers-{i}" for i in range(4)]
    for pod in pods:
        api.create_pod(pod, "workers")
        leaseq.Workers(conn).register(
            f"w-{pod}",
            pod=pod,
            node="node-1",
            queues=["ocr"],
            concurrency=2,
            state=leaseq.WorkerState.LOADING,
            in_flight=0,
        )
    conn.execute("UPDATE leaseq.workers SET started_at = started_at - interval '25 seconds'")
    conn.execute(
        "UPDATE leaseq.jobs SET available_at = available_at - interval '25 seconds',"
        " created_at = created_at - interval '25 seconds' WHERE status = 'pending'"
    )
    # A reading after both: 95 s left for the oldest job; each loading pod needs 5 s more.
    seen = wait_for(
        lambda: (s := status(api)).get("loadingReplicas") == 4 and s["oldestReadyAge"] >= 25 and s
    )
    assert seen["desiredReplicas"] == 4
    assert api.replicas("workers") == 4
    assert len(api.events("ScaledUp")) == 1
