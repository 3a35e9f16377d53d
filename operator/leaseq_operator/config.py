"""The operator's settings: flags with LEASEQ_* fallbacks, checked once, frozen, passed on."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leaseq import config as settings
from leaseq.config import Option
from leaseq.core.errors import ConfigError

NAMESPACE = Option(
    "namespace",
    "LEASEQ_NAMESPACE",
    str,
    "",
    "namespace to watch WorkerPools in (empty: all, and then a pool's Deployment must carry "
    "leaseq.dev/worker-pool: <pool> in its selector)",
)
OPERATOR_ID = Option(
    "operator_id",
    "LEASEQ_OPERATOR_ID",
    str,
    None,
    "this replica's name in the reaper lease (default: pod name, else hostname-pid)",
)
REAP_INTERVAL = Option(
    "reap_interval_seconds",
    "LEASEQ_REAP_INTERVAL_SECONDS",
    settings.positive_float,
    5.0,
    "seconds between reaper passes (and leader lease renewals)",
)
LEADER_TTL = Option(
    "leader_ttl_seconds",
    "LEASEQ_LEADER_TTL_SECONDS",
    settings.positive_float,
    15.0,
    "seconds a reaper lease lasts without renewal; a standby takes over within this plus "
    "--reap-interval-seconds",
)
VACUUM_DEAD_TUPLES = Option(
    "vacuum_dead_tuples",
    "LEASEQ_VACUUM_DEAD_TUPLES",
    settings.non_negative_int,
    2000,
    "after a reaper pass, VACUUM leaseq.jobs and leaseq.flow_keys once each has this many dead"
    " row versions, so churn never buries the head of a claim's index (0: leave it to"
    " autovacuum alone)",
)
HOT_RETENTION = settings.HOT_RETENTION
HEALTH_PORT = Option(
    "health_port",
    "LEASEQ_HEALTH_PORT",
    settings.port,
    8080,
    "port of kopf's liveness endpoint /healthz (0: off)",
)
METRICS_PORT = settings.METRICS_PORT
METRICS_MAX_QUEUES = Option(
    "metrics_max_queues",
    "LEASEQ_METRICS_MAX_QUEUES",
    settings.positive_int,
    100,
    "queues exported one by one on /metrics (WorkerPools' queues first, then the busiest);"
    ' the rest are summed under queue="_other" and counted in leaseq_queue_series_folded',
)

OPTIONS = (
    settings.DATABASE_URL,
    NAMESPACE,
    OPERATOR_ID,
    REAP_INTERVAL,
    LEADER_TTL,
    VACUUM_DEAD_TUPLES,
    HOT_RETENTION,
    HEALTH_PORT,
    METRICS_PORT,
    settings.METRICS_ADDRESS,
    METRICS_MAX_QUEUES,
    settings.LOG_LEVEL,
    settings.LOG_FORMAT,
)


def check_reaper_timing(ttl: float, interval: float) -> None:
    """The leader lease must outlive the time between two passes (it is renewed once each)."""
    if ttl <= interval:
        raise ConfigError(
            f"{LEADER_TTL.flag} ({ttl}) must be longer than {REAP_INTERVAL.flag} ({interval}):"
            " the lease is renewed once per pass and would lapse between passes"
        )


def resolve_values(
    args: argparse.Namespace,
    options: Sequence[Option],
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Flags, else ``LEASEQ_*`` variables, else defaults; the database URL is required and
    the replica's name in the lease defaults to :func:`default_operator_id`."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = settings.resolve(args, options, env)
    values["database_url"] = settings.require(values, settings.DATABASE_URL)
    values["operator_id"] = values["operator_id"] or default_operator_id(env)
    return values


def default_operator_id(environ: Mapping[str, str]) -> str:
    return environ.get("LEASEQ_POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class OperatorConfig:
    """Everything ``leaseq operator`` needs, validated.

    ``tick_seconds`` is the resolution of the pool loop (a WorkerPool polls every
    ``pollSeconds``, checked at each tick) and ``database_timeout`` how long a call waits for
    a pooled connection before the database counts as unreachable; neither is a flag.
    """

    database_url: str
    namespace: str = ""
    operator_id: str = "leaseq-operator"
    reap_interval_seconds: float = 5.0
    leader_ttl_seconds: float = 15.0
    vacuum_dead_tuples: int = 2000
    hot_retention: float = 3600.0
    health_port: int = 8080
    #: None: a free port (the default outside a pod); 0: no /metrics.
    metrics_port: int | None = 9100
    metrics_address: str = "0.0.0.0"  # noqa: S104 - see leaseq.config.METRICS_ADDRESS
    metrics_max_queues: int = 100
    log_level: str = "INFO"
    log_format: str = "text"
    tick_seconds: float = 1.0
    database_timeout: float = 5.0

    def __post_init__(self) -> None:
        check_reaper_timing(self.leader_ttl_seconds, self.reap_interval_seconds)

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> OperatorConfig:
        return cls(**resolve_values(args, OPTIONS, environ))
