"""One loop that keeps every in-flight lease alive, and gives up the attempts that must stop.

Every ``heartbeat_seconds`` it renews each running attempt's lease (sending the handler's
latest progress with it) and refreshes the worker's row in ``leaseq.workers``. Between
renewals it wakes for the nearest max-runtime deadline and the nearest local lease end.

While PostgreSQL is unreachable it retries every ``RETRY_SECONDS`` (jittered) instead of
every interval, so leases are renewed within a fraction of a second of the database
accepting connections again: an outage shorter than the lease costs nothing. At a lease's
local end the handler is told to stop (``LEASE_LOST``) at once, not at the next renewal: a
handler cut off from the database stops within a renewal's round trip of the moment another
worker could claim its job. It stops renewing an attempt when:

* its max runtime is reached (``TIMED_OUT``: the attempt is failed as timed out);
* its job type's progress timeout passed without progress (``NO_PROGRESS``: failed, retried);
* PostgreSQL says the lease is gone (``LEASE_LOST``/``CANCELLED``: never reported).

The decision to give an attempt up is the runtime's ``give_up`` callback; this module only
decides when.

The loop knows when it meant to wake. When it wakes later than that by more than
``LATE_INTERVALS`` heartbeat intervals, nothing in this process could run for that long: in
thread mode, a handler holding the GIL or blocking in C (leases then expire under running
jobs). It logs a WARNING naming the cause and remedy (``hint``) and counts it in
``leaseq_worker_heartbeat_late``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from leaseq.core.backoff import Backoff
from leaseq.core.errors import DatabaseUnavailable, LeaseqError
from leaseq.core.models import HeartbeatStatus, JobStatus
from leaseq.core.queue import Queue
from leaseq.runtime.context import StopReason
from leaseq.runtime.health import Health
from leaseq.runtime.inflight import InFlight, InFlightTable
from leaseq.runtime.metrics import WorkerMetrics

log = logging.getLogger("leaseq.heartbeat")

#: Longest pause between renewal tries while PostgreSQL is unreachable (seconds).
RETRY_SECONDS = 0.25

GiveUp = Callable[[InFlight, StopReason], None]

#: How late (in heartbeat intervals) a wake-up must be to count as starved: a whole missed
#: renewal, not scheduling noise.
LATE_INTERVALS = 1.0
#: What a late wake-up most likely means in thread mode, and what to do about it.
THREAD_HINT = (
    "a handler is probably holding the GIL or blocking in C code; run such handlers with "
    "--isolation process (the heartbeat then runs in a process they cannot stall)"
)
#: The same with handlers in child processes: they cannot stall this one.
PROCESS_HINT = (
    "handlers run in child processes here, so the worker process itself was stalled "
    "(CPU starved by its limits or neighbours, swapping, or stopped)"
)


class HeartbeatLoop:
    """Renews leases for ``jobs`` until ``stopping`` is set; run it in its own thread."""

    def __init__(
        self,
        queue: Queue,
        jobs: InFlightTable,
        *,
        lease_seconds: float,
        interval: float,
        metrics: WorkerMetrics,
        health: Health,
        give_up: GiveUp,
        register: Callable[[], None],
        stopping: threading.Event,
        hint: str = THREAD_HINT,
    ) -> None:
        """``hint``: the likely cause of a late wake-up, and its remedy, for the warning."""
        self.queue = queue
        self.hint = hint
        self.jobs = jobs
        self.lease_seconds = lease_seconds
        self.interval = interval
        self.metrics = metrics
        self.health = health
        self.give_up = give_up
        self.register = register
        self.stopping = stopping
        self.nudge = threading.Event()
        # Since when (monotonic) renewals have not reached PostgreSQL; None while they do.
        self.unreachable_since: float | None = None
        self._retry = Backoff(RETRY_SECONDS / 2, RETRY_SECONDS)

    def run(self) -> None:
        next_register = time.monotonic()
        while not self.stopping.is_set():
            self.health.tick("heartbeat")
            try:
                now = time.monotonic()
                self.enforce_limits(now)
                self.renew_due(now)
                if now >= next_register:
                    next_register = now + self.interval
                    self.register()
            except Exception:
                # A bug here must not stop renewals for good: log it loudly and go on.
                log.exception("heartbeat loop error; continuing")
            wake_at = max(min([next_register, *self._due_times()]), time.monotonic())
            if not self.nudge.wait(wake_at - time.monotonic()):
                self.check_late(wake_at, time.monotonic())
            self.nudge.clear()

    def check_late(self, planned: float, woke: float) -> bool:
        """Log and count a wake-up at ``woke`` that was planned for ``planned`` (monotonic
        seconds) if it is late by more than ``LATE_INTERVALS`` intervals; True if it was."""
        late = woke - planned
        if late <= LATE_INTERVALS * self.interval:
            return False
        self.metrics.heartbeat_late.inc()
        log.warning(
            "heartbeat ran %.1fs late (interval %.1fs, %d job(s) in flight): %s",
            late,
            self.interval,
            len(self.jobs.running()),
            self.hint,
        )
        return True

    def _due_times(self) -> list[float]:
        """When each running attempt next needs a renewal, and its max-runtime deadline."""
        times = []
        for attempt in self.jobs.running():
            times.append(attempt.renew_at)
            if not attempt.context.should_stop:
                times.append(attempt.lease_bound)
            if attempt.deadline is not None:
                times.append(attempt.deadline)
        return times

    def enforce_limits(self, now: float) -> None:
        """Give up attempts past their max runtime or progress timeout; flag (only flag)
        attempts whose lease must have expired locally, since PostgreSQL decides the rest."""
        for attempt in self.jobs.running():
            if attempt.deadline is not None and now >= attempt.deadline:
                self.give_up(attempt, StopReason.TIMED_OUT)
                continue
            limit = attempt.job_type.progress_timeout if attempt.job_type else None
            if limit is not None and attempt.context.seconds_since_progress() >= limit:
                self.give_up(attempt, StopReason.NO_PROGRESS)
                continue
            if now > attempt.lease_bound and not attempt.context.should_stop:
                log.warning("lease expired before it could be renewed", extra=attempt.fields())
                attempt.context.request_stop(StopReason.LEASE_LOST)

    def renew_due(self, now: float) -> None:
        """Renew, in one statement, the leases of attempts that have run for a heartbeat
        interval since their claim or last renewal; younger ones still hold a lease longer
        than that."""
        if self.stopping.is_set():
            return
        due = [attempt for attempt in self.jobs.running() if now >= attempt.renew_at]
        if not due:
            return
        for attempt in due:
            attempt.renew_at = now + self.interval
        if self.renew(due):
            self._reached()
        else:
            if self.unreachable_since is None:
                self.unreachable_since = now
            retry_at = time.monotonic() + min(self.interval, self._retry.next())
            for attempt in due:
                attempt.renew_at = retry_at

    def _reached(self) -> None:
        self._retry.reset()
        if self.unreachable_since is not None:
            log.info("PostgreSQL reachable again after %.1fs; leases renewed",
                     time.monotonic() - self.unreachable_since)  # fmt: skip
            self.unreachable_since = None

    def renew(self, due: list[InFlight]) -> bool:
        """One renewal statement for ``due``; False only when PostgreSQL could not be
        reached. Holds each attempt's lock meanwhile, so no slot can settle its attempt
        during it (only this thread ever holds more than one of them: no lock cycle)."""
        with contextlib.ExitStack() as held:
            attempts, progresses, versions = [], [], []
            for attempt in due:
                held.enter_context(attempt.lock)
                if not attempt.running:
                    continue
                value, version = attempt.context.pending_progress()
                attempts.append(attempt)
                progresses.append(value if version > attempt.sent_progress_version else None)
                versions.append(version)
            if not attempts:
                return True
            sent = time.monotonic()
            try:
                beats = self.queue.heartbeat_many(
                    [attempt.job.lease for attempt in attempts],
                    lease_seconds=self.lease_seconds,
                    progresses=progresses,
                )
            except DatabaseUnavailable as exc:
                self.health.db_failed(exc)
                # Once per outage at WARNING: the retries every RETRY_SECONDS are DEBUG.
                level = logging.WARNING if self.unreachable_since is None else logging.DEBUG
                log.log(level, "lease renewal of %d job(s) failed, will retry: %s",
                        len(attempts), exc)  # fmt: skip
                return False
            except LeaseqError as exc:
                log.error("lease renewal of %d job(s) failed: %s", len(attempts), exc)
                return True
            self.health.db_ok()
            lost = []
            for attempt, version, beat in zip(attempts, versions, beats, strict=True):
                if beat.status is HeartbeatStatus.RENEWED:
                    attempt.lease_bound = time.monotonic() + self.lease_seconds
                    attempt.renewed(sent, self.lease_seconds)
                    attempt.sent_progress_version = version
                    self.metrics.renewals.labels(attempt.job.queue).inc()
                else:
                    lost.append((attempt, beat))
            if len(lost) < len(attempts):
                self.metrics.last_heartbeat.set_to_current_time()
        # Outside the locks: giving up may stop or kill a handler, and take() decides
        # between it and a slot settling the same attempt.
        for attempt, beat in lost:
            if beat.job_status is JobStatus.CANCELLED:
                self.give_up(attempt, StopReason.CANCELLED)
            else:
                self.metrics.fenced.labels(attempt.job.queue).inc()
                self.give_up(attempt, StopReason.LEASE_LOST)
        return True
