"""The operator's /metrics: queue series computed from PostgreSQL at scrape time."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

import leaseq
from leaseq.core.models import Reaped
from leaseq_operator.metrics import OperatorMetrics
from support import net


def _value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_queue_series_come_from_the_database(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    metrics = OperatorMetrics()
    metrics.watch_queues(queue, leaseq.Workers(conn))
    for n in range(3):
        queue.enqueue("ocr", "extract", {"n": n})
    queue.enqueue("ocr", "extract", delay=3600)
    leaseq.Workers(conn).register(
        "w1",
        pod="p1",
        node=None,
        queues=["ocr", "mail"],
        concurrency=1,
        state=leaseq.WorkerState.RUNNING,
        in_flight=0,
    )
    [job] = queue.claim(["ocr"], "w1")
    assert _value(metrics, "leaseq_queue_jobs", queue="ocr", state="ready") == 2
    assert _value(metrics, "leaseq_queue_jobs", queue="ocr", state="scheduled") == 1
    assert _value(metrics, "leaseq_queue_jobs", queue="ocr", state="running") == 1
    assert _value(metrics, "leaseq_queue_jobs", queue="ocr", state="dead") == 0
    assert _value(metrics, "leaseq_queue_workers", queue="ocr") == 1
    assert _value(metrics, "leaseq_queue_workers", queue="mail") == 1
    assert (_value(metrics, "leaseq_queue_oldest_ready_age_seconds", queue="ocr") or 0) >= 0
    assert _value(metrics, "leaseq_queue_max_heartbeat_age_seconds", queue="ocr") is not None
    assert _value(metrics, "leaseq_operator_database_up") == 1
    queue.fail(job.lease, "boom", retryable=False)
    assert _value(metrics, "leaseq_queue_jobs", queue="ocr", state="dead") == 1


def test_unreadable_database_is_reported_not_raised(server_url: str) -> None:
    metrics = OperatorMetrics()
    with leaseq.open_pool(server_url + "-does-not-exist", timeout=0.5) as broken:
        metrics.watch_queues(leaseq.Queue(broken), leaseq.Workers(broken))
        text = generate_latest(metrics.registry).decode()
    assert "leaseq_operator_database_up 0.0" in text
    assert "leaseq_queue_jobs" not in text


def test_counters_gauges_and_http(queue: leaseq.Queue) -> None:
    metrics = OperatorMetrics()
    metrics.known_queues(("ocr",))
    assert _value(metrics, "leaseq_reaped_total", queue="ocr", outcome="dead") == 0
    metrics.count_reaped(Reaped(1, "ocr", "extract", "dead", "w1", 1, 5, False))
    metrics.count_reaped(Reaped(2, "ocr", "extract", "pending", "w1", 1, 1, False))
    assert _value(metrics, "leaseq_reaped_total", queue="ocr", outcome="dead") == 1
    assert _value(metrics, "leaseq_reaped_total", queue="ocr", outcome="retried") == 1
    metrics.pool("default/ocr", desired=3, current=1)
    assert _value(metrics, "leaseq_workerpool_desired_replicas", workerpool="default/ocr") == 3
    metrics.forget_pool("default/ocr")
    assert _value(metrics, "leaseq_workerpool_current_replicas", workerpool="default/ocr") is None
    metrics.serve(0)  # 0: off
    assert metrics._server is None
    metrics.leader.set(1)
    port = net.free_port()
    metrics.serve(port, addr="127.0.0.1")
    try:
        status, body = net.get(f"http://127.0.0.1:{port}/metrics")
    finally:
        metrics.close()
    assert status == 200
    assert "leaseq_reaper_leader 1.0" in body


def test_queue_series_are_capped_with_the_rest_summed_and_counted(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """20,000 queue names once made /metrics 7.5 MB (issue 11): at most max_queues queues
    get series of their own, WorkerPools' first, then the busiest."""
    metrics = OperatorMetrics()
    metrics.known_queues(("quiet",))
    metrics.watch_queues(queue, leaseq.Workers(conn), max_queues=3)
    queue.enqueue_many(
        [leaseq.JobSpec(f"q{n:02d}", "t", {}) for n in range(20) for _ in range(n % 5 + 1)]
    )
    queue.enqueue("quiet", "t", delay=3600)
    text = generate_latest(metrics.registry).decode()
    shown = {line.split('queue="')[1].split('"')[0] for line in text.splitlines()
             if line.startswith("leaseq_queue_jobs{")}  # fmt: skip
    # quiet (a WorkerPool's), then the three busiest by name, cut to 3, plus _other.
    assert shown == {"quiet", "q04", "q09", "_other"}
    assert _value(metrics, "leaseq_queue_series_folded") == 18
    folded = sum(n % 5 + 1 for n in range(20)) - 10
    assert _value(metrics, "leaseq_queue_jobs", queue="_other", state="ready") == folded
    assert "18 queues exceed the metrics cap of 3" in caplog.text
    # The reaped counter is capped the same way.
    for n in range(6):
        metrics.count_reaped(Reaped(n, f"r{n}", "t", leaseq.JobStatus.DEAD, "w", 1, 1, False))
    reaped = {s.labels["queue"] for f in metrics.registry.collect() if f.name == "leaseq_reaped"
              for s in f.samples}  # fmt: skip
    assert reaped == {"quiet", "r0", "r1", "r2", "_other"}


def test_flow_series_come_from_the_database(queue: leaseq.Queue, conn: leaseq.core.db.Conn) -> None:
    metrics = OperatorMetrics()
    metrics.watch_flow(leaseq.FlowControl(conn))
    flow = leaseq.FlowControl(conn)
    flow.set_limit("ocr", "t1", max_running=1)
    for _ in range(3):
        queue.enqueue("ocr", "extract", key="t1")
    queue.enqueue("ocr", "extract")
    queue.enqueue("ocr", "extract", ordering_key="o")
    queue.enqueue("ocr", "extract", ordering_key="o")
    assert _value(metrics, "leaseq_queue_claimable_jobs", queue="ocr") == 3  # 1 + t1's 1 + o's head
    assert _value(metrics, "leaseq_flow_saturated_keys", queue="ocr") == 0
    got = queue.claim(["ocr"], "w", limit=10)
    by_id = {j.id: j for j in got}
    assert len(got) == 3
    assert _value(metrics, "leaseq_queue_claimable_jobs", queue="ocr") == 0
    assert _value(metrics, "leaseq_flow_saturated_keys", queue="ocr") == 1
    head = next(j for j in by_id.values() if j.id == 5)
    queue.fail(head.lease, "poison", retryable=False)
    assert _value(metrics, "leaseq_flow_blocked_aggregates", queue="ocr") == 1
    assert metrics.registry.get_sample_value("leaseq_flow_repairs_total") == 0
    metrics.count_repairs({"ocr": 2})
    assert metrics.registry.get_sample_value("leaseq_flow_repairs_total") == 2
