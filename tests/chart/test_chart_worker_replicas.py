"""One owner per field (issue 48): the chart never renders what the operator owns.

The operator owns the worker Deployment's ``spec.replicas``: it applies the scale subresource
as the field manager ``leaseq-operator`` (operator/leaseq_operator/kube.py, ``Kube.scale``).
The chart renders no ``replicas`` (one exception: the first upgrade of a release an older
chart installed, until the operator applied the field; see the last test), so by the
server-side apply rules no apply of the chart can conflict with the operator or reset the
pool:

- an apply conflicts only over fields in its own configuration whose value it changes and
  another manager owns (sigs.k8s.io/structured-merge-diff merge/update.go, ``update``:
  ``managerSet.Intersection(compare.Modified.Union(compare.Added))``; the error helm printed
  is built in staging/src/k8s.io/apimachinery/pkg/util/managedfields/internal/conflict.go,
  ``NewConflictError``): no ``replicas`` in the configuration, no conflict over it;
- a field an applier leaves out is removed only when that applier applied it last time and no
  other applier owns it (merge/update.go, ``prune``, ``addBackOwnedItems``): the operator is
  an applier of ``replicas`` (its scale is an apply), so not even a release installed by an
  older chart, whose revisions applied ``replicas``, loses the pool's size on upgrade;
- the scale subresource's managers are kept on the Deployment under ``.spec.replicas``
  (staging/src/k8s.io/apimachinery/pkg/util/managedfields/scalehandler.go, ``ToParent``).

Install, upgrade and rollback are rendered as helm renders them, with ``lookup`` answering
from an emulated API server (``helm template --dry-run=server``, the emulator of tests/k8s),
where the operator's real client code scaled the live Deployment. A rollback renders nothing:
helm applies the manifest it stored for the target revision, i.e. an earlier install or
upgrade render, so each stored render is checked. A GitOps tool renders without a cluster
(``helm template``: lookup answers nothing).

Without ``replicas`` the API server creates a Deployment at 1 replica (k8s.io/api/apps/v1
``DeploymentSpec.Replicas``: "Defaults to 1"), so the Deployment helm creates is created
paused (a paused Deployment gets no new ReplicaSet: pkg/controller/deployment/sync.go,
``sync`` calls ``getAllReplicaSetsAndSyncRevision`` with ``createIfNotExisted`` false) with
an annotation saying so; the operator applies its count and then removes both
(tests/k8s/test_field_manager_k8s.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from chartkit import Helm, Obj, one
from k8s.emulator import CRD_PATH, EmulatorServer, leaseq_server

from leaseq_operator.kube import FIELD_MANAGER, HELD_ANNOTATION, POOL_LABEL, Cluster, Kube

NAMESPACE = "jobs"
WORKER = "rel-leaseq-worker"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[EmulatorServer, list[str]]]:
    """An emulated API server, and the helm flags that render against it."""
    with leaseq_server(yaml.safe_load(CRD_PATH.read_text())) as server:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "e", "cluster": {"server": server.url}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "e", "context": {"cluster": "e", "user": "u"}}],
                    "current-context": "e",
                }
            )
        )
        flags = [
            "--dry-run=server",
            "--disable-openapi-validation",
            "--kubeconfig",
            str(kubeconfig),
        ]
        yield server, flags


@pytest.fixture
def apps(
    cluster: tuple[EmulatorServer, list[str]],
) -> Iterator[kubernetes.client.AppsV1Api]:
    """The test's own client: it does to the Deployment what helm's apply would."""
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=cluster[0].url))
    yield kubernetes.client.AppsV1Api(client)
    client.close()  # type: ignore[no-untyped-call]


def _paths(value: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every leaf path of a JSON value (list items by index: none are in the operator's set)."""
    if isinstance(value, dict):
        return {p for k, v in value.items() for p in _paths(v, (*prefix, str(k)))} or {prefix}
    if isinstance(value, list):
        return {p for i, v in enumerate(value) for p in _paths(v, (*prefix, str(i)))} or {prefix}
    return {prefix}


def _operator_owned(server: EmulatorServer) -> set[tuple[str, ...]]:
    """The Deployment fields the operator's applies claimed: the leaf paths of every apply
    it sent, a Scale's mapped onto the Deployment as scalehandler.go maps them."""
    owned = set()
    for write in server.emulator.writes:
        if write.params.get("fieldManager") != FIELD_MANAGER:
            continue
        if write.content_type != "application/apply-patch+yaml":
            continue
        assert write.path.endswith(f"/deployments/{WORKER}/scale"), write.path
        owned |= {p for p in _paths(write.body) if p[0] == "spec"}
    return owned


def _deployment(objects: list[Obj]) -> Obj:
    return one(objects, "Deployment", "worker")


def _held(deployment: Obj) -> bool:
    return (
        deployment["spec"].get("paused") is True
        and deployment["metadata"].get("annotations", {}).get(HELD_ANNOTATION) == "true"
    )


@pytest.mark.parametrize("min_replicas", ["0", "3"])
def test_install_upgrade_and_rollback_never_render_what_the_operator_owns(
    helm: Helm,
    cluster: tuple[EmulatorServer, list[str]],
    apps: kubernetes.client.AppsV1Api,
    min_replicas: str,
) -> None:
    server, flags = cluster
    sets = {"worker.pool.minReplicas": min_replicas}
    install = helm.render(sets=sets, extra=flags)
    created = _deployment(install)
    assert _held(created), "helm creates the Deployment paused until the operator scaled it"

    # The Deployment as helm created it; the operator scales it (9 busy workers) and resumes.
    kube = Kube(Cluster.at(server.url))
    try:
        apps.create_namespaced_deployment(NAMESPACE, created)
        assert kube.target(NAMESPACE, WORKER).held
        kube.scale(NAMESPACE, WORKER, 9)
        kube.resume(NAMESPACE, WORKER, paused=True)
        assert kube.target(NAMESPACE, WORKER).replicas == 9
    finally:
        kube.close()
    owned = _operator_owned(server)
    assert owned == {("spec", "replicas")}

    upgrade = helm.render(sets={**sets, "worker.concurrency": "8"}, extra=[*flags, "--is-upgrade"])
    gitops = helm.render(sets=sets)
    renders = {
        "install (applied again by a rollback to revision 1)": install,
        "upgrade (applied again by a rollback to its revision)": upgrade,
        "GitOps (helm template, no cluster)": gitops,
    }
    for name, objects in renders.items():
        deployment = _deployment(objects)
        assert not (_paths(deployment) & owned), name
        assert all(o["kind"] != "Scale" for o in objects), name
    # Only helm's own install holds the Deployment: an upgrade of a running pool never
    # pauses it, and a GitOps render (no cluster answers lookup) cannot tell an install.
    assert not _held(_deployment(upgrade))
    assert not _held(_deployment(gitops))
    assert _deployment(upgrade)["spec"]["template"] != created["spec"]["template"]


def test_no_hold_without_an_operator_to_resume(
    helm: Helm, cluster: tuple[EmulatorServer, list[str]]
) -> None:
    """With the operator off nothing would resume a paused Deployment: helm creates it
    unpaused (at the API server's default of 1 replica)."""
    _, flags = cluster
    deployment = _deployment(helm.render(sets={"operator.enabled": "false"}, extra=flags))
    assert "paused" not in deployment["spec"]
    assert "replicas" not in deployment["spec"]


def _entry(manager: str, **extra: str) -> Obj:
    """A managedFields entry owning ``.spec.replicas`` by an apply (the shape the API server
    stores: staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/types.go,
    ``ManagedFieldsEntry``; a scale apply keeps ``subresource: scale``, scalehandler.go)."""
    return {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": "apps/v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:replicas": {}}},
        **extra,
    }


def test_an_older_release_keeps_its_count_until_the_operator_applied_it(
    helm: Helm, cluster: tuple[EmulatorServer, list[str]], apps: kubernetes.client.AppsV1Api
) -> None:
    """A release an older chart installed: helm applied ``replicas`` in every revision. If
    the upgrade simply left it out, helm (an applier of the field) would remove it unless
    another applier owns it (merge/update.go, ``prune``: ``addBackOwnedItems`` keeps only
    fields in an ``Applied`` manager's set), and the API server would default it to 1. So the
    chart renders the live count once more until the operator's own apply owns the field."""
    _, flags = cluster
    created = _deployment(helm.render(extra=flags))
    older = {**created, "spec": {**created["spec"], "replicas": 7}}
    del older["spec"]["paused"]
    older["metadata"] = {**created["metadata"], "managedFields": [_entry("helm")]}
    apps.create_namespaced_deployment(NAMESPACE, older)
    upgrade = _deployment(helm.render(extra=[*flags, "--is-upgrade"]))
    assert upgrade["spec"]["replicas"] == 7

    claimed = [_entry("helm"), _entry(FIELD_MANAGER, subresource="scale")]
    apps.patch_namespaced_deployment(
        WORKER,
        NAMESPACE,
        {"metadata": {"managedFields": claimed}},
        _content_type="application/merge-patch+json",
    )
    upgrade = _deployment(helm.render(extra=[*flags, "--is-upgrade"]))
    assert "replicas" not in upgrade["spec"]


def test_cluster_wide_refuses_a_worker_deployment_without_the_pool_label(
    helm: Helm, cluster: tuple[EmulatorServer, list[str]], apps: kubernetes.client.AppsV1Api
) -> None:
    """clusterWide (issue 46) puts leaseq.dev/worker-pool in the worker Deployment's selector,
    which cannot change on a live Deployment: switching a release to clusterWide (or
    upgrading one an older chart installed) fails at render time saying what to do, instead
    of the API server's "field is immutable" halfway through the upgrade."""
    _, flags = cluster
    created = _deployment(helm.render(extra=flags))
    assert POOL_LABEL not in created["spec"]["selector"]["matchLabels"]
    apps.create_namespaced_deployment(NAMESPACE, created)
    sets = {"operator.clusterWide": "true"}
    failed = helm.template_raw(sets=sets, extra=[*flags, "--is-upgrade"], check=False)
    assert failed.returncode != 0
    assert f"no {POOL_LABEL}={WORKER} in its selector" in failed.stderr, failed.stderr
    assert f"kubectl delete deployment {WORKER} -n {NAMESPACE}" in failed.stderr

    apps.delete_namespaced_deployment(WORKER, NAMESPACE)
    labelled = _deployment(helm.render(sets=sets, extra=flags))
    apps.create_namespaced_deployment(NAMESPACE, labelled)
    upgrade = _deployment(helm.render(sets=sets, extra=[*flags, "--is-upgrade"]))
    assert upgrade["spec"]["selector"] == labelled["spec"]["selector"]


def test_the_guide_names_what_the_cluster_shows() -> None:
    """The Kubernetes guide's section names the field manager and the annotation the code
    uses (each of its other sentences is one of the tests above or in
    tests/k8s/test_field_manager_k8s.py)."""
    guide = (Path(__file__).parents[2] / "docs" / "guides" / "kubernetes.md").read_text()
    section = guide[guide.index("## Who owns the worker Deployment's replicas") :]
    section = section[: section.index("\n## ")]
    assert f"`{FIELD_MANAGER}`" in section
    assert f"`{HELD_ANNOTATION}`" in section
