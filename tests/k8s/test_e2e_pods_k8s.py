"""The kind e2e's choice of pods, run here: its own helpers (support.cluster) call kubectl
against the emulator, whose pods are made from the chart's pod templates as rendered with
the e2e's values, and a rolling restart of the workers is played out on them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from emulator import EmulatorServer
from harness import Api

from support.cluster import NAMESPACE, RELEASE, Cluster, gone, wait_replaced, worker_pods

pytestmark = pytest.mark.k8s

CHART = Path(__file__).resolve().parents[2] / "charts" / "leaseq"
DRAINING = "leaseq.test/draining"  # a finalizer that keeps one old worker pod terminating


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not found on PATH or in .tools/bin: run scripts/setup-tests.sh")
    return found


def pod_templates() -> list[tuple[str, int, dict[str, str]]]:
    """(workload name, replicas, pod labels) of every workload the chart renders with the
    e2e's values (tests/e2e installs the chart with ci/kind-values.yaml)."""
    rendered = subprocess.run(
        [tool("helm"), "template", RELEASE, str(CHART), "-n", NAMESPACE,
         "-f", str(CHART / "ci" / "kind-values.yaml")],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    found = []
    for obj in yaml.safe_load_all(rendered):
        template = (obj or {}).get("spec", {}).get("template")
        if template is not None:
            replicas = obj["spec"].get("replicas") or 1
            found.append((obj["metadata"]["name"], replicas, template["metadata"]["labels"]))
    return found


def create_pod(api: Api, name: str, labels: dict[str, str], finalizers: list[str]) -> None:
    meta: dict[str, Any] = {"name": name, "labels": labels, "finalizers": finalizers}
    spec = {"containers": [{"name": "main", "image": "leaseq:e2e"}]}
    api.core.create_namespaced_pod(NAMESPACE, {"apiVersion": "v1", "kind": "Pod",
                                               "metadata": meta, "spec": spec})  # fmt: skip


@pytest.fixture
def cluster(emulator: EmulatorServer, tmp_path: Path) -> Cluster:
    """The e2e's Cluster, its kubeconfig pointing at the emulator."""
    tool("kubectl")
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": emulator.url}}],
                "users": [{"name": "test", "user": {}}],
                "contexts": [
                    {"name": "emulator", "context": {"cluster": "emulator", "user": "test"}}
                ],
                "current-context": "emulator",
            }
        )
    )
    return Cluster(kubeconfig)


def test_a_rolling_restart_is_waited_for_on_the_worker_pods_only(
    api: Api, cluster: Cluster
) -> None:
    templates = pod_templates()
    workers = [t for t in templates if t[2].get("app.kubernetes.io/component") == "worker"]
    assert len(workers) == 1, templates
    others = [t for t in templates if t not in workers]
    assert others, "the chart renders pods besides the workers (operator, console, PostgreSQL)"
    _, _, worker_labels = workers[0]
    for name, replicas, labels in others:
        for n in range(replicas):
            create_pod(api, f"{name}-{n}", labels, [])
    old = {f"{RELEASE}-worker-old-{n}" for n in range(4)}
    for n, pod in enumerate(sorted(old)):
        create_pod(api, pod, worker_labels, [DRAINING] if n == 0 else [])

    # What the e2e records before `helm upgrade`: the worker pods, nothing else.
    recorded = worker_pods(cluster)
    assert recorded == old

    # The upgrade: every old worker pod is deleted (one still drains) and new ones start;
    # the operator's, the console's and PostgreSQL's pods are not touched.
    new = {f"{RELEASE}-worker-new-{n}" for n in range(2)}
    for pod in new:
        create_pod(api, pod, worker_labels, [])
    for pod in old:
        api.core.delete_namespaced_pod(pod, NAMESPACE)
    draining = sorted(old)[0]
    assert worker_pods(cluster) == new | {draining}
    assert not gone(recorded, worker_pods(cluster))

    api.core.patch_namespaced_pod(draining, NAMESPACE, {"metadata": {"finalizers": None}})
    assert wait_replaced(cluster, recorded, timeout=30, every=0.1) == new


def test_waiting_for_a_rollout_that_recorded_no_pods_is_refused(cluster: Cluster) -> None:
    with pytest.raises(AssertionError, match="no worker pods were recorded"):
        wait_replaced(cluster, set(), timeout=1)
