"""The real operator (kopf, in a thread with its own loop) against the emulator and real PG."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import kubernetes.client
import pytest
import yaml
from emulator import CRD_PATH, EmulatorServer, leaseq_server
from harness import NAMESPACE, Api, RunningOperator, StartOperator

from leaseq_operator.app import OperatorApp
from leaseq_operator.config import OperatorConfig
from leaseq_operator.kube import Cluster
from leaseq_operator.runner import run
from support.polling import wait_for


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


@pytest.fixture
def emulator(crd: dict[str, Any]) -> Iterator[EmulatorServer]:
    with leaseq_server(crd) as server:
        yield server


@pytest.fixture
def api(emulator: EmulatorServer) -> Iterator[Api]:
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=emulator.url))
    yield Api(client)
    client.close()


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
        wait_for(lambda: ready_flag.is_set() or errors, what="operator ready")
        assert not errors, errors
        return handle

    yield start
    for handle in running:
        handle.stop_flag.set()
    for handle in running:
        handle.thread.join(30)
