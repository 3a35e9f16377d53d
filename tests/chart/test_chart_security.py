"""Chart side of issue 11: a database Secret per component with a one-URL fallback, the grants
the migration applies, and cluster-scoped names unique per release and namespace."""

from __future__ import annotations

import pytest
import yaml
from chartkit import Helm, Obj, of_kind, one, pod_specs, run


def secret_of(spec: Obj) -> str:
    (c,) = spec["containers"]
    (url,) = [e for e in c["env"] if e["name"] == "LEASEQ_DATABASE_URL"]
    return str(url["valueFrom"]["secretKeyRef"]["name"])


def secrets_by_component(objs: list[Obj]) -> dict[str, str]:
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: secret_of(spec)
        for o, spec in pod_specs(objs)
        if o["metadata"]["labels"]["app.kubernetes.io/component"] != "postgresql"
    }


def test_one_url_for_every_component_by_default(helm: Helm) -> None:
    objs = helm.render(sets={"database.url": "postgresql://u:p@db/leaseq"})
    assert set(secrets_by_component(objs).values()) == {"rel-leaseq-database"}


def test_a_secret_per_component_in_production(helm: Helm) -> None:
    objs = helm.render(
        sets={
            "database.existingSecret": "shared",
            "database.migration.existingSecret": "leaseq-owner",
            "database.operator.existingSecret": "leaseq-operator",
            "database.worker.existingSecret": "leaseq-worker",
        }
    )
    assert secrets_by_component(objs) == {
        "migrate": "leaseq-owner",
        "operator": "leaseq-operator",
        "worker": "leaseq-worker",
        "test": "leaseq-worker",
    }
    assert not of_kind(objs, "Secret")


def test_only_the_components_without_their_own_secret_fall_back(helm: Helm) -> None:
    objs = helm.render(
        sets={"database.existingSecret": "shared", "database.worker.existingSecret": "w"}
    )
    assert secrets_by_component(objs) == {
        "migrate": "shared",
        "operator": "shared",
        "worker": "w",
        "test": "w",
    }


def test_the_migration_grants_the_configured_roles(helm: Helm) -> None:
    def role_env(objs: list[Obj]) -> dict[str, str]:
        (c,) = one(objs, "Job", "migrate")["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e["value"] for e in c["env"] if e["name"].endswith("_ROLE")}

    assert role_env(helm.render()) == {}
    objs = helm.render(
        sets={
            "database.roles.worker": "leaseq_worker",
            "database.roles.operator": "leaseq_operator",
            "database.roles.producer": "app_producer",
        }
    )
    assert role_env(objs) == {
        "LEASEQ_WORKER_ROLE": "leaseq_worker",
        "LEASEQ_OPERATOR_ROLE": "leaseq_operator",
        "LEASEQ_PRODUCER_ROLE": "app_producer",
    }


def test_role_names_are_checked(helm: Helm) -> None:
    bad = helm.template_raw(sets={"database.roles.worker": "x; DROP TABLE"}, check=False)
    assert bad.returncode != 0 and "roles" in bad.stderr


def cluster_scoped_names(helm: Helm, namespace: str, release: str = "rel") -> set[str]:
    out = run(
        [
            helm.binary,
            "template",
            release,
            str(helm.chart),
            "--namespace",
            namespace,
            "--set",
            "operator.clusterWide=true",
            "--kube-version",
            "1.30.0",
        ]
    ).stdout
    objs = [d for d in yaml.safe_load_all(out) if d]
    kinds = (
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    names = {o["kind"]: o["metadata"]["name"] for o in objs if o["kind"] in kinds}
    assert set(names) == set(kinds)
    assert all(len(n) <= 253 for n in names.values()), names
    return {f"{k}/{n}" for k, n in names.items()}


@pytest.mark.parametrize("release", ["rel", "a-very-long-release-name-that-fills-the-name-budget"])
def test_cluster_scoped_names_are_unique_per_release_and_namespace(
    helm: Helm, release: str
) -> None:
    team_a = cluster_scoped_names(helm, "team-a-with-a-long-namespace-name", release)
    team_b = cluster_scoped_names(helm, "team-b-with-a-long-namespace-name", release)
    assert not team_a & team_b
