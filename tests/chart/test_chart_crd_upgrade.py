"""The WorkerPool CRD across a chart upgrade (issue 65), tested offline on both versions.

What Helm 4 does with ``crds/`` (helm/helm v4, pkg/action):

- ``helm install`` (install.go, ``installCRDs``) sends every file of ``crds/`` through
  ``KubeClient.Create(res, kube.ClientCreateOptionServerSideApply(i.ServerSideApply,
  i.ForceConflicts))``; ``ServerSideApply`` defaults to true (``NewInstall``), and then
  ``Create`` is a server-side apply patch (pkg/kube/client.go ``makeCreateApplyFunc``,
  ``patchResourceServerSide``), which updates a CRD that exists instead of failing with
  AlreadyExists. So an install applies the chart's CRD over an existing one (field manager
  ``helm``; a field another manager owns is a conflict that fails the install unless
  ``--force-conflicts``). Only ``--server-side=false`` gives Helm 3's "create, skip if it
  exists", and ``--skip-crds`` skips the directory.
- ``helm upgrade`` (upgrade.go, ``prepareUpgrade``) renders with ``includeCrds`` false and
  never installs ``crds/``: a chart upgrade leaves the CRD as it was. ``helm rollback`` and
  ``helm uninstall`` do not touch it either.

So the guide's upgrade path for a release whose chart changed the CRD is
``kubectl apply --server-side -f charts/leaseq/crds/`` first, then ``helm upgrade``. These
tests take the CRD of the previous release (tests/chart/fixtures, from git) and the current
one, and check what that path relies on: the change only adds (every WorkerPool the previous
CRD admitted, the current one admits: same served and storage version, no field removed, no
bound narrowed, nothing newly required), and a chart that uses an added field renders a
WorkerPool that the previous CRD does not know (the API server refuses Helm's strict
server-side apply of it: ``unknown field``), which is why the CRD goes first.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import CHART, CRD_PATH, REPO, Helm, Obj, one

PREVIOUS = Path(__file__).with_name("fixtures") / "workerpools.leaseq.dev.previous.yaml"
GUIDE = REPO / "docs" / "guides" / "kubernetes.md"
APPLY_CRD = "kubectl apply --server-side -f charts/leaseq/crds/"
# Bounds whose larger value admits more (a maximum) or less (a minimum).
UPPER = ("maximum", "maxLength", "maxItems", "maxProperties")
LOWER = ("minimum", "minLength", "minItems", "minProperties")


def _load(path: Path) -> Obj:
    loaded: Obj = yaml.safe_load(path.read_text())
    return loaded


def _version(crd: Obj) -> Obj:
    [version] = crd["spec"]["versions"]
    return dict(version)


def _schema(crd: Obj) -> Obj:
    schema: Obj = _version(crd)["schema"]["openAPIV3Schema"]
    return schema


def narrowed(previous: Obj, current: Obj, path: str = "") -> list[str]:
    """Where ``current`` (a schema) admits less than ``previous``: a field removed, a type
    changed, a bound narrowed, an enum value or pattern dropped, a field newly required."""
    problems = []
    if previous.get("type") != current.get("type"):
        problems.append(f"{path or '.'}: type {previous.get('type')} -> {current.get('type')}")
    for bound in UPPER:
        if bound in current and current[bound] < previous.get(bound, float("inf")):
            problems.append(f"{path}: {bound} {previous.get(bound)} -> {current[bound]}")
    for bound in LOWER:
        if bound in current and current[bound] > previous.get(bound, float("-inf")):
            problems.append(f"{path}: {bound} {previous.get(bound)} -> {current[bound]}")
    if "enum" in current and set(previous.get("enum", current["enum"])) - set(current["enum"]):
        problems.append(f"{path}: enum {previous.get('enum')} -> {current['enum']}")
    if current.get("pattern", previous.get("pattern")) != previous.get("pattern"):
        problems.append(f"{path}: pattern {previous.get('pattern')} -> {current['pattern']}")
    added = set(current.get("required", [])) - set(previous.get("required", []))
    problems += [f"{path}.{name}: newly required" for name in sorted(added)]
    for name, field in previous.get("properties", {}).items():
        if name not in current.get("properties", {}):
            problems.append(f"{path}.{name}: removed")
        else:
            problems += narrowed(field, current["properties"][name], f"{path}.{name}")
    if "items" in previous and "items" in current:
        problems += narrowed(previous["items"], current["items"], f"{path}[]")
    return problems


def added_fields(previous: Obj, current: Obj, path: str = "") -> list[str]:
    """Fields ``current`` (a schema) has that ``previous`` lacks."""
    found = []
    for name, field in current.get("properties", {}).items():
        if name not in previous.get("properties", {}):
            found.append(f"{path}.{name}")
        else:
            found += added_fields(previous["properties"][name], field, f"{path}.{name}")
    return found


def unknown_fields(value: Any, schema: Obj, path: str = "") -> list[str]:
    """Fields of ``value`` its structural schema does not declare: what the API server's
    strict field validation refuses (``unknown field``) and pruning would drop."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and "properties" in schema:
        found = []
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(item, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(value, list) and "items" in schema:
        return [f for item in value for f in unknown_fields(item, schema["items"], f"{path}[]")]
    return []


@pytest.fixture(scope="module")
def previous() -> Obj:
    return _load(PREVIOUS)


@pytest.fixture(scope="module")
def current(real_crd: bool) -> Obj:
    if not real_crd:
        pytest.skip("the chart's CRD is absent from this tree")
    return _load(CHART / CRD_PATH)


def test_the_crd_change_keeps_the_version_and_stored_objects(previous: Obj, current: Obj) -> None:
    """No storage version migration and no stored WorkerPool made invalid: applying the
    new CRD before ``helm upgrade`` cannot break a WorkerPool the previous one admitted."""
    assert previous["metadata"]["name"] == current["metadata"]["name"]
    old, new = _version(previous), _version(current)
    assert (old["name"], old["served"], old["storage"]) == (new["name"], True, True)
    assert narrowed(_schema(previous), _schema(current)) == []


def test_the_change_adds_the_scale_ahead_fields(previous: Obj, current: Obj) -> None:
    assert added_fields(_schema(previous), _schema(current)) == [
        ".spec.scaleAheadSeconds",
        ".status.coming",
        ".status.scaleAheadSeconds",
    ]


def test_narrowed_finds_what_a_crd_change_must_not_do(current: Obj) -> None:
    """The check above can fail: each kind of narrowing is found."""
    schema = _schema(current)
    spec = schema["properties"]["spec"]
    changes = {
        "a bound": ("maxReplicas", {"maximum": 10}),
        "a type": ("pollSeconds", {"type": "integer"}),
        "an enum": ("scaleOn", {"enum": ["Jobs"]}),
    }
    for what, (name, change) in changes.items():
        narrower = yaml.safe_load(yaml.safe_dump(schema))
        narrower["properties"]["spec"]["properties"][name].update(change)
        assert narrowed(schema, narrower), what
    required = yaml.safe_load(yaml.safe_dump(schema))
    required["properties"]["spec"]["required"] = [*spec["required"], "minReplicas"]
    assert narrowed(schema, required) == [".spec.minReplicas: newly required"]
    removed = yaml.safe_load(yaml.safe_dump(schema))
    del removed["properties"]["status"]["properties"]["coming"]
    assert narrowed(schema, removed) == [".status.coming: removed"]


def test_a_pool_using_an_added_field_needs_the_crd_first(
    helm: Helm, previous: Obj, current: Obj
) -> None:
    """With the defaults the upgraded chart's WorkerPool fits the previous CRD too; with
    ``worker.pool.scaleAheadSeconds`` set, it has a field only the new CRD declares, so
    ``helm upgrade`` before the CRD is applied is refused with ``unknown field``."""
    default = one(helm.render(), "WorkerPool")["spec"]
    assert _unknown_in_spec(default, previous) == []
    ahead = one(helm.render(sets={"worker.pool.scaleAheadSeconds": "60"}), "WorkerPool")["spec"]
    assert _unknown_in_spec(ahead, current) == []
    assert _unknown_in_spec(ahead, previous) == [".spec.scaleAheadSeconds"]


def _unknown_in_spec(spec: Obj, crd: Obj) -> list[str]:
    return unknown_fields(spec, _schema(crd)["properties"]["spec"], ".spec")


def test_the_guide_says_what_helm_4_does_with_the_crd() -> None:
    """The guide says that an install applies ``crds/`` server-side even over an existing
    CRD, that an upgrade leaves it alone, and the upgrade path: the CRD first, then
    ``helm upgrade``."""
    text = " ".join(GUIDE.read_text().split())
    section = text[text.index("## The WorkerPool CRD on install and upgrade") :]
    section = section[: section.index(" ## ", 1)]
    assert "server-side" in section and "--skip-crds" in section
    assert re.search(r"`helm upgrade`\W* (never|does not) (touch|apply|install)", section)
    assert section.index(APPLY_CRD) < section.index("helm upgrade leaseq"), section
    assert "installs `crds/` once" not in text
