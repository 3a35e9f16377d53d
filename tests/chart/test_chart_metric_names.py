"""Every metric the dashboard and the alert rules use is one the worker or operator exports.

For now "exported" is CONTRACT.md's list, embedded below as sample names; once the worker and
operator land, this compares against a live /metrics of each (metric_names.exported_names).
"""

from __future__ import annotations

import pytest
from chartkit import CHART, MONITORING_API, Helm, one
from metric_names import dashboard_names, exported_names, promql_names, rule_names

_HISTOGRAM = ("_bucket", "_sum", "_count")
HISTOGRAMS = {"leaseq_job_duration_seconds", "leaseq_claim_latency_seconds"}

# CONTRACT.md "Metric names", as the samples Prometheus stores.
CONTRACT_SAMPLES = {
    # worker
    "leaseq_jobs_claimed_total",
    "leaseq_jobs_finished_total",
    *(h + s for h in HISTOGRAMS for s in _HISTOGRAM),
    "leaseq_jobs_in_flight",
    "leaseq_lease_renewals_total",
    "leaseq_lease_losses_total",
    "leaseq_fenced_calls_total",
    "leaseq_last_heartbeat_timestamp_seconds",
    "leaseq_worker_draining",
    # operator
    "leaseq_queue_jobs",
    "leaseq_queue_oldest_ready_age_seconds",
    "leaseq_queue_max_heartbeat_age_seconds",
    "leaseq_queue_workers",
    "leaseq_reaped_total",
    "leaseq_workerpool_desired_replicas",
    "leaseq_workerpool_current_replicas",
    "leaseq_reaper_leader",
}


def test_dashboard_uses_only_exported_metrics() -> None:
    used = dashboard_names((CHART / "dashboards" / "leaseq.json").read_text())
    assert used, "no leaseq metric found in the dashboard"
    assert used <= CONTRACT_SAMPLES, sorted(used - CONTRACT_SAMPLES)


def test_alert_rules_use_only_exported_metrics(helm: Helm) -> None:
    rule = one(helm.render(api_versions=[MONITORING_API]), "PrometheusRule")
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    used = rule_names(rules)
    assert used, "no leaseq metric found in the rules"
    assert used <= CONTRACT_SAMPLES, sorted(used - CONTRACT_SAMPLES)


def family(sample: str) -> str:
    """The metric a sample belongs to (a histogram's _bucket/_sum/_count -> the histogram)."""
    for suffix in _HISTOGRAM:
        if sample.removesuffix(suffix) in HISTOGRAMS:
            return sample.removesuffix(suffix)
    return sample


def test_dashboard_covers_the_contract() -> None:
    """Every exported metric has a panel; a metric nobody looks at is a forgotten panel."""
    used = dashboard_names((CHART / "dashboards" / "leaseq.json").read_text())
    unseen = {family(n) for n in CONTRACT_SAMPLES} - {family(n) for n in used}
    # The last heartbeat timestamp is for per-pod debugging, the queue-level age is charted.
    assert unseen <= {"leaseq_last_heartbeat_timestamp_seconds"}, sorted(unseen)


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


def test_exported_names_reads_exposition_text() -> None:
    text = (
        "# HELP leaseq_jobs_claimed_total Jobs claimed.\n"
        "# TYPE leaseq_jobs_claimed_total counter\n"
        'leaseq_jobs_claimed_total{queue="q",job_type="t"} 3.0\n'
        "# HELP leaseq_claim_latency_seconds Claim latency.\n"
        "# TYPE leaseq_claim_latency_seconds histogram\n"
        'leaseq_claim_latency_seconds_bucket{le="+Inf"} 1.0\n'
        "leaseq_claim_latency_seconds_sum 0.1\n"
        "leaseq_claim_latency_seconds_count 1.0\n"
    )
    assert exported_names(text) == {
        "leaseq_jobs_claimed_total",
        "leaseq_claim_latency_seconds_bucket",
        "leaseq_claim_latency_seconds_sum",
        "leaseq_claim_latency_seconds_count",
    }
