"""Every metric (and label value) the dashboard and the alert rules use is one a running
worker or operator exports: a real `leaseq worker` process and the operator's metrics server,
both on a test database, scraped over HTTP (not a list of names that could drift from the
code). A real `leaseq reaper` process (no Kubernetes) exports the same queue series as the
operator, so the rules and the dashboard work without a cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from chartkit import CHART, MONITORING_API, Helm, of_kind, one
from metric_names import (
    Exported,
    dashboard_exprs,
    exported_samples,
    grafana_rule_exprs,
    promql_matchers,
    promql_names,
)

import leaseq
from leaseq_operator.metrics import OperatorMetrics
from support import net
from support.polling import wait_for
from support.workers import Workers

DASHBOARD = CHART / "dashboards" / "leaseq.json"
# Exported but on no panel, on purpose: per-pod debugging; the queue-level heartbeat age
# (computed in the database) is what the dashboard charts.
UNCHARTED = {"leaseq_last_heartbeat_timestamp_seconds"}
# Labels Prometheus adds to every series when it scrapes (not on /metrics itself).
TARGET_LABELS = {"namespace", "pod", "service", "job", "instance", "container", "endpoint"}


def scrape(port: int) -> dict[str, Exported]:
    status, text = net.get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, text
    return exported_samples(text)


@pytest.fixture
def worker_samples(database_url: str, tmp_path: Path) -> Iterator[dict[str, Exported]]:
    """A `leaseq worker` process serving the chart's default app on queue "q"."""
    workers = Workers(database_url, tmp_path)
    try:
        worker = workers.start("metrics", "--app", "leaseq.demo.app:registry", "--queue", "q")
        yield scrape(worker.port)
    finally:
        workers.stop_all()


@pytest.fixture
def operator_samples(database_url: str) -> Iterator[dict[str, Exported]]:
    """The operator's metrics server on a database holding a job that no live worker
    serves, with the series that a WorkerPool tick (leaseq_operator.handlers) and winning
    the reaper lease set."""
    metrics = OperatorMetrics()
    port = net.free_port()
    with leaseq.open_pool(database_url) as pool:
        queue = leaseq.Queue(pool)
        queue.enqueue("backlog", "infer", {"seconds": 1})
        # A live worker of the queue without the job's type: the job is unserved.
        leaseq.Workers(pool).register(
            "w-other",
            pod=None,
            node=None,
            queues=["backlog"],
            concurrency=1,
            state=leaseq.WorkerState.RUNNING,
            in_flight=0,
            job_types=["ocr"],
        )
        metrics.watch_queues(queue, leaseq.Workers(pool))
        metrics.watch_schedules(leaseq.Schedules(pool))
        metrics.watch_flow(leaseq.FlowControl(pool))
        metrics.known_queues(("backlog",))
        metrics.pool("jobs/leaseq-worker", desired=1, current=0)
        metrics.leader.set(1)
        metrics.serve(port, addr="127.0.0.1")
        try:
            yield scrape(port)
        finally:
            metrics.close()


# What only a Kubernetes operator can know: the WorkerPools it scales.
# What only a WorkerPool has (the reaper scales and annotates nothing).
OPERATOR_ONLY = {
    "leaseq_workerpool_desired_replicas",
    "leaseq_workerpool_current_replicas",
    "leaseq_workerpool_annotation_failures_total",
}


def json_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


@pytest.fixture
def reaper_run(database_url: str, tmp_path: Path) -> Iterator[tuple[dict[str, Exported], Path]]:
    """A `leaseq reaper` process started as on a VM: no metrics flags, no pod (so loopback
    and a free port, found in its log), after it reaped one job whose worker died. Yields
    its scrape and its JSON log."""
    with leaseq.connect(database_url, action="test") as conn:
        queue = leaseq.Queue(conn)
        queue.enqueue("backlog", "infer", {"seconds": 1})
        queue.enqueue("orphans", "infer")
        [job] = queue.claim(["orphans"], "dead-worker", lease_seconds=0.01)
    log = tmp_path / "reaper.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEASEQ_", "KUBERNETES_"))}
    env["LEASEQ_DATABASE_URL"] = database_url
    cmd = [sys.executable, "-m", "leaseq.cli", "reaper", "--operator-id", "vm-reaper",
           "--reap-interval", "0.2", "--leader-ttl", "2", "--log-format", "json"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        served = wait_for(
            lambda: (
                proc.poll() is None
                and next(
                    (
                        m
                        for line in json_lines(log)
                        if (
                            m := re.fullmatch(
                                r"serving /metrics on (\S+) port (\d+)", str(line["msg"])
                            )
                        )
                    ),
                    None,
                )
            ),
            "the reaper to say where it serves /metrics",
        )
        assert served.group(1) == "127.0.0.1"
        port = int(served.group(2))
        assert port != 9100
        wait_for(lambda: scrape(port).get("leaseq_reaped_total"), "the reaper to count its reap")
        assert scrape(port)["leaseq_reaped_total"].labels["queue"] == {job.queue}
        yield scrape(port), log
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        print(log.read_text()[-20000:])


@pytest.fixture
def reaper_samples(reaper_run: tuple[dict[str, Exported], Path]) -> dict[str, Exported]:
    return reaper_run[0]


@pytest.mark.process
def test_the_reaper_exports_the_operators_queue_metrics(
    operator_samples: dict[str, Exported],
    reaper_samples: dict[str, Exported],
    used: dict[str, list[str]],
) -> None:
    assert set(operator_samples) - set(reaper_samples) == OPERATOR_ONLY
    assert reaper_samples["leaseq_reaper_leader"] == operator_samples["leaseq_reaper_leader"]
    assert reaper_samples["leaseq_queue_jobs"].labels["state"] == {
        "ready", "scheduled", "running", "dead", "held", "waiting"
    }  # fmt: skip
    # Every series an alert rule selects, but the pool ones, comes from the reaper alone.
    rules = used["PrometheusRule"] + used["Grafana alert rules"]
    names = {name for expr in rules for name in promql_names(expr)}
    from_operator = {n for n in names if n in operator_samples} - OPERATOR_ONLY
    assert from_operator and from_operator <= set(reaper_samples)


@pytest.mark.process
def test_the_reapers_json_log_names_the_holder_and_the_term(
    reaper_run: tuple[dict[str, Exported], Path],
) -> None:
    lines = json_lines(reaper_run[1])
    [acquired] = [line for line in lines if line["msg"] == "reaper lease acquired"]
    assert (acquired["holder"], acquired["term"]) == ("vm-reaper", 1)
    reaped = [line for line in lines if str(line["msg"]).startswith("reaped 1 jobs")]
    assert reaped and (reaped[0]["holder"], reaped[0]["term"]) == ("vm-reaper", 1)


@pytest.fixture
def exported(
    worker_samples: dict[str, Exported], operator_samples: dict[str, Exported]
) -> dict[str, Exported]:
    """Every sample name leaseq's processes export."""
    assert not set(worker_samples) & set(operator_samples)
    return {**worker_samples, **operator_samples}


@pytest.fixture
def used(helm: Helm) -> dict[str, list[str]]:
    """The PromQL of the dashboard, the PrometheusRule and the Grafana alert rules (the
    last two as the chart renders them)."""
    objs = helm.render(sets={"grafana.alerts.enabled": "true"}, api_versions=[MONITORING_API])
    rule = one(objs, "PrometheusRule")
    (alerts,) = [c for c in of_kind(objs, "ConfigMap") if c["metadata"]["name"].endswith("-alerts")]
    (provisioning,) = alerts["data"].values()
    return {
        "dashboard": dashboard_exprs(DASHBOARD.read_text()),
        "PrometheusRule": [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]],
        "Grafana alert rules": grafana_rule_exprs(provisioning),
    }


@pytest.mark.process
def test_dashboard_and_alerts_use_only_exported_metrics(
    used: dict[str, list[str]], exported: dict[str, Exported]
) -> None:
    unknown = {}
    for where, exprs in used.items():
        names = {name for expr in exprs for name in promql_names(expr)}
        assert names, f"{where} uses no leaseq metric"
        unknown[where] = sorted(names - set(exported))
    assert not any(unknown.values()), unknown


@pytest.mark.process
def test_label_matchers_select_exported_values(
    used: dict[str, list[str]], exported: dict[str, Exported]
) -> None:
    """`state="dead"` on leaseq_queue_jobs must be a state the operator exports, and a label
    a metric does not have can only be one Prometheus adds when it scrapes."""
    wrong = []
    for where, exprs in used.items():
        for metric, label, value in {m for expr in exprs for m in promql_matchers(expr)}:
            if metric not in exported:
                continue  # the test above names it
            values = exported[metric].labels.get(label)
            if values is None and label in TARGET_LABELS:
                continue
            if value not in (values or set()):
                wrong.append(f"{where}: {metric}{{{label}={value!r}}}")
    assert not wrong, wrong


@pytest.mark.process
def test_dashboard_charts_every_exported_metric(exported: dict[str, Exported]) -> None:
    """A metric nobody looks at is a forgotten panel."""
    used = {name for expr in dashboard_exprs(DASHBOARD.read_text()) for name in promql_names(expr)}
    charted = {exported[name].metric for name in used if name in exported}
    assert {e.metric for e in exported.values()} - charted == UNCHARTED


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum(rate(leaseq_a_total{queue="leaseq_not_a_metric"}[5m]))', {"leaseq_a_total"}),
        ("histogram_quantile(0.9, sum by (le) (rate(leaseq_h_bucket[1m])))", {"leaseq_h_bucket"}),
        ("x_leaseq_no + leaseq_b unless on (queue) leaseq_c > 0", {"leaseq_b", "leaseq_c"}),
    ],
)
def test_promql_names(expr: str, names: set[str]) -> None:
    assert promql_names(expr) == names


def test_exported_samples_reads_exposition_text() -> None:
    text = (
        "# HELP leaseq_jobs_claimed_total Jobs claimed.\n"
        "# TYPE leaseq_jobs_claimed_total counter\n"
        'leaseq_jobs_claimed_total{queue="q",job_type="t"} 3.0\n'
        'leaseq_jobs_claimed_total{queue="q",job_type="u"} 0.0\n'
        "# HELP leaseq_jobs_claimed_created Jobs claimed.\n"
        "# TYPE leaseq_jobs_claimed_created gauge\n"
        'leaseq_jobs_claimed_created{queue="q",job_type="t"} 1.7e9\n'
        "# HELP leaseq_claim_latency_seconds Claim latency.\n"
        "# TYPE leaseq_claim_latency_seconds histogram\n"
        'leaseq_claim_latency_seconds_bucket{le="+Inf"} 1.0\n'
        "leaseq_claim_latency_seconds_sum 0.1\n"
        "leaseq_claim_latency_seconds_count 1.0\n"
        "# HELP leaseq_queue_jobs Jobs by queue and state.\n"
        "# TYPE leaseq_queue_jobs gauge\n"
    )
    assert exported_samples(text) == {
        "leaseq_jobs_claimed_total": Exported(
            "leaseq_jobs_claimed", {"queue": {"q"}, "job_type": {"t", "u"}}
        ),
        "leaseq_claim_latency_seconds_bucket": Exported(
            "leaseq_claim_latency_seconds", {"le": {"+Inf"}}
        ),
        "leaseq_claim_latency_seconds_sum": Exported("leaseq_claim_latency_seconds"),
        "leaseq_claim_latency_seconds_count": Exported("leaseq_claim_latency_seconds"),
    }


def test_promql_matchers() -> None:
    expr = (
        'max by (queue) (leaseq_queue_jobs{state="dead", namespace="jobs"})'
        ' - leaseq_queue_jobs{state!="ready",queue=~"$queue"} + other{state="x"}'
    )
    assert promql_matchers(expr) == {
        ("leaseq_queue_jobs", "state", "dead"),
        ("leaseq_queue_jobs", "namespace", "jobs"),
    }
