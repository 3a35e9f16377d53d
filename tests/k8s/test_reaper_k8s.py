"""Two operator replicas against one database: exactly one leads, reaps and scales."""

from __future__ import annotations

import pytest
from harness import Api, StartOperator
from prometheus_client import CollectorRegistry

import leaseq
from support.polling import wait_for

pytestmark = pytest.mark.k8s


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _expire(queue: leaseq.Queue, conn: leaseq.core.db.Conn, worker: str, count: int) -> list[int]:
    """Jobs claimed by ``worker`` whose leases ran out a minute ago (the worker died)."""
    past = conn.execute("SELECT now() - interval '2 minutes'").fetchone()[0]  # type: ignore[index]
    ids = [queue.enqueue("ocr", "extract", now=past).job_id for _ in range(count)]
    claimed = queue.claim(["ocr"], worker, limit=count, lease_seconds=60, now=past)
    assert sorted(job.id for job in claimed) == sorted(ids)
    return ids


def test_only_the_leader_reaps_and_a_standby_takes_over(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    first, second = start_operator(), start_operator()
    operators = [first, second]
    wait_for(lambda: sum(op.app.leading for op in operators) == 1, what="one leader")
    leader = next(op for op in operators if op.app.leading)
    standby = next(op for op in operators if not op.app.leading)

    holder, term = conn.execute(
        "SELECT holder, term FROM leaseq.leader_leases WHERE name = 'reaper'"
    ).fetchone()  # type: ignore[misc]
    assert (holder, term) == (leader.app.config.operator_id, leader.app.reaper.lease.term)

    ids = _expire(queue, conn, "dead-worker", 3)
    wait_for(lambda: all(queue.get(i).status == "pending" for i in ids), what="reaped")
    reaped = "leaseq_reaped_total"
    assert _sample(leader.app.metrics.registry, reaped, queue="ocr", outcome="retried") == 3
    assert _sample(standby.app.metrics.registry, reaped, queue="ocr", outcome="retried") == 0
    assert _sample(leader.app.metrics.registry, "leaseq_reaper_leader") == 1
    assert _sample(standby.app.metrics.registry, "leaseq_reaper_leader") == 0
    for job_id in ids:
        [attempt] = queue.attempts(job_id)
        assert attempt.outcome == "lease_expired"
        assert attempt.worker == "dead-worker"
        # Reaped jobs keep their place at the head of the queue: out of the next claim's way.
        queue.cancel(job_id)

    # The leader stops (releasing its lease): the standby leads and reaps from now on.
    leader.stop()
    wait_for(lambda: standby.app.leading, what="the standby took over")
    more = _expire(queue, conn, "another-dead-worker", 2)
    wait_for(lambda: all(queue.get(i).status == "pending" for i in more), what="reaped again")
    assert _sample(standby.app.metrics.registry, reaped, queue="ocr", outcome="retried") == 2


def test_only_the_leader_scales(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue
) -> None:
    api.create_deployment("workers", replicas=0)
    operators = [start_operator(), start_operator()]
    wait_for(lambda: sum(op.app.leading for op in operators) == 1, what="one leader")
    api.create_pool("ocr", {"deployment": "workers", "queues": ["ocr"], "pollSeconds": 0.1})
    queue.enqueue_many([leaseq.JobSpec("ocr", "extract"), leaseq.JobSpec("ocr", "extract")])
    wait_for(lambda: api.replicas("workers") == 2)
    [scaled] = wait_for(lambda: api.events("ScaledUp"))
    assert "from 0 to 2" in scaled.message
    gauges = [
        _sample(
            op.app.metrics.registry, "leaseq_workerpool_desired_replicas", workerpool="default/ocr"
        )
        for op in operators
    ]
    assert sorted(gauges) == [0, 2]


def test_a_worker_holding_the_lease_is_named_on_the_pool_and_in_the_log(
    api: Api,
    start_operator: StartOperator,
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker started with ``--lead true`` took the leader lease before any operator led:
    no operator replica leads, so none scales. The pool says who holds the lease
    (``LeaderLease=False``, reason ``HeldByWorker``, with a Warning Event) and the operator
    logs it once; once the worker's lease is gone the operator leads and scales."""
    conn.execute(
        "INSERT INTO leaseq.leader_leases (name, holder, term, expires_at, holder_kind)"
        " VALUES ('reaper', 'worker-7', 3, now() + interval '1 hour', 'worker')"
    )
    api.create_deployment("workers", replicas=0)
    queue.enqueue("ocr", "extract")
    operator = start_operator()
    api.create_pool("ocr", {"deployment": "workers", "queues": ["ocr"], "pollSeconds": 0.1})
    held = wait_for(lambda: api.condition("ocr", "LeaderLease"), what="the LeaderLease condition")
    assert (held["status"], held["reason"]) == ("False", "HeldByWorker")
    assert "worker worker-7 holds the leader lease (term 3" in held["message"]
    assert "--lead false" in held["message"]
    [event] = wait_for(lambda: api.events("HeldByWorker"))
    assert event.type == "Warning"
    assert api.replicas("workers") == 0
    assert not operator.app.leading
    said = [r for r in caplog.records if "held by worker worker-7" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]

    conn.execute("DELETE FROM leaseq.leader_leases WHERE holder = 'worker-7'")
    wait_for(lambda: api.replicas("workers") == 1, what="the operator leads and scales")
    led = wait_for(
        lambda: (c := api.condition("ocr", "LeaderLease")) and c["status"] == "True" and c,
        what="LeaderLease=True",
    )
    assert led["reason"] == "HeldByOperator"
    assert operator.app.config.operator_id in led["message"]
    assert len([r for r in caplog.records if "held by worker worker-7" in r.getMessage()]) == 1
