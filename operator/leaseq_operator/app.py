"""One running operator: its database pools, Kubernetes client, reaper, metrics and pool state."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from leaseq.core.db import open_pool
from leaseq.core.flow import FlowControl
from leaseq.core.history import History
from leaseq.core.leadership import Leadership
from leaseq.core.models import LeaderKind, LeaseHolder
from leaseq.core.pool import Pool
from leaseq.core.queue import Queue
from leaseq.core.schedules import Schedules
from leaseq.core.workers import Workers
from leaseq.leader.history import HistoryDuty, HistoryMetrics
from leaseq.leader.reaper import LeaderLease, Reaper
from leaseq_operator.config import OperatorConfig
from leaseq_operator.kube import Cluster, Kube
from leaseq_operator.metrics import OperatorMetrics
from leaseq_operator.scaling import Recommendation

log = logging.getLogger("leaseq_operator")

POOL_MAX_SIZE = 8


def remedy(holder: LeaseHolder) -> str:
    """What lets the operator lead again when ``holder`` (a worker or a reaper) leads."""
    if holder.kind is LeaderKind.WORKER:
        return f"restart worker {holder.holder} with --lead false (LEASEQ_LEAD=false)"
    return f"stop leaseq reaper {holder.holder}"


@dataclass
class PoolState:
    """What the operator remembers about one WorkerPool (in memory only): its latest body as
    kopf last saw it, and between polls its scaling history, retry delay and problem."""

    body: dict[str, Any] | None = None
    history: tuple[Recommendation, ...] = ()
    last_poll: float | None = None
    delay: float | None = None  # a retry delay that replaces pollSeconds once
    problem: str | None = None  # the last problem logged, so it is logged once
    annotation_problem: str | None = None  # likewise for the pods' annotations
    # The model-load time the pool's workers last reported: kept while the pool is at zero,
    # when no worker is left to report it (it sets how far ahead of a known job to scale up).
    reported_startup: float | None = None
    claimed: bool = False  # this process applied the Deployment's spec.replicas once

    def due(self, now: float, tick: float) -> bool:
        """True once ``pollSeconds`` (or the retry delay) passed since the last reading, to the
        nearest tick (always for a value that is not a number: the spec check reports it)."""
        poll_seconds = self.delay
        if poll_seconds is None:
            poll_seconds = ((self.body or {}).get("spec") or {}).get("pollSeconds", 10)
        if self.last_poll is None or isinstance(poll_seconds, bool):
            return True
        if not isinstance(poll_seconds, int | float):
            return True
        return now - self.last_poll >= poll_seconds - tick / 2


class Databases:
    """One connection pool per database: the operator's own, shared by every WorkerPool that
    names no secret (and by the reaper and metrics), plus one per URL a secret names."""

    def __init__(self, default_url: str, timeout: float) -> None:
        self._default_url = default_url
        self._timeout = timeout
        self._pools: dict[str, Pool] = {}
        self._lock = threading.Lock()

    def queue(self, url: str | None = None) -> Queue:
        """The queue in the database at ``url`` (default: the operator's own)."""
        return Queue(self.pool(url))

    def flow(self, url: str | None = None) -> FlowControl:
        """Flow control in the database at ``url`` (default: the operator's own)."""
        return FlowControl(self.pool(url))

    def schedules(self, url: str | None = None) -> Schedules:
        """The schedules in the database at ``url`` (default: the operator's own)."""
        return Schedules(self.pool(url))

    def workers(self, url: str | None = None) -> Workers:
        """The worker registry in the database at ``url`` (default: the operator's own)."""
        return Workers(self.pool(url))

    def pool(self, url: str | None = None) -> Pool:
        url = url or self._default_url
        with self._lock:
            pool = self._pools.get(url)
            if pool is None:
                pool = open_pool(
                    url,
                    min_size=1,
                    max_size=POOL_MAX_SIZE,
                    name="leaseq-operator",
                    timeout=self._timeout,
                )
                self._pools[url] = pool
        return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


class OperatorApp:
    """The pieces one operator process shares across all WorkerPools."""

    def __init__(self, config: OperatorConfig, cluster: Cluster) -> None:
        self.config = config
        self.cluster = cluster
        self.kube = Kube(cluster)
        self.databases = Databases(config.database_url, config.database_timeout)
        self.queue = self.databases.queue()
        workers = self.databases.workers()
        self.metrics = OperatorMetrics()
        self._held_by: tuple[LeaderKind, str] | None = None  # last logged non-operator holder
        self.metrics.watch_queues(self.queue, workers, max_queues=config.metrics_max_queues)
        self.metrics.watch_flow(FlowControl(self.databases.pool()))
        schedules = Schedules(self.databases.pool())
        self.metrics.watch_schedules(schedules)
        self.reaper = Reaper(
            LeaderLease(
                Leadership(self.databases.pool()),
                config.operator_id,
                config.leader_ttl_seconds,
                kind=LeaderKind.OPERATOR,
            ),
            self.queue,
            workers,
            config.reap_interval_seconds,
            vacuum_dead_tuples=config.vacuum_dead_tuples,
            history=HistoryDuty.for_lease(
                History(self.databases.pool()),
                config.hot_retention,
                config.leader_ttl_seconds,
                HistoryMetrics(self.metrics.registry),
            ),
            on_reaped=self.metrics.count_reaped,
            flow=FlowControl(self.databases.pool()),
            on_repaired=self.metrics.count_repairs,
            on_leading=self._on_leading,
            schedules=schedules,
            on_ticked=self.metrics.count_tick,
        )
        self.pools: dict[str, PoolState] = {}
        #: The last termination of each pod's worker container whose leases were ended (by
        #: pod uid, until the pod is deleted): repeated pod events do not reclaim again.
        self.reclaimed: dict[str, datetime] = {}
        self._started = False
        self._stopped = False

    @property
    def lease_holder(self) -> LeaseHolder | None:
        """Who keeps every operator replica from leading: the worker or ``leaseq reaper``
        that held the leader lease at this replica's last refused renewal (None while an
        operator replica, this one or another, holds it, or nobody does)."""
        other = self.reaper.lease.other
        if other is None or not other.live or other.kind is LeaderKind.OPERATOR:
            return None
        return other

    def _on_leading(self, leading: bool) -> None:
        """After each renewal: the leader gauge, and a log line when a worker or reaper
        starts or stops keeping the operator from leading (not at every pass)."""
        self.metrics.leader.set(1 if leading else 0)
        other = self.lease_holder
        seen = None if other is None else (other.kind, other.holder)
        if seen == self._held_by:
            return
        if other is not None:
            log.warning(
                "the leader lease is held by %s %s (term %d): this operator neither scales "
                "WorkerPools nor reaps while it is; %s",
                other.kind.value, other.holder, other.term, remedy(other),
                extra={"holder": other.holder, "holder_kind": other.kind.value},
            )  # fmt: skip
        elif self._held_by is not None:
            kind, holder = self._held_by
            log.info("the leader lease is no longer held by %s %s", kind.value, holder)
        self._held_by = seen

    @property
    def leading(self) -> bool:
        """True in the one replica that holds the reaper lease: it reaps and scales."""
        return self.reaper.leading

    @property
    def reports(self) -> bool:
        """True in the replica that writes WorkerPool status and Events: the leader, and while
        the database is down, the replica that led until it went down (no other writes)."""
        return self.reaper.lease.led_recently

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.metrics.serve(self.config.metrics_port, self.config.metrics_address)
            self.reaper.start()
            log.info("operator started", extra={"operator_id": self.config.operator_id})

    def stop(self) -> None:
        """Stop the reaper (releasing its lease), metrics and pools; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        if self._started:
            self.reaper.stop()
        self.metrics.close()
        self.databases.close()
        self.kube.close()
