"""helm's install and upgrade order, modelled over `helm template`: every hook's pods may only
reference objects that exist when helm creates the hook.

What helm does (helm.sh/docs/topics/charts_hooks): CRDs from crds/ first; then the pre-install
hooks one at a time, sorted by weight (then kind, then name), waiting for each Job or Pod to
finish; then every release object at once; then the post-install hooks the same way; `helm
test` hooks run later, when everything exists. An upgrade runs its pre-upgrade hooks while the
previous release's objects still exist. A pod whose ServiceAccount, Secret or ConfigMap does
not exist is never created (the Job controller retries "serviceaccount not found"), so a hook
that references a release object can never finish: the install times out.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from typing import Any

import pytest
from chartkit import Helm, Obj, pod_specs

# Objects a namespace has before anything is installed.
PREEXISTING = {("ServiceAccount", "default")}
# Database settings a user gives, and what the user created beforehand (a plain install
# without a database waits for the Secret the NOTES ask for).
CASES: dict[str, tuple[dict[str, str], set[tuple[str, str]]]] = {
    "database-url": ({"database.url": "postgresql://leaseq:secret@db:5432/leaseq"}, set()),
    "in-cluster-postgresql": ({"postgresql.enabled": "true"}, set()),
    "existing-secret": ({"database.existingSecret": "mine"}, {("Secret", "mine")}),
}
KIND_ORDER = ["ServiceAccount", "Secret", "ConfigMap", "Service", "NetworkPolicy", "Deployment"]


def _hooks(obj: Obj) -> set[str]:
    annotations = obj["metadata"].get("annotations") or {}
    return {h.strip() for h in annotations.get("helm.sh/hook", "").split(",") if h.strip()}


def _weight(obj: Obj) -> int:
    return int((obj["metadata"].get("annotations") or {}).get("helm.sh/hook-weight", "0"))


def _sort_key(obj: Obj) -> tuple[int, int, str]:
    kind = obj["kind"]
    rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    return (_weight(obj), rank, obj["metadata"]["name"])


def references(spec: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(kind, name) of every namespaced object a pod spec needs before its pod can start."""
    yield "ServiceAccount", spec.get("serviceAccountName") or "default"
    for secret in spec.get("imagePullSecrets") or []:
        yield "Secret", secret["name"]
    for volume in spec.get("volumes") or []:
        if "secret" in volume:
            yield "Secret", volume["secret"]["secretName"]
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"]["name"]
        if "persistentVolumeClaim" in volume:
            yield "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]
    for container in (spec.get("initContainers") or []) + spec["containers"]:
        for env in container.get("env") or []:
            source = env.get("valueFrom") or {}
            if "secretKeyRef" in source and not source["secretKeyRef"].get("optional"):
                yield "Secret", source["secretKeyRef"]["name"]
            if "configMapKeyRef" in source and not source["configMapKeyRef"].get("optional"):
                yield "ConfigMap", source["configMapKeyRef"]["name"]
        for env_from in container.get("envFrom") or []:
            for kind, key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
                if key in env_from and not env_from[key].get("optional"):
                    yield kind, env_from[key]["name"]


def missing_at_creation(
    objs: list[Obj], upgrade: bool, created_by_user: AbstractSet[tuple[str, str]] = frozenset()
) -> list[str]:
    """Walk helm's order; name every hook pod reference that does not exist yet at that point."""
    phase = "upgrade" if upgrade else "install"
    release = [o for o in objs if not _hooks(o)]
    exists = PREEXISTING | created_by_user
    if upgrade:  # the previous release's objects are there
        exists |= {(o["kind"], o["metadata"]["name"]) for o in release}
    problems = []

    def run(hook: str) -> None:
        for obj in sorted((o for o in objs if hook in _hooks(o)), key=_sort_key):
            exists.add((obj["kind"], obj["metadata"]["name"]))
            for owner, spec in pod_specs([obj]):
                for ref in references(spec):
                    if ref not in exists:
                        problems.append(
                            f"{hook} hook {owner['kind']}/{owner['metadata']['name']} "
                            f"needs {ref[0]}/{ref[1]}, which does not exist yet"
                        )

    run(f"pre-{phase}")
    exists |= {(o["kind"], o["metadata"]["name"]) for o in release}
    run(f"post-{phase}")
    run("test")
    return problems


@pytest.mark.parametrize("upgrade", [False, True], ids=["install", "upgrade"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_hooks_reference_only_objects_that_exist(helm: Helm, case: str, upgrade: bool) -> None:
    sets, created_by_user = CASES[case]
    objs = helm.render(sets=sets)
    assert any(_hooks(o) for o in objs), "no hooks rendered: the model has nothing to check"
    assert missing_at_creation(objs, upgrade, created_by_user) == []


def test_the_model_catches_a_hook_that_uses_a_release_serviceaccount(helm: Helm) -> None:
    """The model itself: a hook Job pointed at the release's ServiceAccount is refused."""
    objs = helm.render(sets=CASES["database-url"][0])
    [job] = [o for o in objs if o["kind"] == "Job"]
    [account] = [o for o in objs if o["kind"] == "ServiceAccount" and "workload" in str(o)]
    job["spec"]["template"]["spec"]["serviceAccountName"] = account["metadata"]["name"]
    assert missing_at_creation(objs, upgrade=False)
    assert not missing_at_creation(objs, upgrade=True)  # upgrades were never affected
