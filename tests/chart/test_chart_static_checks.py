"""Static checks on what ships: checkov on the chart (its own helm rendering and our renders of
every values example) and the Dockerfile, hadolint, and the generated dashboard being current.

Every checkov finding is fixed or skipped in the template with a reason (checkov.io/skipN
annotations; a comment for the Dockerfile); these tests fail on any unexplained finding.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from chartkit import (
    CHART,
    MONITORING_API,
    REPO,
    Helm,
    env_with,
    run,
    tool,
    values_files,
    values_id,
)


def checkov(*args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run checkov with JSON output; return its per-framework reports."""
    proc = run([tool("checkov"), "--quiet", "--compact", "-o", "json", *args], check=False, env=env)
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout) if proc.stdout.strip() else []
    reports = out if isinstance(out, list) else [out]
    assert reports, f"checkov scanned nothing: {proc.stderr}"
    return reports


def assert_clean(reports: list[dict[str, Any]]) -> None:
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}"
        for r in reports
        for c in r.get("results", {}).get("failed_checks", [])
    ]
    assert not failed, "\n".join(failed)
    for r in reports:
        for c in r.get("results", {}).get("skipped_checks", []):
            reason = c.get("suppress_comment") or ""
            assert len(reason) > 20, f"{c['check_id']} on {c['resource']} skipped without a reason"
        assert r.get("summary", {}).get("passed", 0) > 0


def test_checkov_helm_framework() -> None:
    """checkov's own rendering (default values, namespace "default")."""
    helm = tool("helm")
    # CKV_K8S_21 ("default namespace"): checkov renders without --namespace, so every object
    # lands in "default"; the chart uses the release namespace, and the render below (in
    # namespace "jobs") runs the check for real.
    assert_clean(
        checkov(
            "-d",
            str(CHART),
            "--framework",
            "helm",
            "--skip-check",
            "CKV_K8S_21",
            env=env_with(helm),
        )
    )


def test_checkov_every_values_example(helm: Helm, tmp_path: Path) -> None:
    """All objects of every example, with the optional PostgreSQL and Grafana alerts on."""
    for values in values_files():
        rendered = helm.template_raw(
            values,
            sets={"postgresql.enabled": "true", "grafana.alerts.enabled": "true"},
            api_versions=[MONITORING_API],
        ).stdout
        (tmp_path / f"{values_id(values)}.yaml").write_text(rendered)
    assert_clean(checkov("-d", str(tmp_path), "--framework", "kubernetes"))


def test_checkov_dockerfile() -> None:
    assert_clean(checkov("-f", str(REPO / "Dockerfile"), "--framework", "dockerfile"))


def test_hadolint() -> None:
    proc = run([tool("hadolint"), str(REPO / "Dockerfile")], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerignore_keeps_the_build_context_small() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*", "ignore everything, then allow what the image needs"
    allowed = {r.removeprefix("!").rstrip("/") for r in rules if r.startswith("!")}
    assert allowed == {"pyproject.toml", "README*", "worker", "operator", "sql"}


def load_builder() -> Any:
    pytest.importorskip("grafana_foundation_sdk", reason="pip install grafana-foundation-sdk")
    path = CHART / "dashboards" / "build.py"
    spec = importlib.util.spec_from_file_location("leaseq_dashboard_build", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_dashboard_is_current() -> None:
    builder = load_builder()
    shipped = (CHART / "dashboards" / "leaseq.json").read_text()
    assert builder.render() == shipped, "run: python charts/leaseq/dashboards/build.py"


def test_dashboard_has_the_panels_on_call_needs() -> None:
    dashboard = json.loads((CHART / "dashboards" / "leaseq.json").read_text())
    titles = {p["title"] for p in dashboard["panels"]}
    assert {
        "Jobs by state",
        "Oldest ready job age",
        "Heartbeat age of running jobs",
        "Jobs finished by outcome",
        "Job duration",
        "Claim latency",
        "Desired vs current replicas",
    } <= titles
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "queue"}
