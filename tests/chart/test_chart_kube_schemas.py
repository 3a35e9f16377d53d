"""Rendered manifests are valid Kubernetes objects (kubernetes-validate, strict: unknown fields
are errors) for the oldest Kubernetes the chart claims (Chart.yaml kubeVersion) and the newest
one kubernetes-validate knows; the WorkerPool is valid against the CRD's own schema."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chartkit import (
    CHART,
    MONITORING_API,
    Helm,
    Obj,
    of_kind,
    values_files,
    values_id,
)

# Kinds whose schemas come from CRDs, not from Kubernetes itself.
CUSTOM_KINDS = {
    "WorkerPool",
    "ServiceMonitor",
    "PrometheusRule",
}


def oldest_claimed() -> str:
    """The lower bound of Chart.yaml's kubeVersion, e.g. ">=1.29.0-0" -> "1.29.0"."""
    claim = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    m = re.fullmatch(r">=\s*(\d+\.\d+\.\d+)(-0)?", claim)
    assert m, f"kubeVersion {claim!r}: expected a single lower bound"
    return m.group(1)


VERSIONS = [oldest_claimed(), kubernetes_validate.latest_version()]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("values", values_files(), ids=values_id)
def test_manifests_validate(helm: Helm, values: Path | None, version: str) -> None:
    objs = helm.render(
        values,
        sets={"grafana.alerts.enabled": "true", "postgresql.enabled": "true"},
        api_versions=[MONITORING_API],
        kube_version=version,
        include_crds=True,
    )
    unvalidated = set()
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            unvalidated.add(obj["kind"])
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {exc}")
    assert unvalidated <= CUSTOM_KINDS


def crd_schema(crd: Obj) -> Obj:
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: Obj = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("values", values_files(), ids=values_id)
def test_workerpool_valid_against_crd(helm: Helm, values: Path | None) -> None:
    objs = helm.render(values, include_crds=True)
    crds = {c["spec"]["names"]["kind"]: c for c in of_kind(objs, "CustomResourceDefinition")}
    for pool in of_kind(objs, "WorkerPool"):
        # OpenAPI v3 schemas in CRDs follow JSON Schema draft 4 (boolean exclusiveMinimum).
        jsonschema.Draft4Validator(crd_schema(crds["WorkerPool"])).validate(pool)
        assert pool["spec"]["maxReplicas"] >= pool["spec"]["minReplicas"]
