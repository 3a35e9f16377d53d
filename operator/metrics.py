"""The operator's /metrics: queue depth computed from PostgreSQL at scrape time, plus its own.

Queue metrics come from the database when Prometheus scrapes, not from any worker, so alerts
on a stuck queue do not depend on the worker that is stuck. A scrape that cannot read the
database reports ``leaseq_operator_database_up 0`` and omits the queue series (absent, not
stale numbers) instead of failing the whole scrape.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from leaseq.core.errors import LeaseqError
from leaseq.core.models import Reaped
from leaseq.core.queue import Queue
from leaseq.core.workers import Workers

log = logging.getLogger("leaseq.operator.metrics")

# A registered worker counts as live while its registry heartbeat is younger than this.
LIVE_WORKER_SECONDS = 60.0
JOB_STATES = ("ready", "scheduled", "running", "dead")
REAP_OUTCOMES = {"pending": "retried", "dead": "dead"}


class QueueCollector(Collector):
    """Computes the queue series from one stats query and one workers query per scrape."""

    def __init__(self, queue: Queue, workers: Workers) -> None:
        self._queue = queue
        self._workers = workers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "leaseq_operator_database_up", "1 if the last scrape could read PostgreSQL"
        )
        try:
            stats = self._queue.stats()
            workers = self._workers.list()
        except LeaseqError as exc:
            log.warning("metrics scrape could not read the database: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily(
            "leaseq_queue_jobs", "Jobs by queue and state", labels=["queue", "state"]
        )
        oldest = GaugeMetricFamily(
            "leaseq_queue_oldest_ready_age_seconds",
            "Seconds the oldest ready job has waited",
            labels=["queue"],
        )
        heartbeat = GaugeMetricFamily(
            "leaseq_queue_max_heartbeat_age_seconds",
            "Seconds since the stalest running job's last heartbeat",
            labels=["queue"],
        )
        live = GaugeMetricFamily(
            "leaseq_queue_workers", "Live registered workers serving the queue", labels=["queue"]
        )
        counts: dict[str, int] = {}
        for worker in workers:
            if worker.heartbeat_age <= LIVE_WORKER_SECONDS:
                for name in worker.queues:
                    counts[name] = counts.get(name, 0) + 1
        for s in stats:
            for state, value in zip(
                JOB_STATES, (s.ready, s.scheduled, s.running, s.dead), strict=True
            ):
                jobs.add_metric([s.queue, state], value)
            oldest.add_metric([s.queue], s.oldest_ready_age or 0.0)
            heartbeat.add_metric([s.queue], s.max_heartbeat_age or 0.0)
            counts.setdefault(s.queue, 0)
        for name, count in sorted(counts.items()):
            live.add_metric([name], count)
        yield from (jobs, oldest, heartbeat, live)


@dataclass
class OperatorMetrics:
    """The operator's metric series, in a registry of their own (one per operator instance)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.reaped = Counter(
            "leaseq_reaped",
            "Jobs the reaper brought back after their lease expired",
            ["queue", "outcome"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "leaseq_reaper_leader",
            "1 while this replica holds the reaper lease (and scales WorkerPools)",
            registry=self.registry,
        )
        self.desired = Gauge(
            "leaseq_workerpool_desired_replicas",
            "Replicas the scaling policy wants",
            ["workerpool"],
            registry=self.registry,
        )
        self.current = Gauge(
            "leaseq_workerpool_current_replicas",
            "Replicas the target Deployment has",
            ["workerpool"],
            registry=self.registry,
        )
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def watch_queues(self, queue: Queue, workers: Workers) -> None:
        self.registry.register(QueueCollector(queue, workers))

    def count_reaped(self, job: Reaped) -> None:
        self.reaped.labels(job.queue, REAP_OUTCOMES.get(job.status, job.status)).inc()

    def known_queues(self, queues: tuple[str, ...]) -> None:
        """Start the reaped counters of these queues at 0, so rates exist before a reap."""
        for queue in queues:
            for outcome in REAP_OUTCOMES.values():
                self.reaped.labels(queue, outcome)

    def pool(self, name: str, *, desired: int, current: int) -> None:
        self.desired.labels(name).set(desired)
        self.current.labels(name).set(current)

    def forget_pool(self, name: str) -> None:
        for gauge in (self.desired, self.current):
            with contextlib.suppress(KeyError):  # never set: nothing to forget
                gauge.remove(name)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:  # noqa: S104 - a pod's metrics port
        """Serve /metrics over HTTP on ``port`` (0: not at all)."""
        if port:
            self._server, self._thread = start_http_server(port, addr, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
