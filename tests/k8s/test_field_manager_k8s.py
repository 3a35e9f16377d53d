"""One owner per field (issue 48): every write the operator makes names its field manager and
touches only the fields it owns.

How the API server turns these writes into ownership (k8s.io/apimachinery is vendored into
kubernetes/kubernetes under staging/src/k8s.io/apimachinery):

- ``fieldManager`` names the manager of a write; without it the server takes the client's
  user agent up to its first "/" (the Python client's was ``OpenAPI-Generator/...``, the
  owner an upgrade conflict used to name; kopf's is ``kopf/...``) -
  staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go, ``managerOrUserAgent``,
  ``prefixFromUserAgent``. kopf sends no ``fieldManager``, so its one write here (removing
  the finalizer earlier versions added) is named by the user agent the operator gives it.
- An *apply* makes its manager own exactly the fields of its configuration, whatever their
  values; any other write (merge or JSON patch, create) takes only the fields whose value it
  changed, and takes them away from every other manager - sigs.k8s.io/structured-merge-diff
  merge/update.go, ``Updater.Apply`` (``managers[manager] = ...configObject.ToFieldSet()``)
  and ``Updater.Update`` (``compare.Modified``/``Added`` moved to the updater,
  ``compare.Removed`` dropped from everyone).
- When an applier leaves out a field it applied before, the field is removed from the object
  unless another *applier* owns it (merge/update.go, ``prune`` and ``addBackOwnedItems``:
  only ``managerSet.Applied()`` sets are added back; a field owned only by updaters goes),
  and a removed ``spec.replicas`` is defaulted to 1 again. Hence the operator's scale is an
  apply: a chart that once rendered replicas and no longer does cannot reset the pool.
- The scale subresource stores its managers' entries on the Deployment, mapped to
  ``.spec.replicas`` and keeping whether they applied
  (staging/src/k8s.io/apimachinery/pkg/util/managedfields/scalehandler.go, ``ToParent``).
"""

from __future__ import annotations

from typing import Any

import pytest
from emulator import EmulatorServer, Write
from harness import NAMESPACE, WORKERPOOLS, Api, StartOperator

import leaseq
from leaseq_operator.kube import FIELD_MANAGER, HELD_ANNOTATION
from leaseq_operator.protection import DELETION_COST, SAFE_TO_EVICT
from support.polling import wait_for

pytestmark = pytest.mark.k8s

DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
SCALE = f"{DEPLOYMENTS}/workers/scale"
POOLS = f"/apis/leaseq.dev/v1/namespaces/{NAMESPACE}/workerpools"
STATUS = f"{POOLS}/ocr/status"
FINALIZER = "leaseq.dev/operator"  # what earlier versions added
EVENTS = f"/api/v1/namespaces/{NAMESPACE}/events"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods/"
POOL = {
    "deployment": "workers",
    "queues": ["ocr"],
    "jobsPerReplica": 2,
    "pollSeconds": 0.1,
    "scaleDownStabilizationSeconds": 0,
}
HELD = {"annotations": {HELD_ANNOTATION: "true"}, "spec": {"paused": True}}


def _since(emulator: EmulatorServer, mark: int) -> list[Write]:
    return list(emulator.emulator.writes[mark:])


def _scale_apply(write: Write, replicas: int) -> bool:
    return (
        write.method == "PATCH"
        and write.path == SCALE
        and write.content_type == "application/apply-patch+yaml"
        and write.params.get("force") == "true"
        and write.body
        == {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": "workers", "namespace": NAMESPACE},
            "spec": {"replicas": replicas},
        }
    )


def _touches_only_its_fields(write: Write) -> bool:
    """The write is one of the operator's four kinds, and carries only the fields it owns."""
    body: Any = write.body
    if write.path == SCALE:
        return _scale_apply(write, body["spec"]["replicas"])
    if write.path.startswith(PODS):
        return (
            write.method == "PATCH"
            and set(body) == {"metadata"}
            and set(body["metadata"]) == {"annotations"}
            and set(body["metadata"]["annotations"]) <= {DELETION_COST, SAFE_TO_EVICT}
        )
    if write.path == STATUS:
        return write.method == "PATCH" and set(body) == {"status"}
    if write.path == EVENTS:
        return write.method == "POST" and body["source"]["component"] == FIELD_MANAGER
    return False


def test_every_write_names_the_operator_and_only_its_fields(
    api: Api, emulator: EmulatorServer, start_operator: StartOperator, queue: leaseq.Queue
) -> None:
    """A scale-down with pods to mark: scale, pod annotations, status and Events, all as
    ``leaseq-operator``, none carrying a field another manager owns."""
    api.create_deployment("workers", replicas=2)
    for pod in ("pod-a", "pod-b"):
        api.create_pod(pod, "workers")
    api.create_pool("ocr", POOL)
    # kopf's own write: it removes the finalizer earlier versions added (runner.py).
    legacy = {"apiVersion": "leaseq.dev/v1", "kind": "WorkerPool"}
    api.custom.create_namespaced_custom_object(
        *WORKERPOOLS[:2],
        NAMESPACE,
        WORKERPOOLS[2],
        {
            **legacy,
            "metadata": {"name": "old", "finalizers": [FINALIZER]},
            "spec": {**POOL, "deployment": "absent"},
        },
    )
    mark = len(emulator.emulator.writes)
    start_operator()
    wait_for(lambda: api.replicas("workers") == 0, what="scaled to zero")
    wait_for(lambda: api.events("ScaledDown"), what="the ScaledDown event")
    wait_for(lambda: not api.pool("old")["metadata"].get("finalizers"), what="finalizer gone")
    writes = _since(emulator, mark)
    kopf_writes = [w for w in writes if w.path == f"{POOLS}/old"]
    assert kopf_writes and all(w.method == "PATCH" for w in kopf_writes)
    # kopf names no fieldManager: the API server then takes the user agent's product.
    assert {w.user_agent.split("/")[0] for w in kopf_writes} == {FIELD_MANAGER}
    writes = [w for w in writes if w not in kopf_writes and "/workerpools/old/" not in w.path]
    assert [w for w in writes if w.params.get("fieldManager") != FIELD_MANAGER] == []
    assert {w.user_agent.split("/")[0] for w in writes} == {FIELD_MANAGER}
    assert [w for w in writes if not _touches_only_its_fields(w)] == []
    kinds = {w.path if not w.path.startswith(PODS) else PODS for w in writes}
    assert kinds == {SCALE, PODS, STATUS, EVENTS}


def test_the_first_pass_applies_an_unchanged_count_once(
    api: Api, emulator: EmulatorServer, start_operator: StartOperator
) -> None:
    """Nothing to scale, yet one apply of the same count: it makes the operator an applier
    of spec.replicas (see the module docstring), and it is not repeated at later polls."""
    api.create_deployment("workers", replicas=0)
    api.create_pool("ocr", POOL)
    mark = len(emulator.emulator.writes)
    start_operator()
    wait_for(
        lambda: sum(w.path == STATUS for w in _since(emulator, mark)) >= 5,
        what="five polls written",
    )
    scales = [w for w in _since(emulator, mark) if w.path == SCALE]
    assert len(scales) == 1
    assert _scale_apply(scales[0], 0)
    assert api.events("ScaledUp") == api.events("ScaledDown") == []


def test_a_deployment_the_chart_holds_is_scaled_then_resumed(
    api: Api, emulator: EmulatorServer, start_operator: StartOperator
) -> None:
    """The chart creates the Deployment paused, without replicas (the API server's default
    is 1): the operator applies its count first, then removes ``spec.paused`` and the
    annotation (removed, not set false: then no manager owns them, and a rollback to the
    revision that set them sets them again without a conflict). The Deployment was paused
    until then, so no ReplicaSet, and no pod, existed at the default of 1."""
    api.create_deployment("workers", replicas=None, held=HELD)
    assert api.replicas("workers") == 1
    api.create_pool("ocr", POOL)
    mark = len(emulator.emulator.writes)
    start_operator()

    def resumed() -> bool:
        found = api.apps.read_namespaced_deployment("workers", NAMESPACE)
        return not found.spec.paused and HELD_ANNOTATION not in (found.metadata.annotations or {})

    wait_for(resumed, what="the Deployment resumed")
    assert api.replicas("workers") == 0
    writes = [w for w in _since(emulator, mark) if w.path.startswith(DEPLOYMENTS)]
    assert _scale_apply(writes[0], 0)
    resume = writes[1]
    assert (resume.method, resume.path, resume.content_type) == (
        "PATCH",
        f"{DEPLOYMENTS}/workers",
        "application/json-patch+json",
    )
    assert resume.params.get("fieldManager") == FIELD_MANAGER
    assert resume.body == [
        {"op": "remove", "path": "/metadata/annotations/leaseq.dev~1paused-until-scaled"},
        {"op": "remove", "path": "/spec/paused"},
    ]
    assert len(writes) == 2


def _resumed(api: Api) -> bool:
    found = api.apps.read_namespaced_deployment("workers", NAMESPACE)
    return not found.spec.paused and HELD_ANNOTATION not in (found.metadata.annotations or {})


def test_a_fresh_install_with_an_empty_queue_resumes_at_zero(
    api: Api, emulator: EmulatorServer, start_operator: StartOperator
) -> None:
    """The chart's fresh install: a held Deployment at the API server's default of 1, which
    never ran a pod (no status). With ``minReplicas: 0``, an empty queue and the chart's
    default window of 300 s, the first count is 0, applied before the resume: no pod starts
    and none waits out the window (not "resumed at 1", then "from 1 to 0" 300 s later)."""
    api.create_deployment("workers", replicas=None, held=HELD)
    api.create_pool("ocr", {**POOL, "minReplicas": 0, "scaleDownStabilizationSeconds": 300})
    mark = len(emulator.emulator.writes)
    start_operator()
    wait_for(lambda: _resumed(api), what="the Deployment resumed")
    writes = [w for w in _since(emulator, mark) if w.path.startswith(DEPLOYMENTS)]
    assert _scale_apply(writes[0], 0), writes[0]
    assert api.replicas("workers") == 0
    status = wait_for(lambda: api.pool("ocr").get("status", {}).get("currentReplicas") == 0)
    assert status
    assert api.events("ScaledDown") == []


def test_a_held_deployment_whose_pods_run_keeps_its_window(
    api: Api, emulator: EmulatorServer, start_operator: StartOperator
) -> None:
    """A rollback to the chart's first revision holds a Deployment again while its pods run
    (``status.replicas``: the Deployment controller's count of its non-terminated pods):
    those are pods to protect, so the scale-down window holds them as for any Deployment."""
    api.create_deployment("workers", replicas=2, held=HELD)
    api.apps.patch_namespaced_deployment_status("workers", NAMESPACE, {"status": {"replicas": 2}})
    api.create_pool("ocr", {**POOL, "minReplicas": 0, "scaleDownStabilizationSeconds": 300})
    start_operator()
    wait_for(lambda: _resumed(api), what="the Deployment resumed")
    assert api.replicas("workers") == 2
    assert api.events("ScaledDown") == []
