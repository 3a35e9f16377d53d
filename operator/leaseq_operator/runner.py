"""Running the operator: kopf with leaseq's handlers, until stopped.

:func:`run` is what ``leaseq operator`` calls and what the k8s tests run in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import kopf

from leaseq_operator.app import OperatorApp
from leaseq_operator.config import OperatorConfig
from leaseq_operator.handlers import build_registry
from leaseq_operator.kube import Cluster


def _not_a_success(record: logging.LogRecord) -> bool:
    """False for kopf's "Handler 'watch' succeeded." lines: one per WorkerPool change in every
    replica says nothing (failures and everything else still pass)."""
    return not (record.levelno == logging.INFO and record.getMessage().endswith(" succeeded."))


def _above_info(record: logging.LogRecord) -> bool:
    return record.levelno > logging.INFO


def quiet_when_idle() -> None:
    """An idle operator logs nothing at INFO: drop kopf's success lines for WorkerPool
    events and for every liveness probe ("Activity 'reaper' succeeded.", each kubelet probe)
    and aiohttp's access line per probe request. Warnings and errors still pass; idempotent
    (a filter is added once)."""
    logging.getLogger("kopf.objects").addFilter(_not_a_success)
    logging.getLogger("kopf.activities.probe").addFilter(_not_a_success)
    logging.getLogger("aiohttp.access").addFilter(_above_info)


def kopf_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # On shutdown, let a tick in progress finish (it can wait for the database this long)
    # instead of orphaning it while the pools close under it.
    settings.background.instant_exit_timeout = config.database_timeout + config.tick_seconds
    # The CRD is installed with the chart before the operator starts: no need to rescan the
    # cluster's resources (which also needs cluster-wide list rights on namespaces and CRDs).
    settings.scanning.disabled = True
    # Keep kopf's bookkeeping in leaseq's own annotation names, out of status. kopf adds no
    # finalizer (no timers, no changing handlers); naming the one earlier versions added
    # makes it remove that one from WorkerPools it sees.
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
    quiet_when_idle()
    address = config.metrics_address
    host = f"[{address}]" if ":" in address else address
    liveness = f"http://{host}:{config.health_port}/healthz" if config.health_port else None
    try:
        asyncio.run(
            kopf.operator(
                registry=build_registry(app),
                settings=kopf_settings(config),
                standalone=True,
                # Without an identity kopf asks getpass.getuser(), which raises KeyError in a
                # pod: the image's uid 10001 has no passwd entry, and neither has the chart's.
                identity=config.operator_id,  # type: ignore[arg-type]  # kopf's NewType of str, not exported
                clusterwide=not config.namespace,
                namespaces=[config.namespace] if config.namespace else (),
                liveness_endpoint=liveness,
                stop_flag=stop_flag,
                ready_flag=ready_flag,
            )
        )
    finally:
        app.stop()
