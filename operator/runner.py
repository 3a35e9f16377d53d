"""Running the operator: kopf with leaseq's handlers, until stopped.

:func:`run` is what ``leaseq operator`` calls and what the k8s tests run in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import kopf

from leaseq.operator.app import OperatorApp
from leaseq.operator.config import OperatorConfig
from leaseq.operator.handlers import build_registry
from leaseq.operator.kube import Cluster


def kopf_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # On shutdown, let a tick in progress finish (it can wait for the database this long)
    # instead of orphaning it while the pools close under it.
    settings.background.instant_exit_timeout = config.database_timeout + config.tick_seconds
    # The CRD is installed with the chart before the operator starts: no need to rescan the
    # cluster's resources (which also needs cluster-wide list rights on namespaces and CRDs).
    settings.scanning.disabled = True
    # Keep kopf's bookkeeping in leaseq's own annotation and finalizer names, out of status.
    settings.persistence.finalizer = "leaseq.dev/operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="leaseq.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="leaseq.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    return settings


def run(
    config: OperatorConfig,
    cluster: Cluster,
    *,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
    app: OperatorApp | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or SIGTERM/SIGINT in the main thread)."""
    app = app or OperatorApp(config, cluster)
    address = config.metrics_address
    host = f"[{address}]" if ":" in address else address
    liveness = f"http://{host}:{config.health_port}/healthz" if config.health_port else None
    try:
        asyncio.run(
            kopf.operator(
                registry=build_registry(app),
                settings=kopf_settings(config),
                standalone=True,
                clusterwide=not config.namespace,
                namespaces=[config.namespace] if config.namespace else (),
                liveness_endpoint=liveness,
                stop_flag=stop_flag,
                ready_flag=ready_flag,
            )
        )
    finally:
        app.stop()
