"""The environment the chart gives each leaseq container is what that command reads, and the
values map one-to-one onto it: the rendered env goes through the real settings code
(WorkerSettings, OperatorConfig) and must come out as exactly the values that were set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chartkit import Helm, Obj, env_names, of_kind, one, pod_specs, values_files, values_id

from leaseq import config as settings
from leaseq.cli import main as cli
from leaseq.console import settings as console_settings
from leaseq.runtime import settings as worker_settings
from leaseq.runtime.settings import WorkerSettings
from leaseq_operator import cli as operator_cli
from leaseq_operator import config as operator_config
from leaseq_operator.config import OperatorConfig

WORKER_ENV = {o.env for o in worker_settings.OPTIONS}
OPERATOR_ENV = {o.env for o in operator_config.OPTIONS}
# What each `leaseq <command>` the chart runs reads (worker/leaseq/cli/main.py,
# operator/leaseq_operator/config.py).
READS = {
    "worker": WORKER_ENV,
    "operator": OPERATOR_ENV,
    "migrate": {
        settings.DATABASE_URL.env,
        *(o.env for o in settings.GRANT_OPTIONS),
        *(o.env for o in settings.CONSOLE_GRANT_OPTIONS),
    },
    "console": {o.env for o in console_settings.OPTIONS},
}
# Read by the worker but deliberately not set: its default (hostname-pid) is unique per pod
# and process, and one value for every replica would make them all the same worker.
WORKER_UNSET = {worker_settings.WORKER_ID.env}
SECRET_URL = "postgresql://from-secret"
COMPONENT = "app.kubernetes.io/component"


def container(objs: list[Obj], component: str) -> Obj:
    found: Obj = one(objs, "Deployment", component)["spec"]["template"]["spec"]["containers"][0]
    return found


def leaseq_env(c: Obj) -> set[str]:
    """The LEASEQ_* variables a container gets (not the extraEnv for handlers)."""
    return {n for n in env_names(c) if n.startswith("LEASEQ_")}


def environ(c: Obj) -> dict[str, str]:
    """The container's LEASEQ_* env as the process sees it: Secret and downward-API
    references are replaced by stand-ins (the URL by SECRET_URL, a field by "field:<path>")."""
    out = {}
    for e in c["env"]:
        ref = e.get("valueFrom", {})
        if not e["name"].startswith("LEASEQ_"):
            continue  # extraEnv, for the handlers
        if "secretKeyRef" in ref:
            out[e["name"]] = SECRET_URL
        elif "fieldRef" in ref:
            out[e["name"]] = f"field:{ref['fieldRef']['fieldPath']}"
        else:
            out[e["name"]] = e["value"]
    return out


def worker_settings_of(c: Obj) -> WorkerSettings:
    args = cli.build_parser().parse_args(["worker"])
    return WorkerSettings.from_args(args, environ(c))


def operator_config_of(c: Obj) -> OperatorConfig:
    args = operator_cli.build_parser().parse_args([])
    return OperatorConfig.from_args(args, environ(c))


@pytest.mark.parametrize("values", values_files(), ids=values_id)
def test_every_container_gets_only_what_it_reads(helm: Helm, values: Path | None) -> None:
    objs = helm.render(values, sets={"postgresql.enabled": "true"})
    for obj, spec in pod_specs(objs):
        for c in spec["containers"]:
            given = leaseq_env(c)
            if c.get("command") == ["python", "-c"]:  # the helm test Pod's own script
                reads = {n for n in given if n in c["args"][0]}
            elif given:
                (command,) = c["args"]
                reads = READS[command]
            else:
                continue
            assert given <= reads, f"{obj['metadata']['name']}: {sorted(given - reads)}"


@pytest.mark.parametrize("values", values_files(), ids=values_id)
def test_every_setting_comes_from_values(helm: Helm, values: Path | None) -> None:
    """One-to-one: a new worker or operator setting needs a value (or a reason in
    WORKER_UNSET), and the examples render settings the processes accept."""
    objs = helm.render(values)
    components = {d["metadata"]["labels"][COMPONENT] for d in of_kind(objs, "Deployment")}
    assert components & {"worker", "operator"}
    if "worker" in components:
        worker = container(objs, "worker")
        assert leaseq_env(worker) == WORKER_ENV - WORKER_UNSET
        worker_settings_of(worker)
    if "operator" in components:
        operator = container(objs, "operator")
        assert leaseq_env(operator) == OPERATOR_ENV
        operator_config_of(operator)


# Non-default values, each read back through the process's own settings.
COMMON = {"metricsPort": "9300", "logLevel": "DEBUG", "logFormat": "text"}
WORKER_VALUES = {
    "worker.app": "acme.jobs:registry",
    "worker.queues": "{ocr,pdf}",
    "worker.concurrency": "3",
    "worker.drainSeconds": "50",
    "worker.terminationGracePeriodSeconds": "60",
    "worker.leaseSeconds": "40",
    "worker.heartbeatSeconds": "7",
    "worker.pollSeconds": "2",
    "worker.listen": "false",
}
OPERATOR_VALUES = {
    "operator.reapIntervalSeconds": "3",
    "operator.leaderTtlSeconds": "12",
    "operator.vacuumDeadTuples": "500",
    "operator.hotRetention": "90min",
    "operator.healthPort": "8081",
}
COMMON_SETTINGS: dict[str, Any] = {
    "database_url": SECRET_URL,
    "metrics_port": 9300,
    "log_level": "DEBUG",
    "log_format": "text",
}


def test_worker_values_map_onto_its_settings(helm: Helm) -> None:
    objs = helm.render(sets={**COMMON, **WORKER_VALUES})
    got = worker_settings_of(container(objs, "worker"))
    # The chart gives no id: each process makes its own (its random part differs per call).
    assert got.own_id
    assert got == WorkerSettings(
        **COMMON_SETTINGS,
        worker_id=got.worker_id,
        own_id=True,
        app="acme.jobs:registry",
        queues=("ocr", "pdf"),
        concurrency=3,
        drain_seconds=50,
        lease_seconds=40,
        heartbeat_seconds=7,
        poll_seconds=2,
        listen=False,
        lead=False,  # the chart's operator leads (and scales): workers stay out by default
        pod_name="field:metadata.name",
        node_name="field:spec.nodeName",
    )
    deploy = one(objs, "Deployment", "worker")
    assert deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 60
    # The operator owns replicas: never rendered (tests/chart/test_chart_worker_replicas.py).
    assert "replicas" not in deploy["spec"]
    pool = one(objs, "WorkerPool")
    assert pool["spec"]["deployment"] == deploy["metadata"]["name"]
    assert pool["spec"]["queues"] == ["ocr", "pdf"]


@pytest.mark.parametrize(("cluster_wide", "namespace"), [("false", "jobs"), ("true", "")])
def test_operator_values_map_onto_its_config(helm: Helm, cluster_wide: str, namespace: str) -> None:
    objs = helm.render(sets={**COMMON, **OPERATOR_VALUES, "operator.clusterWide": cluster_wide})
    operator = container(objs, "operator")
    assert operator_config_of(operator) == OperatorConfig(
        **COMMON_SETTINGS,
        namespace=namespace,
        operator_id="field:metadata.name",  # each replica its own name in the leader lease
        reap_interval_seconds=3,
        leader_ttl_seconds=12,
        vacuum_dead_tuples=500,
        hot_retention=5400,
        health_port=8081,
    )
    ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
    assert ports == {"health": 8081, "metrics": 9300}
