"""The operator's ValidatingAdmissionPolicy (issue 11): its CEL, evaluated with cel-python the
way the API server does (matchConditions, then variables, then every validation), against
patches the operator makes and patches a stolen operator token would try."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
from chartkit import Helm, Obj, of_kind, one, tool

SA = "system:serviceaccount:jobs:rel-leaseq-operator"
COST = "controller.kubernetes.io/pod-deletion-cost"
EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"

POD: Obj = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "rel-leaseq-worker-5d9c-abcde",
        "namespace": "jobs",
        "labels": {"app.kubernetes.io/component": "worker", "pod-template-hash": "5d9c"},
        "annotations": {"checksum/config": "abc"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "rel-leaseq-worker-5d9c",
                "uid": "u1",
                "controller": True,
            }
        ],
    },
    "spec": {"containers": [{"name": "worker", "image": "ghcr.io/leaseq/leaseq:1.0"}]},
}


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
        self.conditions = [self._compile(c["expression"]) for c in spec["matchConditions"]]
        self.variables = [(v["name"], self._compile(v["expression"])) for v in spec["variables"]]
        self.validations = [
            (self._compile(v["expression"]), v["message"]) for v in spec["validations"]
        ]

    def _compile(self, expression: str) -> Any:
        return self.env.program(self.env.compile(expression))

    def denials(self, old: Obj, new: Obj, *, user: str = SA, subresource: str = "") -> list[str]:
        """Messages of the failed validations; empty when the update is admitted."""
        request = {
            "userInfo": {"username": user},
            "subResource": subresource,
            "operation": "UPDATE",
        }
        activation: dict[str, Any] = {
            "request": celpy.json_to_cel(request),
            "object": celpy.json_to_cel(new),
            "oldObject": celpy.json_to_cel(old),
        }
        if not all(bool(c.evaluate(activation)) for c in self.conditions):
            return []
        variables: dict[str, Any] = {}
        for name, program in self.variables:
            variables[name] = program.evaluate({**activation, "variables": _cel_map(variables)})
        activation["variables"] = _cel_map(variables)
        return [
            message
            for program, message in self.validations
            if not bool(program.evaluate(activation))
        ]


def _cel_map(values: dict[str, Any]) -> Any:
    return celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in values.items()})


@pytest.fixture(scope="module")
def policy_objects(chart: tuple[Path, bool]) -> list[Obj]:
    return Helm(tool("helm"), chart[0]).render(kube_version="1.30.0")


@pytest.fixture(scope="module")
def policy(policy_objects: list[Obj]) -> Policy:
    return Policy(one(policy_objects, "ValidatingAdmissionPolicy"))


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


@pytest.mark.parametrize("patch", ALLOWED.values(), ids=ALLOWED.keys())
def test_the_operator_may_change_its_two_annotations(policy: Policy, patch: Obj) -> None:
    assert policy.denials(POD, merge_patch(POD, patch)) == []


@pytest.mark.parametrize(("patch", "reason"), FORBIDDEN.values(), ids=FORBIDDEN.keys())
def test_the_operator_may_change_nothing_else(policy: Policy, patch: Obj, reason: str) -> None:
    denials = policy.denials(POD, merge_patch(POD, patch))
    assert denials and any(reason in d for d in denials), denials


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
    assert any("subresources" in d for d in policy.denials(POD, patched, subresource="status"))


def test_other_users_are_not_matched(policy: Policy) -> None:
    patched = merge_patch(POD, {"spec": {"containers": [{"name": "w", "image": "new"}]}})
    assert policy.denials(POD, patched, user="system:serviceaccount:jobs:deployer") == []
    assert policy.denials(POD, patched) != []


def test_the_binding_denies(policy_objects: list[Obj]) -> None:
    policy = one(policy_objects, "ValidatingAdmissionPolicy")
    binding = one(policy_objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConditions"][0]["expression"].endswith(f"'{SA}'")


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
