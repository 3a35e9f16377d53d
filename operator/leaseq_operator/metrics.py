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

from leaseq import config as settings
from leaseq.core.errors import ConfigError, LeaseqError
from leaseq.core.flow import FlowControl
from leaseq.core.models import (
    SILENT_AFTER_SECONDS,
    QueueStats,
    Reaped,
    SignalWaits,
    UnservedWork,
)
from leaseq.core.queue import Queue
from leaseq.core.schedule_models import Tick
from leaseq.core.schedules import Schedules
from leaseq.core.workers import Workers

log = logging.getLogger("leaseq_operator.metrics")

#: held: stopped at an uncertain durable step, waiting for a human (``leaseq steps resolve``).
JOB_STATES = ("ready", "scheduled", "running", "dead", "held")
#: Jobs waiting for parents (pipelines): shown, never counted as work to scale for.
WAITING_STATE = "waiting"
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
        held=sum(s.held for s in rest),
        oldest_ready_age=oldest([s.oldest_ready_age for s in rest]),
        max_heartbeat_age=oldest([s.max_heartbeat_age for s in rest]),
    )
    return [*kept, other], len(rest)


class QueueCollector(Collector):
    """Computes the queue series from one stats query and one workers query per scrape.

    Every queue a WorkerPool names (``pinned``) or a live worker serves has its series, at 0
    when it holds no unfinished job.

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
            unserved = self._queue.unserved(live_seconds=SILENT_AFTER_SECONDS)
            waiting = self._queue.waiting()
            signal_waits = self._queue.signal_waits()
        except LeaseqError as exc:
            log.warning("metrics scrape could not read the database: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        live_workers = [w for w in workers if not w.silent]
        served = {name for w in live_workers for name in w.queues}
        known = {s.queue for s in stats}
        # Zero rows for idle queues that a live worker serves or a WorkerPool names: a pool
        # scaled to zero shows 0, not a gap (and `helm test` finds its samples).
        idle = (served | self._pinned | waiting.keys()) - known
        stats += [QueueStats(name, 0, 0, 0, 0, 0, 0, None, None) for name in sorted(idle)]
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
                JOB_STATES, (s.ready, s.scheduled, s.running, s.dead, s.held), strict=True
            ):
                jobs.add_metric([s.queue, state], value)
            if s.queue != OTHER_QUEUE:
                jobs.add_metric([s.queue, WAITING_STATE], waiting.get(s.queue, 0))
            else:
                rest = sum(n for q, n in waiting.items() if q not in shown)
                jobs.add_metric([s.queue, WAITING_STATE], rest)
            oldest.add_metric([s.queue], s.oldest_ready_age or 0.0)
            heartbeat.add_metric([s.queue], s.max_heartbeat_age or 0.0)
            counts.setdefault(s.queue, 0)
        for name, count in sorted(counts.items()):
            live.add_metric([name], count)
        yield from (jobs, oldest, heartbeat, live, cap, _unserved(unserved, shown))
        yield from _signal_waits(signal_waits, [s.queue for s in stats])


def _signal_waits(rows: list[SignalWaits], queues: list[str]) -> Iterator[GaugeMetricFamily]:
    """``leaseq_queue_signal_waiting_jobs`` and ``leaseq_queue_oldest_signal_wait_age_seconds``
    for every queue shown (0 when none of its jobs waits; queues beyond the cap under
    ``_other``: summed, the oldest age of them). Jobs waiting for a signal are pending with
    ``available_at`` their deadline, so ``leaseq_queue_jobs{state="scheduled"}`` counts them
    too: this says how many of those wait for someone, and for how long."""
    count = GaugeMetricFamily(
        "leaseq_queue_signal_waiting_jobs",
        'Jobs waiting for a signal (ctx.wait_for), among state="scheduled"',
        labels=["queue"],
    )
    age = GaugeMetricFamily(
        "leaseq_queue_oldest_signal_wait_age_seconds",
        "Seconds the oldest job waiting for a signal has waited",
        labels=["queue"],
    )
    shown = set(queues)
    counts = dict.fromkeys(queues, 0)
    ages = dict.fromkeys(queues, 0.0)
    for row in rows:
        label = row.queue if row.queue in shown else OTHER_QUEUE
        counts[label] = counts.get(label, 0) + row.waiting
        ages[label] = max(ages.get(label, 0.0), row.oldest_age or 0.0)
    for name in queues:
        count.add_metric([name], counts[name])
        age.add_metric([name], ages[name])
    yield from (count, age)


def _unserved(rows: list[UnservedWork], shown: set[str]) -> GaugeMetricFamily:
    """``leaseq_queue_unserved_jobs``: ready jobs of a type that no live worker of their
    queue serves (queues beyond the cap summed under ``_other``). Series exist only while
    such work does: job types are the producers' to name."""
    family = GaugeMetricFamily(
        "leaseq_queue_unserved_jobs",
        "Ready jobs of a type no live worker of the queue serves (it has live workers)",
        labels=["queue", "job_type"],
    )
    sums: dict[tuple[str, str], int] = {}
    for row in rows:
        key = (row.queue if row.queue in shown else OTHER_QUEUE, row.job_type)
        sums[key] = sums.get(key, 0) + row.ready
    for (queue, job_type), ready in sorted(sums.items()):
        family.add_metric([queue, job_type], ready)
    return family


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


class FlowCollector(Collector):
    """Flow control per queue, read from the database at every scrape: the jobs workers
    could claim now (``leaseq_queue_claimable_jobs``, next to the ready count: keyless ready
    jobs plus, per key, the smaller of its ready jobs and free units of its limit), keys with
    ready work and no free unit, and aggregates blocked by a dead head. At most
    ``max_queues`` queues one by one (those with the most claimable work), the rest summed
    under ``_other``."""

    def __init__(self, flow: FlowControl, *, max_queues: int = DEFAULT_MAX_QUEUES) -> None:
        self._flow = flow
        self._max_queues = max_queues

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            rows = self._flow.summary()
        except LeaseqError as exc:  # leaseq_operator_database_up already says so
            log.debug("metrics scrape could not read flow control: %s", exc)
            return
        rows.sort(key=lambda r: (-r.claimable, r.queue))
        kept, rest = rows[: self._max_queues], rows[self._max_queues :]
        families = (
            GaugeMetricFamily(
                "leaseq_queue_claimable_jobs",
                "Ready jobs workers could claim now: keyless ones, plus per key the smaller of"
                " its ready jobs and its free units of limit (what the operator scales on)",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                "leaseq_flow_saturated_keys",
                "Keys with ready jobs and no free unit of their concurrency limit",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                "leaseq_flow_blocked_aggregates",
                "Aggregates (ordering keys) whose head job is dead: nothing behind it runs",
                labels=["queue"],
            ),
        )
        sums = [0, 0, 0]
        for r in rest:
            sums = [sums[0] + r.claimable, sums[1] + r.saturated_keys, sums[2] + r.blocked]
        for r in kept:
            for family, value in zip(
                families, (r.claimable, r.saturated_keys, r.blocked), strict=True
            ):
                family.add_metric([r.queue], value)
        if rest:
            for family, value in zip(families, sums, strict=True):
                family.add_metric([OTHER_QUEUE], value)
        yield from families


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
        self.annotation_failures = Counter(
            "leaseq_workerpool_annotation_failures",
            "Pod annotation patches (deletion cost, safe-to-evict) that failed, e.g. refused"
            " by admission",
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
        self.flow_repairs = Counter(
            "leaseq_flow_repairs",
            "Units of per-key limits the reaper found held by no running attempt with the same"
            " token, and freed (expected 0)",
            registry=self.registry,
        )
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

    def watch_flow(self, flow: FlowControl) -> None:
        """Export flow control per queue at every scrape (:class:`FlowCollector`)."""
        self.registry.register(FlowCollector(flow, max_queues=self.max_queues))

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

    def count_repairs(self, repaired: dict[str, int]) -> None:
        """Count the units the reaper's flow-control check freed."""
        self.flow_repairs.inc(sum(repaired.values()))

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
        self.annotation_failures.labels(name)  # starts at 0

    def annotation_failed(self, name: str, count: int = 1) -> None:
        self.annotation_failures.labels(name).inc(count)

    def forget_pool(self, name: str) -> None:
        for series in (self.desired, self.current, self.annotation_failures):
            with contextlib.suppress(KeyError):  # never set: nothing to forget
                series.remove(name)

    def serve(self, port: int | None, addr: str = "0.0.0.0") -> int | None:  # noqa: S104 - a pod's metrics port
        """Serve /metrics over HTTP on ``port`` (0: not at all; None: a free port) and log
        the address served; returns the port served, None when not serving."""
        if port == 0:
            return None
        try:
            self._server, self._thread = start_http_server(
                settings.bind_port(port), addr, registry=self.registry
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve /metrics on {addr} port {port} ({exc}); "
                "set --metrics-port or --metrics-address"
            ) from exc
        host, served = self._server.server_address[:2]
        log.info("serving /metrics on %s port %d", host, served)
        return int(served)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
