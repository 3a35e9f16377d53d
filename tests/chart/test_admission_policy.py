"""The operator's ValidatingAdmissionPolicies (issues 11, 17, 46, 48): their CEL, evaluated with
cel-python the way the API server does (matchConditions, then variables, then every validation; an
expression that errors is a denial, as ``failurePolicy: Fail`` makes it), against patches the
operator makes and patches a stolen operator token would try.

The inputs have the API server's wire shape, because an expression that reads a key the
server leaves out errors (``no such key``) and so denies everything (issue 17):

- ``request`` is built as ``CreateAdmissionRequest`` builds it
  (k8s.io/apiserver/pkg/admission/plugin/cel/condition.go) and converted to unstructured by
  its json tags (k8s.io/api/admission/v1/types.go, ``AdmissionRequest``): ``subResource``
  and ``requestSubResource`` are ``json:"subResource,omitempty"`` /
  ``json:"requestSubResource,omitempty"`` strings, so a patch of the pod itself has no such
  key; ``name`` and ``namespace`` are omitempty too; ``object`` and ``oldObject`` are left
  unset in ``request`` (they are the separate ``object`` / ``oldObject`` variables);
  ``dryRun`` is a ``*bool`` the server always sets; ``userInfo`` is
  k8s.io/api/authentication/v1 ``UserInfo`` (``extra`` omitempty, and empty here).
- the pods are as the server stores them (k8s.io/apimachinery/pkg/apis/meta/v1/types.go,
  ``ObjectMeta``): ``labels``, ``annotations``, ``ownerReferences`` and ``finalizers`` are
  all ``omitempty``, so a pod without annotations has no ``annotations`` key at all, and a
  bare pod has no ``ownerReferences``; in ``OwnerReference``, ``controller`` and
  ``blockOwnerDeletion`` are ``*bool`` omitempty.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonpatch
import pytest
from chartkit import Helm, Obj, of_kind, tool

from leaseq_operator.kube import HELD_ANNOTATION, POOL_LABEL

SA = "system:serviceaccount:jobs:rel-leaseq-operator"
COST = "controller.kubernetes.io/pod-deletion-cost"
EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
# (request.kind, request.resource) by the admitted object's kind. A Scale is admitted as
# the deployments resource's scale subresource (ScaleREST.GroupVersionKind: autoscaling/v1
# Scale for apps/v1).
KINDS = {
    "Pod": ({"group": "", "version": "v1", "kind": "Pod"}, ("", "pods")),
    "Deployment": (
        {"group": "apps", "version": "v1", "kind": "Deployment"},
        ("apps", "deployments"),
    ),
    "Scale": ({"group": "autoscaling", "version": "v1", "kind": "Scale"}, ("apps", "deployments")),
}


def _stored_pod(metadata: Obj) -> Obj:
    """A pod as the API server returns it: server-set metadata, a status, and only the
    metadata keys given (the omitempty ones stay absent)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": "jobs",
            "uid": "0b9e4f6c-1d2a-4c3b-9e8f-7a6b5c4d3e2f",
            "resourceVersion": "81234",
            "creationTimestamp": "2026-12-01T10:00:00Z",
            **metadata,
        },
        "spec": {
            "containers": [{"name": "worker", "image": "ghcr.io/leaseq/leaseq:1.0"}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 60,
        },
        "status": {"phase": "Running"},
    }


# A worker pod of the chart's Deployment: its ReplicaSet's labels and owner, the chart's
# config checksum annotation.
POD: Obj = _stored_pod(
    {
        "name": "rel-leaseq-worker-5d9c-abcde",
        "generateName": "rel-leaseq-worker-5d9c-",
        "labels": {"app.kubernetes.io/component": "worker", "pod-template-hash": "5d9c"},
        "annotations": {"checksum/config": "abc"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "rel-leaseq-worker-5d9c",
                "uid": "u1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
)
# The same pod from a template without annotations: no ``annotations`` key.
POD_WITHOUT_ANNOTATIONS: Obj = copy.deepcopy(POD)
del POD_WITHOUT_ANNOTATIONS["metadata"]["annotations"]
# A pod created on its own (no controller): no labels, annotations or ownerReferences keys.
BARE_POD: Obj = _stored_pod({"name": "debug"})


def admission_request(old: Obj, *, user: str, subresource: str = "") -> Obj:
    """``request`` for an UPDATE (a PATCH) of ``old``, as CreateAdmissionRequest fills it,
    with the omitempty fields absent when empty (see the module docstring)."""
    kind, (group, plural) = KINDS[old["kind"]]
    resource = {"group": group, "version": "v1", "resource": plural}
    request: Obj = {
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": old["metadata"]["name"],
        "namespace": old["metadata"]["namespace"],
        "operation": "UPDATE",
        "userInfo": {
            "username": user,
            "uid": "5e6f7a8b-0000-4000-8000-000000000001",
            "groups": [
                "system:serviceaccounts",
                "system:serviceaccounts:jobs",
                "system:authenticated",
            ],
        },
        "dryRun": False,
        # A patch is admitted as an UPDATE with the patch's options as UpdateOptions.
        "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    if subresource:  # json:"subResource,omitempty", json:"requestSubResource,omitempty"
        request["subResource"] = request["requestSubResource"] = subresource
    return request


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what `kubectl patch --type merge` sends)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class Policy:
    """The rendered policy's CEL, compiled once."""

    def __init__(self, policy: Obj) -> None:
        self.env = celpy.Environment()
        spec = policy["spec"]
        self.conditions = [
            (c["expression"], self._compile(c["expression"])) for c in spec["matchConditions"]
        ]
        self.variables = [
            (v["name"], self._compile(v["expression"])) for v in spec.get("variables", [])
        ]
        self.validations = [
            (v["expression"], self._compile(v["expression"]), v["message"])
            for v in spec["validations"]
        ]

    def _compile(self, expression: str) -> Any:
        return self.env.program(self.env.compile(expression))

    def denials(self, old: Obj, new: Obj, *, user: str = SA, subresource: str = "") -> list[str]:
        """Messages of the failed validations; empty when the update is admitted. An
        expression that errors denies with the server's own wording."""
        request = admission_request(old, user=user, subresource=subresource)
        activation: dict[str, Any] = {
            "request": celpy.json_to_cel(request),
            "object": celpy.json_to_cel(new),
            "oldObject": celpy.json_to_cel(old),
        }
        for expression, program in self.conditions:
            try:
                if not bool(program.evaluate(activation)):
                    return []
            except celpy.CELEvalError as exc:  # failurePolicy: Fail
                return [f"expression '{expression}' resulted in error: {exc.args[0]}"]
        variables: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for name, program in self.variables:
            try:
                variables[name] = program.evaluate({**activation, "variables": _cel_map(variables)})
            except celpy.CELEvalError as exc:
                failed[name] = str(exc.args[0])
        activation["variables"] = _cel_map(variables)
        denials = []
        for expression, program, message in self.validations:
            broken = [
                f"variables.{n}: {e}" for n, e in failed.items() if f"variables.{n}" in expression
            ]
            try:
                if broken:
                    raise celpy.CELEvalError("; ".join(broken))
                if not bool(program.evaluate(activation)):
                    denials.append(message)
            except celpy.CELEvalError as exc:
                denials.append(f"expression '{expression}' resulted in error: {exc.args[0]}")
        return denials


def _cel_map(values: dict[str, Any]) -> Any:
    return celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in values.items()})


@pytest.fixture(scope="module")
def policy_objects(chart: tuple[Path, bool]) -> list[Obj]:
    return Helm(tool("helm"), chart[0]).render(kube_version="1.30.0")


def named(objs: list[Obj], kind: str, part: str) -> Obj:
    """The one object of ``kind`` whose name contains ``part``."""
    [found] = [o for o in of_kind(objs, kind) if part in o["metadata"]["name"]]
    return found


@pytest.fixture(scope="module")
def policy(policy_objects: list[Obj]) -> Policy:
    return Policy(named(policy_objects, "ValidatingAdmissionPolicy", "-operator-pods-"))


@pytest.fixture(scope="module")
def deployment_policy(policy_objects: list[Obj]) -> Policy:
    return Policy(named(policy_objects, "ValidatingAdmissionPolicy", "-operator-deployments-"))


ALLOWED = {
    "set the deletion cost": {"metadata": {"annotations": {COST: "-10"}}},
    "change the deletion cost": {"metadata": {"annotations": {COST: "2147483647"}}},
    "set safe-to-evict": {"metadata": {"annotations": {EVICT: "false"}}},
    "set both": {"metadata": {"annotations": {COST: "0", EVICT: "true"}}},
    "no change at all": {},
}

FORBIDDEN = {
    "change the image": (
        {"spec": {"containers": [{"name": "worker", "image": "evil:latest"}]}},
        "spec",
    ),
    "add a container command": (
        {
            "spec": {
                "containers": [
                    {"name": "worker", "image": "ghcr.io/leaseq/leaseq:1.0", "command": ["sh"]}
                ]
            }
        },
        "spec",
    ),
    "change a label": ({"metadata": {"labels": {"pod-template-hash": "x"}}}, "labels"),
    "add a label": ({"metadata": {"labels": {"role": "admin"}}}, "labels"),
    "remove a label": ({"metadata": {"labels": {"app.kubernetes.io/component": None}}}, "labels"),
    "add another annotation": ({"metadata": {"annotations": {"x": "y"}}}, "only the"),
    "change another annotation": (
        {"metadata": {"annotations": {"checksum/config": "zzz", COST: "1"}}},
        "only the",
    ),
    "remove another annotation": (
        {"metadata": {"annotations": {"checksum/config": None}}},
        "only the",
    ),
    "add a finalizer": (
        {"metadata": {"finalizers": ["evil.example/hold"]}},
        "owners or finalizers",
    ),
    "drop the owner": (
        {"metadata": {"ownerReferences": None, "annotations": {COST: "1"}}},
        "owners",
    ),
    "a non-integer deletion cost": ({"metadata": {"annotations": {COST: "1e9"}}}, "integer"),
    "a bad safe-to-evict": ({"metadata": {"annotations": {EVICT: "maybe"}}}, "true or false"),
}


def _own_messages(denials: list[str]) -> bool:
    """True when every denial is one of the policy's messages, none an evaluation error."""
    return not any("resulted in error" in d for d in denials)


@pytest.mark.parametrize("pod", [POD, POD_WITHOUT_ANNOTATIONS], ids=["annotated", "no-annotations"])
@pytest.mark.parametrize("patch", ALLOWED.values(), ids=ALLOWED.keys())
def test_the_operator_may_change_its_two_annotations(policy: Policy, pod: Obj, patch: Obj) -> None:
    assert policy.denials(pod, merge_patch(pod, patch)) == []


def test_the_request_has_no_subresource_key_for_the_pod_itself() -> None:
    """The trap of issue 17: the policy must not read request.subResource unguarded."""
    request = admission_request(POD, user=SA)
    assert "subResource" not in request and "requestSubResource" not in request
    assert admission_request(POD, user=SA, subresource="status")["subResource"] == "status"


@pytest.mark.parametrize(("patch", "reason"), FORBIDDEN.values(), ids=FORBIDDEN.keys())
def test_the_operator_may_change_nothing_else(policy: Policy, patch: Obj, reason: str) -> None:
    denials = policy.denials(POD, merge_patch(POD, patch))
    assert denials and any(reason in d for d in denials), denials
    assert _own_messages(denials), denials


def test_a_pod_without_annotations_gets_the_policys_own_denials(policy: Policy) -> None:
    patched = merge_patch(POD_WITHOUT_ANNOTATIONS, {"metadata": {"annotations": {"x": "y"}}})
    denials = policy.denials(POD_WITHOUT_ANNOTATIONS, patched)
    assert denials and _own_messages(denials), denials
    assert any("only the" in d for d in denials), denials


def test_a_bare_pod_is_refused_by_the_owner_rule_not_an_error(policy: Policy) -> None:
    patched = merge_patch(BARE_POD, {"metadata": {"annotations": {COST: "1"}}})
    denials = policy.denials(BARE_POD, patched)
    assert any("ReplicaSet" in d for d in denials), denials
    assert _own_messages(denials), denials
    assert "labels" not in patched["metadata"] and "ownerReferences" not in patched["metadata"]


def test_only_pods_a_replicaset_owns(policy: Policy) -> None:
    static = merge_patch(
        POD,
        {
            "metadata": {
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": "kube-proxy",
                        "uid": "u2",
                    }
                ]
            }
        },
    )
    denials = policy.denials(
        static, merge_patch(static, {"metadata": {"annotations": {COST: "1"}}})
    )
    assert any("ReplicaSet" in d for d in denials), denials


def test_no_pod_subresource(policy: Policy) -> None:
    patched = merge_patch(POD, {"metadata": {"annotations": {COST: "1"}}})
    for subresource in ("status", "ephemeralcontainers", "binding"):
        denials = policy.denials(POD, patched, subresource=subresource)
        assert any("subresources" in d for d in denials), denials
        assert _own_messages(denials), denials


def test_other_users_are_not_matched(policy: Policy) -> None:
    patched = merge_patch(POD, {"spec": {"containers": [{"name": "w", "image": "new"}]}})
    assert policy.denials(POD, patched, user="system:serviceaccount:jobs:deployer") == []
    assert policy.denials(POD, patched) != []


@pytest.mark.parametrize("part", ["-operator-pods-", "-operator-deployments-"])
def test_the_binding_denies(policy_objects: list[Obj], part: str) -> None:
    policy = named(policy_objects, "ValidatingAdmissionPolicy", part)
    binding = named(policy_objects, "ValidatingAdmissionPolicyBinding", part)
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConditions"][0]["expression"].endswith(f"'{SA}'")


# The worker Deployment as the API server stores it after the chart created it paused
# (k8s.io/api/apps/v1/types.go, ``DeploymentSpec``: replicas, revisionHistoryLimit and
# progressDeadlineSeconds are defaulted, so present; paused and minReadySeconds are
# omitempty; the chart renders no replicas, so the server's default of 1 is stored).
HELD_DEPLOYMENT: Obj = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {
        "name": "rel-leaseq-worker",
        "namespace": "jobs",
        "uid": "1c9e4f6c-1d2a-4c3b-9e8f-7a6b5c4d3e2f",
        "resourceVersion": "81000",
        "generation": 1,
        "creationTimestamp": "2026-12-01T10:00:00Z",
        "labels": {"app.kubernetes.io/component": "worker"},
        "annotations": {HELD_ANNOTATION: "true", "checkov.io/skip1": "x"},
    },
    "spec": {
        "replicas": 1,
        "paused": True,
        "selector": {"matchLabels": {"app.kubernetes.io/component": "worker"}},
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/component": "worker"}},
            "spec": {"containers": [{"name": "worker", "image": "ghcr.io/leaseq/leaseq:1.0"}]},
        },
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"},
        },
        "revisionHistoryLimit": 5,
        "progressDeadlineSeconds": 600,
    },
    "status": {},
}
RESUME = [
    {"op": "remove", "path": "/metadata/annotations/leaseq.dev~1paused-until-scaled"},
    {"op": "remove", "path": "/spec/paused"},
]


def _json_patched(target: Obj, patch: list[Obj]) -> Obj:
    patched: Obj = jsonpatch.apply_patch(target, patch, in_place=False)
    return patched


def test_the_operator_may_resume_a_held_deployment(deployment_policy: Policy) -> None:
    """What Kube.resume sends (kube.py), and the same resume of a Deployment the chart holds
    but that someone already unpaused (only the annotation left to remove)."""
    assert deployment_policy.denials(HELD_DEPLOYMENT, _json_patched(HELD_DEPLOYMENT, RESUME)) == []
    unpaused = _json_patched(HELD_DEPLOYMENT, [RESUME[1]])
    assert deployment_policy.denials(unpaused, _json_patched(unpaused, [RESUME[0]])) == []


DEPLOYMENT_FORBIDDEN = {
    "change the image": (
        [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil"}],
        "nothing of a Deployment's spec",
    ),
    "change the service account": (
        [{"op": "add", "path": "/spec/template/spec/serviceAccountName", "value": "admin"}],
        "nothing of a Deployment's spec",
    ),
    "scale through the Deployment": (
        [*RESUME, {"op": "replace", "path": "/spec/replicas", "value": 50}],
        "scale subresource",
    ),
    "change the strategy": (
        [{"op": "replace", "path": "/spec/strategy/type", "value": "Recreate"}],
        "nothing of a Deployment's spec",
    ),
    "keep it paused": ([RESUME[0]], "may not pause"),
    "change a label": (
        [{"op": "add", "path": "/metadata/labels/role", "value": "admin"}],
        "labels, owners or finalizers",
    ),
    "remove another annotation": (
        [{"op": "remove", "path": "/metadata/annotations/checkov.io~1skip1"}],
        "only remove the leaseq.dev/paused-until-scaled annotation",
    ),
    "add an annotation": (
        [{"op": "add", "path": "/metadata/annotations/x", "value": "y"}],
        "only remove the leaseq.dev/paused-until-scaled annotation",
    ),
}


@pytest.mark.parametrize(
    ("patch", "reason"), DEPLOYMENT_FORBIDDEN.values(), ids=DEPLOYMENT_FORBIDDEN.keys()
)
def test_the_operator_may_change_nothing_else_of_a_deployment(
    deployment_policy: Policy, patch: list[Obj], reason: str
) -> None:
    denials = deployment_policy.denials(HELD_DEPLOYMENT, _json_patched(HELD_DEPLOYMENT, patch))
    assert denials and any(reason in d for d in denials), denials
    assert _own_messages(denials), denials


def test_only_a_deployment_the_chart_holds(deployment_policy: Policy) -> None:
    """A Deployment without the annotation (every worker Deployment once resumed, and any
    other Deployment in the namespace) cannot be touched, not even unpaused, and neither can
    a Deployment's status."""
    running = _json_patched(HELD_DEPLOYMENT, [RESUME[0]])
    denials = deployment_policy.denials(running, _json_patched(running, [RESUME[1]]))
    assert any("created paused" in d for d in denials), denials
    assert _own_messages(denials), denials
    patched = _json_patched(HELD_DEPLOYMENT, RESUME)
    denials = deployment_policy.denials(HELD_DEPLOYMENT, patched, subresource="status")
    assert any("status" in d for d in denials), denials
    other = "system:serviceaccount:jobs:deployer"
    assert deployment_policy.denials(running, _json_patched(running, [RESUME[1]]), user=other) == []


def test_on_by_default_only_where_the_api_exists(helm: Helm) -> None:
    assert not of_kind(helm.render(kube_version="1.29.0"), "ValidatingAdmissionPolicy")
    assert of_kind(
        helm.render(
            kube_version="1.29.0",
            api_versions=["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"],
        ),
        "ValidatingAdmissionPolicy",
    )
    off = helm.render(kube_version="1.31.0", sets={"operator.admissionPolicy.enabled": "false"})
    assert not of_kind(off, "ValidatingAdmissionPolicy")


# -- clusterWide mode (issue 46): only Deployments labelled for a WorkerPool, and their pods --


@pytest.fixture(scope="module")
def scoped_objects(chart: tuple[Path, bool]) -> list[Obj]:
    return Helm(tool("helm"), chart[0]).render(
        kube_version="1.30.0", sets={"operator.clusterWide": "true"}
    )


@pytest.fixture(scope="module")
def scoped_pods(scoped_objects: list[Obj]) -> Policy:
    return Policy(named(scoped_objects, "ValidatingAdmissionPolicy", "-operator-pods-"))


@pytest.fixture(scope="module")
def scoped_deployments(scoped_objects: list[Obj]) -> Policy:
    return Policy(named(scoped_objects, "ValidatingAdmissionPolicy", "-operator-deployments-"))


@pytest.fixture(scope="module")
def scale_policy(scoped_objects: list[Obj]) -> Policy:
    return Policy(named(scoped_objects, "ValidatingAdmissionPolicy", "-operator-scale-"))


def _scale(selector: str | None, replicas: int = 2) -> Obj:
    """A Deployment's Scale as the API server admits a scale request (storage.go,
    ``scaleFromDeployment``): five metadata fields, spec.replicas, and status with the
    Deployment's selector as a string (``json:"selector,omitempty"``)."""
    status: Obj = {"replicas": replicas}
    if selector is not None:
        status["selector"] = selector
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": "rel-leaseq-worker",
            "namespace": "team-b",
            "uid": "1c9e4f6c-1d2a-4c3b-9e8f-7a6b5c4d3e2f",
            "resourceVersion": "81000",
            "creationTimestamp": "2026-12-01T10:00:00Z",
        },
        "spec": {"replicas": replicas},
        "status": status,
    }


# metav1.LabelSelectorAsSelector(...).String(): requirements sorted by key, joined by ",";
# a matchLabels entry prints as key=value.
LABELLED_SELECTOR = (
    "app.kubernetes.io/component=worker,app.kubernetes.io/instance=rel,"
    f"app.kubernetes.io/name=leaseq,{POOL_LABEL}=rel-leaseq-worker"
)
UNLABELLED_SELECTORS = {
    "another Deployment": "app=payments",
    "the label negated": f"app=payments,{POOL_LABEL}!=x",
    "the label required absent": f"!{POOL_LABEL},app=payments",
    "a longer key ending in it": f"app=payments,evil.{POOL_LABEL}=x",
    "a key prefixed by it": f"app=payments,{POOL_LABEL}x=y",
    "a set-based requirement": f"app=payments,{POOL_LABEL} in (a)",
}


def _scaled(scale: Obj, replicas: int) -> Obj:
    return merge_patch(scale, {"spec": {"replicas": replicas}})


@pytest.mark.parametrize("selector", [LABELLED_SELECTOR, f"{POOL_LABEL}=ocr"])
def test_cluster_wide_the_operator_may_scale_a_labelled_deployment(
    scale_policy: Policy, selector: str
) -> None:
    scale = _scale(selector)
    assert scale_policy.denials(scale, _scaled(scale, 7), subresource="scale") == []


@pytest.mark.parametrize(
    "selector", [*UNLABELLED_SELECTORS.values(), None], ids=[*UNLABELLED_SELECTORS, "no selector"]
)
def test_cluster_wide_the_operator_may_not_scale_another_deployment(
    scale_policy: Policy, selector: str | None
) -> None:
    scale = _scale(selector)
    denials = scale_policy.denials(scale, _scaled(scale, 0), subresource="scale")
    assert any("may only scale a Deployment" in d for d in denials), denials
    assert _own_messages(denials), denials
    other = "system:serviceaccount:team-b:deployer"
    assert scale_policy.denials(scale, _scaled(scale, 0), user=other, subresource="scale") == []


def test_cluster_wide_the_scale_policy_matches_only_scale_updates(
    scoped_objects: list[Obj],
) -> None:
    spec = named(scoped_objects, "ValidatingAdmissionPolicy", "-operator-scale-")["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["apps"],
            "apiVersions": ["*"],
            "operations": ["UPDATE"],
            "resources": ["deployments/scale"],
        }
    ]
    assert spec["matchConditions"][0]["expression"].endswith(f"'{SA}'")


LABELLED_POD: Obj = merge_patch(POD, {"metadata": {"labels": {POOL_LABEL: "ocr"}}})


@pytest.mark.parametrize("patch", ALLOWED.values(), ids=ALLOWED.keys())
def test_cluster_wide_the_operator_may_annotate_a_labelled_pod(
    scoped_pods: Policy, patch: Obj
) -> None:
    assert scoped_pods.denials(LABELLED_POD, merge_patch(LABELLED_POD, patch)) == []


def test_cluster_wide_the_operator_may_not_annotate_another_pod(scoped_pods: Policy) -> None:
    """Any other ReplicaSet's pod, in any namespace: the pod of an unlabelled Deployment."""
    for pod in (POD, POD_WITHOUT_ANNOTATIONS):
        denials = scoped_pods.denials(
            pod, merge_patch(pod, {"metadata": {"annotations": {COST: "1"}}})
        )
        assert any("labelled leaseq.dev/worker-pool" in d for d in denials), denials
        assert _own_messages(denials), denials
    # ... nor label one to make it annotatable: the label rule holds in both modes.
    labelled = merge_patch(POD, {"metadata": {"labels": {POOL_LABEL: "ocr"}}})
    denials = scoped_pods.denials(POD, labelled)
    assert any("may not change a pod's labels" in d for d in denials), denials


def test_cluster_wide_the_operator_may_resume_only_a_labelled_deployment(
    scoped_deployments: Policy,
) -> None:
    labelled = merge_patch(
        HELD_DEPLOYMENT, {"spec": {"selector": {"matchLabels": {POOL_LABEL: "ocr"}}}}
    )
    assert scoped_deployments.denials(labelled, _json_patched(labelled, RESUME)) == []
    denials = scoped_deployments.denials(HELD_DEPLOYMENT, _json_patched(HELD_DEPLOYMENT, RESUME))
    assert any("selector.matchLabels carries leaseq.dev/worker-pool" in d for d in denials)
    assert _own_messages(denials), denials


def test_namespaced_mode_needs_no_label(policy_objects: list[Obj], policy: Policy) -> None:
    """Within its own namespace (a Role) the operator's policies ask for no label, so a
    namespaced install keeps working with unlabelled Deployments."""
    scale = Policy(named(policy_objects, "ValidatingAdmissionPolicy", "-operator-scale-"))
    unlabelled = _named_scale("rel-leaseq-worker", "jobs", selector="app=workers")
    assert scale.denials(unlabelled, _scaled(unlabelled, 3), subresource="scale") == []
    assert policy.denials(POD, merge_patch(POD, {"metadata": {"annotations": {COST: "1"}}})) == []


# -- a namespaced install (issue 65): only the Deployments the release names --


def _named_scale(name: str, namespace: str, selector: str | None = None) -> Obj:
    """The Scale of Deployment ``namespace/name`` (request.name and request.namespace are
    the Deployment's on a scale request, as admission_request sets them)."""
    return merge_patch(_scale(selector), {"metadata": {"name": name, "namespace": namespace}})


@pytest.fixture(scope="module")
def named_objects(chart: tuple[Path, bool]) -> list[Obj]:
    return Helm(tool("helm"), chart[0]).render(
        kube_version="1.30.0", sets={"operator.deployments": "{gpu-workers}"}
    )


@pytest.mark.parametrize("name", ["rel-leaseq-worker", "gpu-workers"])
def test_namespaced_the_operator_may_scale_and_resume_the_named_deployments(
    named_objects: list[Obj], name: str
) -> None:
    scale = Policy(named(named_objects, "ValidatingAdmissionPolicy", "-operator-scale-"))
    deployments = Policy(
        named(named_objects, "ValidatingAdmissionPolicy", "-operator-deployments-")
    )
    target = _named_scale(name, "jobs")
    assert scale.denials(target, _scaled(target, 0), subresource="scale") == []
    held = merge_patch(HELD_DEPLOYMENT, {"metadata": {"name": name}})
    assert deployments.denials(held, _json_patched(held, RESUME)) == []


@pytest.mark.parametrize(
    ("name", "namespace"),
    [("rel-leaseq-operator", "jobs"), ("payments", "jobs"), ("rel-leaseq-worker", "team-b")],
    ids=["the operator itself", "another Deployment", "the same name elsewhere"],
)
def test_namespaced_the_operator_may_not_scale_or_resume_another_deployment(
    named_objects: list[Obj], name: str, namespace: str
) -> None:
    """What a stolen token tried on a real cluster: a scale of the operator's own Deployment
    answered 200. The policy refuses every Deployment the release does not name."""
    scale = Policy(named(named_objects, "ValidatingAdmissionPolicy", "-operator-scale-"))
    target = _named_scale(name, namespace)
    denials = scale.denials(target, _scaled(target, 5), subresource="scale")
    assert any("may only scale the Deployments its release names" in d for d in denials)
    assert _own_messages(denials), denials
    deployments = Policy(
        named(named_objects, "ValidatingAdmissionPolicy", "-operator-deployments-")
    )
    held = merge_patch(HELD_DEPLOYMENT, {"metadata": {"name": name, "namespace": namespace}})
    denials = deployments.denials(held, _json_patched(held, RESUME))
    assert any("may only resume the Deployments its release names" in d for d in denials)
    assert _own_messages(denials), denials
    other = "system:serviceaccount:jobs:deployer"
    assert scale.denials(target, _scaled(target, 5), user=other, subresource="scale") == []


@pytest.mark.parametrize("part", ["-operator-pods-", "-operator-deployments-", "-operator-scale-"])
def test_cluster_wide_every_binding_covers_every_namespace(
    scoped_objects: list[Obj], part: str
) -> None:
    """No matchResources: a binding without it matches every namespace (and the policy's
    matchConstraints alone choose the requests)."""
    policy = named(scoped_objects, "ValidatingAdmissionPolicy", part)
    binding = named(scoped_objects, "ValidatingAdmissionPolicyBinding", part)
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }


# Writes the ClusterRole may grant without a label rule: the operator's own WorkerPools (and
# their status), and Events (create only, about its WorkerPools).
UNLABELLED_WRITES = {
    ("leaseq.dev", "workerpools"),
    ("leaseq.dev", "workerpools/status"),
    ("", "events"),
}


def test_cluster_wide_every_write_the_cluster_role_grants_needs_the_label(
    scoped_objects: list[Obj],
) -> None:
    """Each resource the ClusterRole lets the operator write is matched, for UPDATE, by a
    policy that requires the pool label; a write rule added to the ClusterRole without one
    fails here."""
    [role] = of_kind(scoped_objects, "ClusterRole")
    writes = {
        (group, resource)
        for rule in role["rules"]
        if set(rule["verbs"]) - {"get", "list", "watch"}
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert writes - UNLABELLED_WRITES == {
        ("apps", "deployments"),
        ("apps", "deployments/scale"),
        ("", "pods"),
    }
    for group, resource in writes - UNLABELLED_WRITES:
        policing = [
            p
            for p in of_kind(scoped_objects, "ValidatingAdmissionPolicy")
            for r in p["spec"]["matchConstraints"]["resourceRules"]
            if group in r["apiGroups"]
            and resource in r["resources"]
            and "UPDATE" in r["operations"]
            and any(
                label in v["expression"]
                for v in p["spec"]["validations"]
                for label in (POOL_LABEL, POOL_LABEL.replace(".", "[.]"))
            )
        ]
        assert policing, (group, resource)
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs <= {"get", "list", "watch", "patch", "create"}, "a write that is not an UPDATE"
