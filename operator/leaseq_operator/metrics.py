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
from leaseq.core.models import QueueStats, Reaped
from leaseq.core.queue import Queue
from leaseq.core.schedule_models import Tick
from leaseq.core.schedules import Schedules
from leaseq.core.workers import Workers

log = logging.getLogger("leaseq_operator.metrics")

# A registered worker counts as live while its registry heartbeat is younger than this.
LIVE_WORKER_SECONDS = 60.0
JOB_STATES = ("ready", "scheduled", "running", "dead")
REAP_OUTCOMES = {"pending": "retried", "dead": "dead"}
SCHEDULE_OUTCOMES = ("enqueued", "skipped", "missed", "failed")


#: The label that stands for every queue beyond the cap; no queue can be named so (a queue
#: name starts with a letter or digit).
OTHER_QUEUE = "_other"
DEFAULT_MAX_QUEUES = 100


def _fold(stats: list[QueueStats], pinned: set[str], limit: int) -> tuple[list[QueueStats], int]:
    """At most ``limit`` queues one by one (pinned ones first, then the busiest, then by
    name), and the rest summed into one ``_other`` row; also how many were folded."""

    def rank(s: QueueStats) -> tuple[bool, int, str]:
        return (s.queue not in pinned, -(s.ready + s.scheduled + s.running + s.dead), s.queue)

    ranked = sorted(stats, key=rank)
    kept, rest = ranked[:limit], ranked[limit:]
    if not rest:
        return kept, 0

    def oldest(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return max(present) if present else None

    other = QueueStats(
        queue=OTHER_QUEUE,
        ready=sum(s.ready for s in rest),
        scheduled=sum(s.scheduled for s in rest),
        scheduled_soon=sum(s.scheduled_soon for s in rest),
        running=sum(s.running for s in rest),
        dead=sum(s.dead for s in rest),
        oldest_ready_age=oldest([s.oldest_ready_age for s in rest]),
        max_heartbeat_age=oldest([s.max_heartbeat_age for s in rest]),
    )
    return [*kept, other], len(rest)


class QueueCollector(Collector):
    """Computes the queue series from one stats query and one workers query per scrape.

    Queue names come from producers, so their number is not the operator's to choose: at
    most ``max_queues`` get series of their own (``pinned`` ones, the WorkerPools' queues,
    first), the rest are summed under ``queue="_other"``, and
    ``leaseq_queue_series_folded`` says how many were (a warning is logged when it changes).
    """

    def __init__(
        self,
        queue: Queue,
        workers: Workers,
        *,
        max_queues: int = DEFAULT_MAX_QUEUES,
        pinned: set[str] | None = None,
    ) -> None:
        self._queue = queue
        self._workers = workers
        self._max_queues = max_queues
        self._pinned = pinned if pinned is not None else set()
        self._folded_before = 0

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
        live_workers = [w for w in workers if w.heartbeat_age <= LIVE_WORKER_SECONDS]
        served = {name for w in live_workers for name in w.queues}
        known = {s.queue for s in stats}
        stats += [QueueStats(name, 0, 0, 0, 0, 0, None, None) for name in sorted(served - known)]
        stats, folded = _fold(stats, self._pinned, self._max_queues)
        if folded != self._folded_before:
            log.warning(
                "%d queues exceed the metrics cap of %d; their series are summed under "
                'queue="%s" (raise --metrics-max-queues to see them one by one)',
                folded,
                self._max_queues,
                OTHER_QUEUE,
            )
            self._folded_before = folded
        shown = {s.queue for s in stats}
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
        cap = GaugeMetricFamily(
            "leaseq_queue_series_folded",
            f'Queues beyond the metrics cap, summed under queue="{OTHER_QUEUE}"',
        )
        cap.add_metric([], folded)
        counts: dict[str, int] = {}
        for worker in live_workers:
            for name in worker.queues:
                label = name if name in shown else OTHER_QUEUE
                counts[label] = counts.get(label, 0) + 1
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
        yield from (jobs, oldest, heartbeat, live, cap)


class ScheduleCollector(Collector):
    """``leaseq_schedule_late_seconds``: how late the latest schedule is, read from the
    database at every scrape (so it grows while no scheduler runs at all)."""

    def __init__(self, schedules: Schedules) -> None:
        self._schedules = schedules

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            records = self._schedules.list()
        except LeaseqError as exc:  # leaseq_operator_database_up already says so
            log.debug("metrics scrape could not read the schedules: %s", exc)
            return
        late = GaugeMetricFamily(
            "leaseq_schedule_late_seconds",
            "Seconds since the latest due slot of any active schedule that no scheduler has"
            " fired yet (0: every schedule is up to date)",
        )
        late.add_metric([], max((r.late_seconds or 0.0 for r in records), default=0.0))
        yield late


@dataclass
class OperatorMetrics:
    """The operator's metric series, in a registry of their own (one per operator instance)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    #: WorkerPools' queues: always exported one by one.
    pinned: set[str] = field(default_factory=set)
    max_queues: int = DEFAULT_MAX_QUEUES

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
        self.schedule_slots = Counter(
            "leaseq_schedule_slots",
            "Schedule slots by outcome: enqueued, skipped (overlap), missed (downtime; only the"
            " latest fires), failed (a scheduler tick that failed)",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in SCHEDULE_OUTCOMES:
            self.schedule_slots.labels(outcome)
        self._reaped_queues: set[str] = set()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def watch_queues(
        self, queue: Queue, workers: Workers, *, max_queues: int = DEFAULT_MAX_QUEUES
    ) -> None:
        """Export the queue series from the database at every scrape (see
        :class:`QueueCollector`; the queues given to :meth:`known_queues` come first)."""
        self.max_queues = max_queues
        self.registry.register(
            QueueCollector(queue, workers, max_queues=max_queues, pinned=self.pinned)
        )

    def watch_schedules(self, schedules: Schedules) -> None:
        """Export how late the schedules are at every scrape (:class:`ScheduleCollector`)."""
        self.registry.register(ScheduleCollector(schedules))

    def count_reaped(self, job: Reaped) -> None:
        """Count a reaped job under its queue, or under ``_other`` once the counter already
        has ``max_queues`` queues that no WorkerPool serves (the same cap as the gauges)."""
        queue = job.queue
        if queue not in self.pinned and queue not in self._reaped_queues:
            if len(self._reaped_queues) >= self.max_queues:
                queue = OTHER_QUEUE
            else:
                self._reaped_queues.add(queue)
        self.reaped.labels(queue, REAP_OUTCOMES.get(job.status, job.status)).inc()

    def count_tick(self, tick: Tick | None) -> None:
        """Count one schedule tick's slots (None: the tick failed)."""
        if tick is None:
            self.schedule_slots.labels("failed").inc()
            return
        for slot in tick.fired:
            self.schedule_slots.labels(slot.outcome).inc()
        if tick.missed:
            self.schedule_slots.labels("missed").inc(tick.missed)
        if tick.failed:
            self.schedule_slots.labels("failed").inc(len(tick.failed))

    def known_queues(self, queues: tuple[str, ...]) -> None:
        """Start the reaped counters of these queues at 0, so rates exist before a reap, and
        keep their queue series out of the ``_other`` fold."""
        self.pinned.update(queues)
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
