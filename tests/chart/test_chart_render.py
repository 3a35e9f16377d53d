"""helm lint / helm template on the defaults and every ci/ example, with assertions on what
the chart renders: security, probes, the drain guard, RBAC, selectors, capabilities."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from chartkit import (
    CHART,
    CRD_PATH,
    MONITORING_API,
    Helm,
    Obj,
    of_kind,
    one,
    pod_specs,
    selectors,
    values_files,
    values_id,
)

from leaseq_operator.kube import POOL_LABEL

VALUES = values_files()

# What the operator calls (operator/leaseq_operator/kube.py,
# operator/leaseq_operator/handlers.py, kopf standalone with scanning off), and nothing more.
OPERATOR_RULES = {
    ("leaseq.dev", "workerpools"): {"get", "list", "watch", "patch"},
    ("leaseq.dev", "workerpools/status"): {"get", "patch"},
    # patch: only to resume a Deployment the chart created paused (the admission policy)
    ("apps", "deployments"): {"get", "patch"},
    ("apps", "deployments/scale"): {"patch"},
    # watch: a worker container that terminated has its jobs' leases ended at once
    ("", "pods"): {"list", "watch", "patch"},
    ("", "events"): {"create"},
}


def rules_of(role: Obj) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_lint(helm: Helm, values: Path | None) -> None:
    helm.lint(values)


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_every_container_is_locked_down(helm: Helm, values: Path | None) -> None:
    objs = helm.render(values, sets={"postgresql.enabled": "true"})
    assert list(pod_specs(objs)), "nothing rendered a pod"
    for obj, spec in pod_specs(objs):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, where
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert isinstance(pod["runAsUser"], int), where
        assert pod["runAsUser"] > 0, where
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc["runAsNonRoot"] is True, where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert c["resources"]["limits"], where
            assert c["resources"]["requests"], where


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_probes(helm: Helm, values: Path | None) -> None:
    objs = helm.render(values)
    worker = one(objs, "Deployment", "worker")["spec"]["template"]["spec"]["containers"][0]
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    operators = [
        o for o in of_kind(objs, "Deployment") if o["metadata"]["name"].endswith("-operator")
    ]
    for op in operators:
        c = op["spec"]["template"]["spec"]["containers"][0]
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert str(ports["health"]) == env["LEASEQ_HEALTH_PORT"]
        assert str(ports["metrics"]) == env["LEASEQ_METRICS_PORT"]


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_pods_name_their_metrics_port_and_address(helm: Helm, values: Path | None) -> None:
    """Off a pod the endpoints default to loopback and a free port (leaseq.config); the
    chart must not depend on telling a pod apart: it sets both, matching the probes' port."""
    for deployment in of_kind(helm.render(values), "Deployment"):
        for c in deployment["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if c.get("args", [None])[0] not in ("worker", "operator"):
                continue
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            where = deployment["metadata"]["name"]
            assert env.get("LEASEQ_METRICS_PORT") == str(ports["metrics"]), where
            assert env.get("LEASEQ_METRICS_ADDRESS") == "0.0.0.0", where


@pytest.mark.parametrize(
    ("grace", "drain", "margin", "renders"),
    [(34, 25, 10, False), (35, 25, 10, True), (120, 120, 0, True), (129, 120, 10, False)],
)
def test_grace_period_guard(helm: Helm, grace: int, drain: int, margin: int, renders: bool) -> None:
    proc = helm.template_raw(
        sets={
            "worker.terminationGracePeriodSeconds": str(grace),
            "worker.drainSeconds": str(drain),
            "worker.terminationGraceMarginSeconds": str(margin),
        },
        check=False,
    )
    assert (proc.returncode == 0) is renders, proc.stderr
    if not renders:
        assert "worker.terminationGracePeriodSeconds" in proc.stderr
        assert f"{drain} + {margin} = {drain + margin}" in proc.stderr


def test_heartbeat_must_be_shorter_than_lease(helm: Helm) -> None:
    proc = helm.template_raw(
        sets={"worker.heartbeatSeconds": "30", "worker.leaseSeconds": "30"}, check=False
    )
    assert proc.returncode != 0
    assert "worker.heartbeatSeconds (30) must be below worker.leaseSeconds (30)" in proc.stderr


def test_work_target_must_exceed_the_start_up(helm: Helm) -> None:
    sets = {"worker.pool.work.targetSeconds": "60", "worker.pool.work.startupSeconds": "60"}
    proc = helm.template_raw(sets=sets, check=False)
    assert proc.returncode != 0
    assert "worker.pool.work.targetSeconds (60) must be greater than" in proc.stderr
    pool = one(helm.render(sets={**sets, "worker.pool.work.targetSeconds": "61"}), "WorkerPool")
    assert pool["spec"]["work"]["targetSeconds"] == 61


@pytest.mark.parametrize(
    ("ttl", "interval", "renders"), [(15, 15, False), (4, 5, False), (6, 5, True)]
)
def test_leader_ttl_must_exceed_the_reap_interval(
    helm: Helm, ttl: int, interval: int, renders: bool
) -> None:
    proc = helm.template_raw(
        sets={
            "operator.leaderTtlSeconds": str(ttl),
            "operator.reapIntervalSeconds": str(interval),
        },
        check=False,
    )
    assert (proc.returncode == 0) is renders, proc.stderr
    if not renders:
        assert (
            f"operator.leaderTtlSeconds ({ttl}) must be longer than "
            f"operator.reapIntervalSeconds ({interval})"
        ) in proc.stderr


def test_schema_rejects_unknown_keys(helm: Helm) -> None:
    proc = helm.template_raw(sets={"worker.concurency": "2"}, check=False)
    assert proc.returncode != 0
    assert "concurency" in proc.stderr


def test_rbac_is_namespaced_and_minimal(helm: Helm) -> None:
    objs = helm.render()
    assert not of_kind(objs, "ClusterRole")
    assert not of_kind(objs, "ClusterRoleBinding")
    role = one(objs, "Role")
    assert role["metadata"]["namespace"] == "jobs"
    assert rules_of(role) == OPERATOR_RULES
    assert named_resources(role) == {
        ("apps", "deployments"): ["rel-leaseq-worker"],
        ("apps", "deployments/scale"): ["rel-leaseq-worker"],
    }
    binding = one(objs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    operator = one(objs, "Deployment", "operator")["spec"]["template"]["spec"]
    assert subject["name"] == operator["serviceAccountName"]
    env = {e["name"]: e.get("value") for e in operator["containers"][0]["env"]}
    assert env["LEASEQ_NAMESPACE"] == "jobs"


def named_resources(role: Obj) -> dict[tuple[str, str], list[str]]:
    """The resourceNames of each (group, resource) a rule narrows to names."""
    return {
        (group, resource): rule["resourceNames"]
        for rule in role["rules"]
        if "resourceNames" in rule
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_a_namespaced_role_names_the_deployments_it_scales(helm: Helm) -> None:
    """Namespaced, the chart knows the Deployments: the Role names the worker Deployment
    and operator.deployments, so the token cannot resume or scale any other (the operator's
    own Deployment included)."""
    role = one(helm.render(sets={"operator.deployments": "{gpu-workers}"}), "Role")
    names = ["rel-leaseq-worker", "gpu-workers"]
    assert named_resources(role) == {
        ("apps", "deployments"): names,
        ("apps", "deployments/scale"): names,
    }


def test_a_namespaced_role_without_a_deployment_grants_none(helm: Helm) -> None:
    """An empty resourceNames would grant every name: no Deployment rule at all instead."""
    role = one(helm.render(sets={"worker.enabled": "false"}), "Role")
    assert not [r for r in role["rules"] if "apps" in r["apiGroups"]]
    assert all(r.get("resourceNames") != [] for r in role["rules"])


def test_rbac_cluster_wide_when_asked(helm: Helm) -> None:
    objs = helm.render(sets={"operator.clusterWide": "true"})
    assert not of_kind(objs, "Role")
    assert rules_of(one(objs, "ClusterRole")) == OPERATOR_RULES
    operator = one(objs, "Deployment", "operator")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in operator["containers"][0]["env"]}
    assert env["LEASEQ_NAMESPACE"] == ""


@pytest.mark.parametrize("cluster_wide", [True, False])
def test_cluster_wide_labels_the_worker_deployment_for_its_pool(
    helm: Helm, cluster_wide: bool
) -> None:
    """clusterWide (issue 46): the operator touches only a Deployment whose selector (so its
    pods) carries leaseq.dev/worker-pool: <its WorkerPool>, so the chart's own worker
    Deployment carries it there; a namespaced install keeps its selector unchanged (a
    selector is immutable: adding a key would break every upgrade)."""
    objs = helm.render(sets={"operator.clusterWide": str(cluster_wide).lower()})
    deployment = one(objs, "Deployment", "worker")
    pool = one(objs, "WorkerPool")
    selector = deployment["spec"]["selector"]["matchLabels"]
    template = deployment["spec"]["template"]["metadata"]["labels"]
    if cluster_wide:
        assert selector[POOL_LABEL] == template[POOL_LABEL] == pool["metadata"]["name"]
        assert pool["spec"]["deployment"] == deployment["metadata"]["name"]
    else:
        assert POOL_LABEL not in selector and POOL_LABEL not in template


@pytest.mark.parametrize("kind", ["Role", "ClusterRole"])
def test_rbac_reads_only_the_named_database_secrets(helm: Helm, kind: str) -> None:
    """Secrets are opt-in, `get` only, and only the ones WorkerPools name."""
    objs = helm.render(
        sets={
            "operator.databaseSecrets": "{pool-a-db,pool-b-db}",
            "operator.clusterWide": str(kind == "ClusterRole").lower(),
        }
    )
    role = one(objs, kind)
    assert rules_of(role) == {**OPERATOR_RULES, ("", "secrets"): {"get"}}
    (secrets,) = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert secrets["resourceNames"] == ["pool-a-db", "pool-b-db"]
    others = {k for k in named_resources(role) if k != ("", "secrets")}
    scaled = {("apps", "deployments"), ("apps", "deployments/scale")}
    assert others == (set() if kind == "ClusterRole" else scaled)


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_only_the_operator_gets_an_api_token(helm: Helm, values: Path | None) -> None:
    objs = helm.render(values)
    for obj, spec in pod_specs(objs):
        is_operator = obj["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
        assert spec["automountServiceAccountToken"] is is_operator, obj["metadata"]["name"]
    for sa in of_kind(objs, "ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_no_chart_version_in_selectors(helm: Helm, values: Path | None) -> None:
    objs = helm.render(values, api_versions=[MONITORING_API])
    found = list(selectors(objs))
    assert found
    for where, labels in found:
        assert labels, where
        assert "helm.sh/chart" not in labels, where
        assert "app.kubernetes.io/version" not in labels, where
    monitor = one(objs, "ServiceMonitor")
    assert "helm.sh/chart" not in monitor["spec"]["selector"]["matchLabels"]


def test_monitoring_objects_need_the_capability(helm: Helm) -> None:
    without = helm.render()
    assert not of_kind(without, "ServiceMonitor")
    assert not of_kind(without, "PrometheusRule")
    with_api = helm.render(api_versions=[MONITORING_API])
    monitor = one(with_api, "ServiceMonitor")
    assert one(with_api, "PrometheusRule")
    # The ServiceMonitor finds both metrics Services.
    services = [
        s
        for s in of_kind(with_api, "Service")
        if any(p["name"] == "metrics" for p in s["spec"]["ports"])
    ]
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in services} == {
        "operator",
        "worker",
    }
    (expr,) = monitor["spec"]["selector"]["matchExpressions"]
    for s in services:
        labels = s["metadata"]["labels"]
        assert all(labels[k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
        assert labels[expr["key"]] in expr["values"]
    disabled = helm.render(
        api_versions=[MONITORING_API],
        sets={
            "metrics.serviceMonitor.enabled": "false",
            "alerts.prometheusRule.enabled": "false",
        },
    )
    assert not of_kind(disabled, "ServiceMonitor")
    assert not of_kind(disabled, "PrometheusRule")


def test_grafana_configmaps(helm: Helm) -> None:
    objs = helm.render(sets={"grafana.alerts.enabled": "true"})
    dashboard = next(
        c for c in of_kind(objs, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(dashboard["data"]["leaseq.json"])
    assert shipped == json.loads((CHART / "dashboards" / "leaseq.json").read_text())
    alerts = next(
        c for c in of_kind(objs, "ConfigMap") if c["metadata"]["name"].endswith("-grafana-alerts")
    )
    assert alerts["metadata"]["labels"]["grafana_alert"] == "1"
    default = helm.render()
    assert not [
        c for c in of_kind(default, "ConfigMap") if "grafana-alerts" in c["metadata"]["name"]
    ]


def test_database_secret(helm: Helm) -> None:
    existing = helm.render(
        sets={"database.existingSecret": "mine", "database.url": "postgresql://x"}
    )
    assert not of_kind(existing, "Secret")
    for _, spec in pod_specs(existing):
        for c in spec["containers"]:
            url = next(e for e in c["env"] if e["name"] == "LEASEQ_DATABASE_URL")
            assert url["valueFrom"]["secretKeyRef"] == {"name": "mine", "key": "url"}
    created = helm.render(sets={"database.url": "postgresql://u:p@db:5432/q"})
    secret = one(created, "Secret")
    assert secret["stringData"] == {"url": "postgresql://u:p@db:5432/q"}
    # Created before the migration hook, which reads it.
    assert "pre-install" in secret["metadata"]["annotations"]["helm.sh/hook"]
    job = one(created, "Job")
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]


def test_in_cluster_postgresql_is_off_by_default(helm: Helm) -> None:
    assert not [
        d
        for d in of_kind(helm.render(), "Deployment")
        if d["metadata"]["name"].endswith("-postgresql")
    ]
    objs = helm.render(sets={"postgresql.enabled": "true"})
    pg = next(
        d for d in of_kind(objs, "Deployment") if d["metadata"]["name"].endswith("-postgresql")
    )
    # Before the migration hook: a hook, lighter than the Job's weight.
    assert pg["metadata"]["annotations"]["helm.sh/hook"] == "pre-install"
    url = one(objs, "Secret")["stringData"]["url"]
    assert url.startswith("postgresql://leaseq:")
    assert pg["metadata"]["name"] in url


def test_helm_test_hook_checks_database_and_metrics(helm: Helm) -> None:
    objs = helm.render(sets={"worker.pool.minReplicas": "1"})
    pod = one(objs, "Pod", "test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    args = pod["spec"]["containers"][0]["args"]
    assert "leaseq.jobs" in args[0]
    targets = args[1:]
    assert any("-operator-metrics:9100/metrics leaseq_queue_jobs" in t for t in targets)
    assert any("-worker-metrics:9100/metrics leaseq_jobs_claimed_total" in t for t in targets)
    scaled_to_zero = one(helm.render(), "Pod", "test")["spec"]["containers"][0]["args"][1:]
    assert not any("worker-metrics" in t for t in scaled_to_zero)


def test_crds_ship_from_crds_dir(helm: Helm) -> None:
    with_crds = helm.render(include_crds=True)
    names = {c["metadata"]["name"] for c in of_kind(with_crds, "CustomResourceDefinition")}
    assert names == {"workerpools.leaseq.dev"}
    assert not of_kind(helm.render(), "CustomResourceDefinition")


def test_workerpool_matches_the_crd(helm: Helm, real_crd: bool) -> None:
    if not real_crd:
        pytest.skip(f"charts/leaseq/{CRD_PATH} not in this tree yet (the operator work writes it)")
    crd = yaml.safe_load((CHART / CRD_PATH).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    pool = one(helm.render(), "WorkerPool")
    assert set(pool["spec"]) <= set(props)


def test_values_file_documents_every_value() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    assert lines[0] == "# yaml-language-server: $schema=values.schema.json"
    key = re.compile(r"^(\s*)([A-Za-z][\w.-]*):(.*)$")
    # Each key with its indentation; a value is documented when it or an ancestor key has a
    # comment line right above it.
    stack: list[tuple[int, bool]] = []
    for i, line in enumerate(lines):
        m = key.match(line)
        if not m:
            continue
        indent, name, rest = len(m.group(1)), m.group(2), m.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        commented = i > 0 and lines[i - 1].lstrip().startswith("#")
        documented = commented or any(c for _, c in stack)
        stack.append((indent, commented))
        if rest and not rest.startswith("#"):
            assert documented, f"values.yaml line {i + 1}: {name} has no comment"


def test_schema_forbids_additional_properties() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: Obj, path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, path or "<root>"
            for name, sub in node["properties"].items():
                walk(sub, f"{path}.{name}")

    walk(schema, "")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])
