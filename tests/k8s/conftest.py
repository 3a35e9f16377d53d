"""The real operator (kopf, in a thread with its own loop) against the emulator and real PG."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import kmock
import kubernetes.client
import pytest
import yaml
from emulator import EmulatorServer
from leaseq.operator.app import OperatorApp
from leaseq.operator.config import OperatorConfig
from leaseq.operator.kube import Cluster
from leaseq.operator.runner import run

CRD_PATH = Path(__file__).parents[2] / "charts" / "leaseq" / "crds" / "workerpools.leaseq.dev.yaml"
NAMESPACE = "default"
WORKERPOOLS = ("leaseq.dev", "v1", "workerpools")
T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float = 30.0, what: str = "") -> T:
    """Poll ``check`` until it returns a truthy value (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except AssertionError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what or check}; last: {last!r}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


@pytest.fixture
def emulator(crd: dict[str, Any]) -> Iterator[EmulatorServer]:
    server = EmulatorServer()
    with warnings.catch_warnings():  # kmock reads its bundle with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        server.emulator.resources.load_bundled()
    [version] = crd["spec"]["versions"]
    server.emulator.resources["leaseq.dev/v1/workerpools"] = kmock.ResourceInfo(
        kind=crd["spec"]["names"]["kind"],
        singular=crd["spec"]["names"]["singular"],
        namespaced=True,
        verbs={"get", "list", "watch", "create", "patch", "delete"},
        subresources=set(version["subresources"]),
    )
    with server:
        yield server


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

    def create_deployment(self, name: str, replicas: int = 0) -> None:
        labels = {"app": name}
        self.apps.create_namespaced_deployment(
            NAMESPACE,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "replicas": replicas,
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


@pytest.fixture
def api(emulator: EmulatorServer) -> Iterator[Api]:
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=emulator.url))
    yield Api(client)
    client.close()


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


@pytest.fixture
def start_operator(emulator: EmulatorServer, database_url: str) -> Iterator[StartOperator]:
    """Start a real operator; ``config`` overrides go to OperatorConfig (short intervals)."""
    running: list[RunningOperator] = []

    def start(**overrides: Any) -> RunningOperator:
        config = OperatorConfig(
            database_url=database_url,
            namespace=NAMESPACE,
            operator_id=f"operator-{len(running)}",
            reap_interval_seconds=0.2,
            leader_ttl_seconds=2.0,
            health_port=0,
            metrics_port=0,
            tick_seconds=0.1,
            database_timeout=1.0,
        )
        config = replace(config, **overrides)
        app = OperatorApp(config, Cluster.at(emulator.url))
        stop_flag, ready_flag = threading.Event(), threading.Event()
        errors: list[BaseException] = []

        def target() -> None:
            try:
                run(config, app.cluster, stop_flag=stop_flag, ready_flag=ready_flag, app=app)
            except BaseException as exc:
                errors.append(exc)
                raise

        thread = threading.Thread(target=target, name=config.operator_id, daemon=True)
        thread.start()
        handle = RunningOperator(app, stop_flag, thread, errors)
        running.append(handle)
        eventually(lambda: ready_flag.is_set() or errors, what="operator ready")
        assert not errors, errors
        return handle

    yield start
    for handle in running:
        handle.stop_flag.set()
    for handle in running:
        handle.thread.join(30)
