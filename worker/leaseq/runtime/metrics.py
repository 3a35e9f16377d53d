"""The worker's Prometheus metrics, in a registry of its own (one per Worker).

Labels are only queue, job_type and outcome, all bounded: queues come from the worker's
settings and job types from its registry, and every such series is created at 0 at start-up
so rates and alerts work before the first event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from leaseq.runtime.outcomes import Outcome

#: How a claimed job ended for this worker (``leaseq_jobs_finished_total{outcome}``).
OUTCOMES = tuple(Outcome)

# Slow jobs: from sub-second to an hour.
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
CLAIM_BUCKETS = (
    0.0005,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
)


@dataclass(frozen=True)
class JobSeries:
    """The series one (queue, job type) moves at each attempt, looked up once: a metric's
    ``labels()`` takes a lock and builds its key at every call, several times per job."""

    claimed: Counter
    duration: Histogram
    in_flight: Gauge
    finished: Mapping[Outcome, Counter]
    effects_not_written: Counter


class WorkerMetrics:
    """Every metric ``leaseq worker`` exports (the chart's dashboards
    and alerts use these names; tests/chart/test_chart_metric_names.py checks them)."""

    def __init__(self, queues: Sequence[str], job_types: Sequence[str]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.claimed = Counter(
            "leaseq_jobs_claimed", "Jobs this worker claimed.", ["queue", "job_type"], registry=r
        )
        self.finished = Counter(
            "leaseq_jobs_finished",
            "Claimed jobs by how they ended for this worker.",
            ["queue", "job_type", "outcome"],
            registry=r,
        )
        self.effects_not_written = Counter(
            "leaseq_effects_not_written",
            "Completions with an effect key whose effect was not written: another job's effect "
            "holds the key (keys are per queue and job type, shared by every producer).",
            ["queue", "job_type"],
            registry=r,
        )
        self.duration = Histogram(
            "leaseq_job_duration_seconds",
            "Handler run time of one attempt.",
            ["queue", "job_type"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.claim_latency = Histogram(
            "leaseq_claim_latency_seconds",
            "Round trip of one claim statement.",
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "leaseq_jobs_in_flight", "Jobs holding a slot now.", ["queue"], registry=r
        )
        self.renewals = Counter(
            "leaseq_lease_renewals", "Successful lease renewals.", ["queue"], registry=r
        )
        self.losses = Counter(
            "leaseq_lease_losses",
            "Leases found lost (expired, or taken over) while the job ran; not cancellations.",
            ["queue"],
            registry=r,
        )
        self.fenced = Counter(
            "leaseq_fenced_calls",
            "Worker calls (heartbeat, complete, fail, release) refused for a stale lease.",
            ["queue"],
            registry=r,
        )
        self.last_heartbeat = Gauge(
            "leaseq_last_heartbeat_timestamp_seconds",
            "Unix time of the last successful lease renewal or registry heartbeat.",
            registry=r,
        )
        self.draining = Gauge(
            "leaseq_worker_draining", "1 while the worker drains after SIGTERM.", registry=r
        )
        self.loading = Gauge(
            "leaseq_worker_loading",
            "1 while on_startup (a model load) runs: the worker is not ready yet.",
            registry=r,
        )
        self.startup = Gauge(
            "leaseq_worker_startup_seconds",
            "Seconds on_startup (a model load) took in this worker; 0 until it finished.",
            registry=r,
        )
        self.heartbeat_late = Counter(
            "leaseq_worker_heartbeat_late",
            "Times the heartbeat loop woke later than planned by more than its interval "
            "(something held the GIL or stalled the process: renewals were at risk).",
            registry=r,
        )
        self.failovers = Counter(
            "leaseq_worker_failovers",
            "Times a new connection reached another primary than before (a failover): the "
            "leases then in flight were voided, their handlers told to stop.",
            registry=r,
        )
        self.children_started = Counter(
            "leaseq_child_processes_started",
            "Child processes started for handler slots (--isolation process): one per slot at "
            "start-up, then one per child killed (max runtime, cancel, lost lease) or crashed.",
            registry=r,
        )
        self.steps_uncertain = Counter(
            "leaseq_steps_uncertain",
            "Jobs this worker stopped (held, StepUncertain) at a durable step that has an "
            "intent and no result and neither a reconcile check nor idempotent=True: an "
            "operator settles each with `leaseq steps resolve`.",
            ["queue", "job_type"],
            registry=r,
        )
        self._series: dict[tuple[str, str], JobSeries] = {}
        for queue in queues:
            self.in_flight.labels(queue)
            self.renewals.labels(queue)
            self.losses.labels(queue)
            self.fenced.labels(queue)
            for job_type in job_types:
                self.known(queue, job_type)

    def known(self, queue: str, job_type: str) -> None:
        """Create the (queue, job_type) series at 0, for every outcome."""
        self.series(queue, job_type)
        self.steps_uncertain.labels(queue, job_type)

    def series(self, queue: str, job_type: str) -> JobSeries:
        """The (queue, job_type) series, created at 0 (every outcome) on first use. Safe
        from any thread: two first uses at once find the same children."""
        found = self._series.get((queue, job_type))
        if found is None:
            found = JobSeries(
                self.claimed.labels(queue, job_type),
                self.duration.labels(queue, job_type),
                self.in_flight.labels(queue),
                {o: self.finished.labels(queue, job_type, o) for o in OUTCOMES},
                self.effects_not_written.labels(queue, job_type),
            )
            self._series[(queue, job_type)] = found
        return found

    def finish(self, queue: str, job_type: str, outcome: Outcome, count: int = 1) -> None:
        self.series(queue, job_type).finished[outcome].inc(count)
