"""The e2e's view of a cluster through kubectl, and which pods its checks look at.

tests/e2e runs these on kind; tests/k8s/test_e2e_pods_k8s.py runs the same functions with
kubectl against the emulator (pods labelled as the chart labels them), so a wrong choice of
pods fails where kind cannot run.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

NAMESPACE = "leaseq-e2e"
RELEASE = "leaseq"

T = TypeVar("T")


@dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    namespace: str = NAMESPACE

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def run(self, *args: str, timeout: float = 900) -> str:
        """Run a command against the cluster; fail the test with its output if it fails."""
        proc = subprocess.run(
            args, capture_output=True, text=True, env=self.env(), timeout=timeout, check=False
        )
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        return proc.stdout

    def kubectl(self, *args: str) -> str:
        return self.run("kubectl", "-n", self.namespace, *args)

    def jsonpath(self, resource: str, path: str, *, selector: str | None = None) -> str:
        """``kubectl get resource -o jsonpath=path``, only objects matching ``selector``
        (a label selector) when one is given."""
        chosen = ["-l", selector] if selector else []
        return self.kubectl("get", resource, *chosen, "-o", f"jsonpath={path}").strip()

    def helm(self, *args: str) -> str:
        return self.run("helm", "-n", self.namespace, *args)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 2.0) -> T:
    """Poll `probe` until it returns something other than None/False; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def worker_selector(release: str = RELEASE) -> str:
    """The labels the chart gives the release's worker pods (and no other pod)."""
    return f"app.kubernetes.io/instance={release},app.kubernetes.io/component=worker"


def worker_pods(cluster: Cluster, release: str = RELEASE) -> set[str]:
    """Names of the release's worker pods, terminating ones included: a rolling restart
    replaces these, and only these (the operator, console and PostgreSQL pods stay)."""
    return set(
        cluster.jsonpath(
            "pods", "{.items[*].metadata.name}", selector=worker_selector(release)
        ).split()
    )


def gone(old_pods: set[str], current: set[str]) -> bool:
    """True when none of ``old_pods`` is among the ``current`` pods."""
    return not old_pods & current


def wait_replaced(
    cluster: Cluster, old_pods: set[str], timeout: float, every: float = 2.0
) -> set[str]:
    """Wait until every one of ``old_pods`` (worker pods recorded before a rollout) is gone,
    draining ones included; returns the worker pods then."""
    assert old_pods, "no worker pods were recorded before the rollout: nothing to wait for"

    def replaced() -> set[str] | None:
        current = worker_pods(cluster)
        return current if gone(old_pods, current) else None

    return wait_for("the old worker pods to be gone", replaced, timeout=timeout, every=every)
