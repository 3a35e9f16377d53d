"""The alert rules, as the chart renders them: promtool check, one promtool unit test per alert
(fires when it should, stays quiet when it should not), and the Grafana copy of the same rules.

The rules are rendered with the chart's default thresholds into the namespace "jobs";
series from another namespace must never fire (the rules are scoped to the release).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import MONITORING_API, Helm, Obj, of_kind, one, run, tool

NS = 'namespace="jobs"'


@dataclass(frozen=True)
class Fires:
    """At `at`, exactly these (labels, summary) alerts are firing."""

    at: str
    alerts: list[tuple[dict[str, str], str]]


@dataclass(frozen=True)
class Case:
    alert: str
    series: dict[str, str]  # series selector -> promtool values
    checks: list[Fires]
    # Series that must never make the alert fire, checked at every `checks` time.
    quiet: dict[str, str] = field(default_factory=dict)


CASES = [
    # Defaults: heartbeats every 10 s, a 30 s lease, missedHeartbeats 2: late above 20 s.
    Case(
        "LeaseqHeartbeatLate",
        series={
            # two renewals missed, the lease (30 s) still held: fire now, not after expiry
            f'leaseq_queue_max_heartbeat_age_seconds{{{NS},queue="late"}}': "4 9 24 27 3 6",
        },
        quiet={
            # a healthy worker: ages up to one interval plus jitter
            f'leaseq_queue_max_heartbeat_age_seconds{{{NS},queue="fine"}}': "0 9 18 5 12 19",
            'leaseq_queue_max_heartbeat_age_seconds{namespace="other",queue="x"}': "25x5",
        },
        checks=[
            Fires("1m", []),
            Fires(
                "2m",
                [({"queue": "late"}, "A running job on queue late last heartbeated 24s ago")],
            ),
            Fires(
                "3m",
                [({"queue": "late"}, "A running job on queue late last heartbeated 27s ago")],
            ),
            Fires("4m", []),  # renewals resumed
        ],
    ),
    Case(
        "LeaseqHeartbeatStale",
        series={
            f'leaseq_queue_max_heartbeat_age_seconds{{{NS},queue="stuck",pod="op-a"}}': "120x10",
            f'leaseq_queue_max_heartbeat_age_seconds{{{NS},queue="stuck",pod="op-b"}}': "118x10",
        },
        quiet={
            f'leaseq_queue_max_heartbeat_age_seconds{{{NS},queue="fine"}}': "30x10",
            # one slow scrape is not an incident: `for: 2m`
            f'leaseq_queue_max_heartbeat_age_seconds{{{NS},queue="blip"}}': "20 20 300 20x8",
            'leaseq_queue_max_heartbeat_age_seconds{namespace="other",queue="x"}': "999x10",
        },
        checks=[
            Fires("1m", []),
            Fires(
                "5m",
                [
                    (
                        {"queue": "stuck"},
                        "Running jobs on queue stuck have not heartbeated for 2m 0s",
                    )
                ],
            ),
        ],
    ),
    Case(
        "LeaseqOldestReadyJobTooOld",
        series={f'leaseq_queue_oldest_ready_age_seconds{{{NS},queue="slow"}}': "700+60x10"},
        quiet={
            f'leaseq_queue_oldest_ready_age_seconds{{{NS},queue="ok"}}': "300x10",
            'leaseq_queue_oldest_ready_age_seconds{namespace="other",queue="x"}': "9999x10",
        },
        checks=[
            Fires("4m", []),
            Fires(
                "6m",
                [({"queue": "slow"}, "The oldest ready job on queue slow has waited 17m 40s")],
            ),
        ],
    ),
    Case(
        # Default: a day. The series grows by the scrape interval (1m here).
        "LeaseqSignalUnanswered",
        series={
            f'leaseq_queue_oldest_signal_wait_age_seconds{{{NS},queue="approvals"}}': "86000+60x30"
        },
        quiet={
            # answered minutes after crossing the day: the age falls back before `for`
            f'leaseq_queue_oldest_signal_wait_age_seconds{{{NS},queue="answered"}}': (
                "86000+60x10 0+60x20"
            ),
            'leaseq_queue_oldest_signal_wait_age_seconds{namespace="other",queue="x"}': "99999x30",
        },
        checks=[
            Fires("10m", []),  # above the threshold since 7m: not yet for 15m
            Fires(
                "25m",
                [
                    (
                        {"queue": "approvals"},
                        "A job on queue approvals has waited 1d 0h 18m 20s for a signal",
                    )
                ],
            ),
        ],
    ),
    Case(
        "LeaseqDeadJobsIncreasing",
        series={f'leaseq_queue_jobs{{{NS},state="dead",queue="bad"}}': "0 0 0 2 2 2 2 2"},
        quiet={
            f'leaseq_queue_jobs{{{NS},state="dead",queue="steady"}}': "5x30",
            # retried or pruned dead jobs make the count fall: not an alert
            f'leaseq_queue_jobs{{{NS},state="dead",queue="retried"}}': "3 3 3 0 0 0 0 0",
            'leaseq_queue_jobs{namespace="other",state="dead",queue="x"}': "0 5 9 12 20 30 40 50",
        },
        checks=[
            Fires("2m", []),
            Fires("4m", [({"queue": "bad"}, "2 new dead jobs on queue bad within 15 minutes")]),
        ],
    ),
    Case(
        "LeaseqStepUncertain",
        series={
            f'leaseq_steps_uncertain_total{{{NS},queue="pay",job_type="bill",pod="w-a"}}': (
                "0 0 0 1x12"
            ),
        },
        quiet={
            f'leaseq_steps_uncertain_total{{{NS},queue="pay",job_type="ok",pod="w-a"}}': "0x15",
            'leaseq_steps_uncertain_total{namespace="other",queue="x",job_type="y"}': "0+1x15",
        },
        checks=[
            Fires("2m", []),
            Fires(
                "5m",
                [
                    (
                        {"queue": "pay", "job_type": "bill"},
                        "1 bill jobs on queue pay stopped at an uncertain step within 15 minutes",
                    )
                ],
            ),
        ],
    ),
    Case(
        "LeaseqLeaseExpirations",
        series={
            f'leaseq_reaped_total{{{NS},queue="flaky",outcome="retried"}}': "0+1x20",
            f'leaseq_reaped_total{{{NS},queue="flaky",outcome="dead"}}': "0x20",
        },
        quiet={
            f'leaseq_reaped_total{{{NS},queue="rare",outcome="retried"}}': "0 0 0 1 1 1 2x14",
            'leaseq_reaped_total{namespace="other",queue="x",outcome="retried"}': "0+10x20",
        },
        checks=[
            Fires("3m", []),
            Fires(
                "15m",
                [({"queue": "flaky"}, "15 expired leases reaped on queue flaky in 15 minutes")],
            ),
        ],
    ),
    Case(
        "LeaseqReadyWorkWithoutWorkers",
        series={
            f'leaseq_queue_jobs{{{NS},state="ready",queue="orphan"}}': "3x10",
            f'leaseq_queue_workers{{{NS},queue="orphan"}}': "0x10",
            # no worker ever registered for this queue: no series at all
            f'leaseq_queue_jobs{{{NS},state="ready",queue="nopool"}}': "7x10",
        },
        quiet={
            f'leaseq_queue_jobs{{{NS},state="ready",queue="served"}}': "3x10",
            f'leaseq_queue_workers{{{NS},queue="served"}}': "2x10",
            f'leaseq_queue_jobs{{{NS},state="ready",queue="idle"}}': "0x10",
            f'leaseq_queue_workers{{{NS},queue="idle"}}': "0x10",
            # scale from zero: workers arrive within the `for` window
            f'leaseq_queue_jobs{{{NS},state="ready",queue="waking"}}': "4x10",
            f'leaseq_queue_workers{{{NS},queue="waking"}}': "0 0 1x8",
        },
        checks=[
            Fires("3m", []),
            Fires(
                "6m",
                [
                    (
                        {"queue": "nopool"},
                        "7 ready jobs on queue nopool and no live worker serving it",
                    ),
                    (
                        {"queue": "orphan"},
                        "3 ready jobs on queue orphan and no live worker serving it",
                    ),
                ],
            ),
        ],
    ),
    Case(
        "LeaseqScheduleLate",
        series={
            # up to date (a tick interval late at most), then no scheduler fires anything
            f'leaseq_schedule_late_seconds{{{NS},pod="op-a"}}': "0 5 0 70 130 190 250 310 370 430",
            f'leaseq_schedule_late_seconds{{{NS},pod="op-b"}}': "0 4 3 0 5 0 2 1 0 3",
        },
        quiet={
            'leaseq_schedule_late_seconds{namespace="other",pod="op-c"}': "500x10",
        },
        checks=[
            Fires("2m", []),
            Fires("7m", []),  # late since 3m: pending for 5m
            Fires("8m", [({}, "A schedule in jobs has a due slot not fired for 370s")]),
        ],
    ),
    Case(
        "LeaseqNoReaperLeader",
        series={
            f'leaseq_reaper_leader{{{NS},pod="op-a"}}': "1 1 0x8",
            f'leaseq_reaper_leader{{{NS},pod="op-b"}}': "0x10",
        },
        quiet={
            'leaseq_reaper_leader{namespace="other",pod="op-c"}': "0x10",
        },
        checks=[
            Fires("4m", []),
            Fires("8m", [({}, "No operator in jobs holds the reaper leadership")]),
        ],
    ),
    Case(
        "LeaseqOperatorDatabaseUnreachable",
        series={
            f'leaseq_operator_database_up{{{NS},pod="op-a"}}': "1 1 0x10",
            f'leaseq_operator_database_up{{{NS},pod="op-b"}}': "0x12",
        },
        quiet={
            'leaseq_operator_database_up{namespace="other",pod="op-c"}': "0x12",
        },
        checks=[
            Fires("5m", []),
            Fires(
                "8m",
                [({}, "No operator in jobs can read PostgreSQL: the queue alerts are blind")],
            ),
        ],
    ),
]


@pytest.fixture(scope="module")
def rules(chart: tuple[Path, bool]) -> list[Obj]:
    """The PrometheusRule's rules, rendered with the chart's defaults in namespace "jobs"."""
    helm = Helm(tool("helm"), chart[0])
    rule = one(helm.render(api_versions=[MONITORING_API]), "PrometheusRule")
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


@pytest.fixture(scope="module")
def rules_file(rules: list[Obj], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "leaseq.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "leaseq", "rules": rules}]}))
    return path


def test_every_alert_has_a_case(rules: list[Obj]) -> None:
    assert {r["alert"] for r in rules} == {c.alert for c in CASES}


def test_every_alert_says_what_to_check_first(rules: list[Obj]) -> None:
    for r in rules:
        ann = r["annotations"]
        assert ann["summary"], r["alert"]
        assert ann["runbook"].startswith("First "), r["alert"]
        assert r["labels"]["severity"] in {"critical", "warning"}


def test_promtool_check_rules(rules_file: Path) -> None:
    proc = run([tool("promtool"), "check", "rules", str(rules_file)])
    assert "SUCCESS" in proc.stdout


def promtool_test(case: Case, rule: Obj) -> dict[str, Any]:
    """A promtool test file for one alert; annotations other than summary are the rule's."""
    fixed = {k: v for k, v in rule["annotations"].items() if k != "summary"}
    series = {**case.series, **case.quiet}
    return {
        "rule_files": ["leaseq.rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": case.alert,
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "alert_rule_test": [
                    {
                        "eval_time": check.at,
                        "alertname": case.alert,
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "namespace": "jobs",
                                    "severity": rule["labels"]["severity"],
                                    **labels,
                                },
                                "exp_annotations": {**fixed, "summary": summary},
                            }
                            for labels, summary in check.alerts
                        ],
                    }
                    for check in case.checks
                ],
            }
        ],
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.alert)
def test_promtool_unit(case: Case, rules: list[Obj], rules_file: Path) -> None:
    rule = next(r for r in rules if r["alert"] == case.alert)
    assert any(c.alerts for c in case.checks), "a case must see its alert fire"
    assert any(not c.alerts for c in case.checks), "a case must see its alert quiet"
    test_file = rules_file.with_name(f"{case.alert}.test.yaml")
    test_file.write_text(yaml.safe_dump(promtool_test(case, rule), sort_keys=False))
    run([tool("promtool"), "test", "rules", str(test_file)])


def test_grafana_rules_are_the_prometheus_rules(helm: Helm, rules: list[Obj]) -> None:
    objs = helm.render(sets={"grafana.alerts.enabled": "true"})
    (cm,) = [c for c in of_kind(objs, "ConfigMap") if c["metadata"]["name"].endswith("-alerts")]
    assert cm["metadata"]["labels"]["grafana_alert"] == "1"
    (text,) = cm["data"].values()
    provisioning = yaml.safe_load(text)
    assert provisioning["apiVersion"] == 1
    (group,) = provisioning["groups"]
    grafana = {r["title"]: r for r in group["rules"]}
    assert set(grafana) == {r["alert"] for r in rules}
    uids = [r["uid"] for r in group["rules"]]
    assert len(set(uids)) == len(uids)
    for prom in rules:
        g = grafana[prom["alert"]]
        assert len(g["uid"]) <= 40
        queries = {q["refId"]: q for q in g["data"]}
        assert queries["A"]["model"]["expr"] == prom["expr"]
        assert queries["A"]["datasourceUid"] == "prometheus"
        assert g["condition"] == "B"
        assert queries["B"]["model"]["expression"] == "A"
        assert queries["B"]["model"]["conditions"][0]["evaluator"] == {"type": "gt", "params": [0]}
        assert g["for"] == prom["for"]
        assert g["noDataState"] == "OK"
        assert g["labels"]["severity"] == prom["labels"]["severity"]
        assert g["annotations"]["runbook"] == prom["annotations"]["runbook"]
        assert "$value " not in g["annotations"]["summary"]


@pytest.mark.parametrize(("heartbeat", "missed", "threshold"), [(4, 2, 8), (7, 1.5, 10.5)])
def test_heartbeat_late_threshold_follows_the_heartbeat_interval(
    helm: Helm, tmp_path: Path, heartbeat: float, missed: float, threshold: float
) -> None:
    values = tmp_path / "values.yaml"  # --set would pass 1.5 as a string
    values.write_text(
        yaml.safe_dump(
            {"worker": {"heartbeatSeconds": heartbeat}, "alerts": {"missedHeartbeats": missed}}
        )
    )
    rule = one(helm.render(values, api_versions=[MONITORING_API]), "PrometheusRule")
    [late] = [
        r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "LeaseqHeartbeatLate"
    ]
    assert late["expr"].endswith(f"> {threshold:g}")
    assert late["for"] == "0m"


def test_heartbeat_late_must_fire_before_the_lease_expires(helm: Helm) -> None:
    proc = helm.template_raw(
        sets={
            "worker.heartbeatSeconds": "10",
            "worker.leaseSeconds": "30",
            "alerts.missedHeartbeats": "3",
        },
        check=False,
    )
    assert proc.returncode != 0
    assert (
        "alerts.missedHeartbeats x worker.heartbeatSeconds (3 x 10 = 30) must be below "
        "worker.leaseSeconds (30)"
    ) in proc.stderr
