"""Helpers for the k8s tests: polling with a deadline, the test's view of the emulated cluster."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import kubernetes.client

import leaseq
from leaseq_operator.app import OperatorApp

NAMESPACE = "default"
WORKERPOOLS = ("leaseq.dev", "v1", "workerpools")
T = TypeVar("T")


@dataclass
class Api:
    """The test's own synchronous view of the emulated cluster."""

    client: kubernetes.client.ApiClient

    @property
    def apps(self) -> kubernetes.client.AppsV1Api:
        return kubernetes.client.AppsV1Api(self.client)

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.client)

    @property
    def custom(self) -> kubernetes.client.CustomObjectsApi:
        return kubernetes.client.CustomObjectsApi(self.client)

    def create_deployment(
        self,
        name: str,
        replicas: int | None = 0,
        held: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """A Deployment of ``replicas`` (None: the field left out, as the chart renders it);
        ``held`` adds what the chart adds to one it creates paused (annotations, spec);
        ``labels`` go into its labels, selector and pod template besides ``app: name``."""
        labels = {"app": name, **(labels or {})}
        held = held or {}
        self.apps.create_namespaced_deployment(
            NAMESPACE,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": dict(held.get("annotations", {})),
                },
                "spec": {
                    **({} if replicas is None else {"replicas": replicas}),
                    **held.get("spec", {}),
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "worker", "image": "leaseq:test"}]},
                    },
                },
            },
        )

    def create_pod(self, name: str, app: str) -> None:
        self.core.create_namespaced_pod(
            NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": app}},
                "spec": {"containers": [{"name": "worker", "image": "leaseq:test"}]},
            },
        )

    def replicas(self, deployment: str) -> int:
        scale = self.apps.read_namespaced_deployment_scale(deployment, NAMESPACE)
        return int(scale.spec.replicas or 0)

    def create_pool(self, name: str, spec: dict[str, Any]) -> None:
        body = {"apiVersion": "leaseq.dev/v1", "kind": "WorkerPool", "metadata": {"name": name}}
        self.custom.create_namespaced_custom_object(
            *WORKERPOOLS[:2], NAMESPACE, WORKERPOOLS[2], {**body, "spec": spec}
        )

    def pool(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            *WORKERPOOLS[:2], NAMESPACE, WORKERPOOLS[2], name
        )
        return found

    def condition(self, pool: str, type_: str) -> dict[str, Any] | None:
        for c in self.pool(pool).get("status", {}).get("conditions", []):
            if c["type"] == type_:
                return dict(c)
        return None

    def events(self, reason: str | None = None) -> list[Any]:
        items = self.core.list_namespaced_event(NAMESPACE).items
        return [e for e in items if reason is None or e.reason == reason]

    def annotations(self, pod: str) -> dict[str, str]:
        return dict(self.core.read_namespaced_pod(pod, NAMESPACE).metadata.annotations or {})


def register_worker(
    conn: leaseq.core.db.Conn,
    worker: str,
    pod: str,
    queue: str = "ocr",
    boot_at: datetime | None = None,
) -> None:
    """Register ``worker`` as running in ``pod`` on node-1 (what a worker process does at
    start-up), its process started at ``boot_at`` by the node's clock."""
    leaseq.Workers(conn).register(
        worker,
        pod=pod,
        node="node-1",
        queues=[queue],
        concurrency=4,
        state=leaseq.WorkerState.RUNNING,
        in_flight=0,
        boot_at=boot_at,
    )


@dataclass
class RunningOperator:
    app: OperatorApp
    stop_flag: threading.Event
    thread: threading.Thread
    errors: list[BaseException]

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the operator did not stop"


StartOperator = Callable[..., RunningOperator]
