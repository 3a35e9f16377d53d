"""``leaseq reaper``: the operator's reaper without Kubernetes.

Workers on VMs, under systemd or in compose need a reaper too: without one, a job whose
worker died stays ``running`` forever. This is the same :class:`~leaseq.leader.reaper.Reaper`
the operator runs (the same leader lease in ``leaseq.leader_leases``, the same pass lock and
pass, the same history duties and schedules), with no cluster: run it next to the workers,
on any host that reaches PostgreSQL, as two or more copies for availability; exactly one
reaps at a time. It mixes safely with
``leaseq operator`` replicas on the same database (they share the lease).

Every copy serves the operator's queue metrics (:class:`~leaseq_operator.metrics.OperatorMetrics`:
depth by state, oldest ready age, heartbeat age of running jobs, dead and reaped counts, and
``leaseq_reaper_leader``), computed from PostgreSQL at scrape time, so the chart's alert
rules and dashboard work without Kubernetes. Reaped counts are per copy, like the
operator's: sum them over copies.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from leaseq import config as settings
from leaseq.core.db import open_pool
from leaseq.core.flow import FlowControl
from leaseq.core.history import History
from leaseq.core.leadership import Leadership
from leaseq.core.models import LeaderKind
from leaseq.core.queue import Queue
from leaseq.core.schedules import Schedules
from leaseq.core.workers import Workers
from leaseq.leader.history import HistoryDuty, HistoryMetrics
from leaseq.leader.reaper import LeaderLease, Reaper
from leaseq_operator.config import (
    HOT_RETENTION,
    LEADER_TTL,
    METRICS_MAX_QUEUES,
    OPERATOR_ID,
    REAP_INTERVAL,
    VACUUM_DEAD_TUPLES,
    check_reaper_timing,
    resolve_values,
)
from leaseq_operator.metrics import DEFAULT_MAX_QUEUES, OperatorMetrics

OPTIONS = (
    settings.DATABASE_URL,
    OPERATOR_ID,
    REAP_INTERVAL,
    LEADER_TTL,
    VACUUM_DEAD_TUPLES,
    settings.METRICS_PORT,
    settings.METRICS_ADDRESS,
    METRICS_MAX_QUEUES,
    HOT_RETENTION,
    settings.LOG_LEVEL,
    settings.LOG_FORMAT,
)
#: How long a call waits for a pooled connection before the database counts as unreachable.
DATABASE_TIMEOUT = 5.0


@dataclass(frozen=True)
class ReaperConfig:
    """Everything ``leaseq reaper`` needs, validated."""

    database_url: str
    operator_id: str = "leaseq-reaper"
    reap_interval_seconds: float = 5.0
    leader_ttl_seconds: float = 15.0
    vacuum_dead_tuples: int = 2000
    #: None: a free port (the default outside a pod); 0: no /metrics.
    metrics_port: int | None = 9100
    metrics_address: str = "0.0.0.0"  # noqa: S104 - see leaseq.config.METRICS_ADDRESS
    metrics_max_queues: int = DEFAULT_MAX_QUEUES
    hot_retention: float = 3600.0
    log_level: str = "INFO"
    log_format: str = "text"

    def __post_init__(self) -> None:
        check_reaper_timing(self.leader_ttl_seconds, self.reap_interval_seconds)

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> ReaperConfig:
        return cls(**resolve_values(args, OPTIONS, environ))


def serve(config: ReaperConfig, until: Callable[[], object]) -> None:
    """Reap under the leader lease until ``until()`` returns (e.g. waits for SIGTERM), then
    give the lease up so another copy takes over at once."""
    with open_pool(
        config.database_url, min_size=1, max_size=3, name="leaseq-reaper", timeout=DATABASE_TIMEOUT
    ) as pool:
        queue, workers = Queue(pool), Workers(pool)
        metrics = OperatorMetrics()
        metrics.watch_queues(queue, workers, max_queues=config.metrics_max_queues)
        metrics.watch_flow(FlowControl(pool))
        schedules = Schedules(pool)
        metrics.watch_schedules(schedules)
        reaper = Reaper(
            LeaderLease(
                Leadership(pool),
                config.operator_id,
                config.leader_ttl_seconds,
                kind=LeaderKind.REAPER,
            ),
            queue,
            workers,
            config.reap_interval_seconds,
            vacuum_dead_tuples=config.vacuum_dead_tuples,
            on_reaped=metrics.count_reaped,
            flow=FlowControl(pool),
            on_repaired=metrics.count_repairs,
            on_leading=lambda leading: metrics.leader.set(1 if leading else 0),
            schedules=schedules,
            on_ticked=metrics.count_tick,
            history=HistoryDuty.for_lease(
                History(pool),
                config.hot_retention,
                config.leader_ttl_seconds,
                HistoryMetrics(metrics.registry),
            ),
        )
        # Bound before reaping starts: a busy port fails the start, not a later scrape.
        metrics.serve(config.metrics_port, config.metrics_address)
        reaper.start()
        try:
            until()
        finally:
            reaper.stop()
            metrics.close()
