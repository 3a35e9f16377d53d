"""The worker's claim loop: claim whenever a slot is free, until draining starts.

A dispatcher thread claims, in one claim call, as many jobs as there are free slots, and
claims again at once for the room the jobs of a batch type opened; it is woken by LISTEN
notifications and settled jobs, else by a jittered idle backoff capped at the poll interval.
The completion loop claims too, for the slots a group freed (:meth:`Dispatcher.refill`),
sparing a thread hand-off per cycle; a lock keeps the two from claiming at once. Which
statements each claim runs is the worker's :class:`~leaseq.runtime.claims.ClaimPlanner`'s
choice, which this loop owns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from leaseq.core.backoff import Backoff
from leaseq.core.errors import LeaseqError
from leaseq.core.queue import MAX_CLAIM_BATCH, Queue
from leaseq.runtime.claims import ClaimPlanner
from leaseq.runtime.context import JobContext
from leaseq.runtime.executor import Executor
from leaseq.runtime.health import NOT_READY_ERRORS, Health
from leaseq.runtime.inflight import InFlight, InFlightTable
from leaseq.runtime.metrics import WorkerMetrics
from leaseq.runtime.registry import Registry
from leaseq.runtime.settings import WorkerSettings

log = logging.getLogger("leaseq.worker")


class Dispatcher:
    """Claims for the free slots of ``executor`` and hands each attempt to ``start``, which
    runs it (or gives it back when draining started meanwhile)."""

    def __init__(
        self,
        settings: WorkerSettings,
        registry: Registry,
        queue: Queue,
        *,
        executor: Executor,
        jobs: InFlightTable,
        metrics: WorkerMetrics,
        health: Health,
        draining: threading.Event,
        wake: threading.Event,
        start: Callable[[InFlight], None],
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.queue = queue
        self.executor = executor
        self.jobs = jobs
        self.metrics = metrics
        self.health = health
        self.draining = draining
        self.wake = wake
        self.start = start
        # What this worker's claims found, which decides the statements of the next.
        self.planner = ClaimPlanner()
        # Held while claiming: the dispatcher and the completion loop both claim.
        self._claiming = threading.Lock()

    @property
    def _fields(self) -> dict[str, str]:
        return {"worker": self.settings.worker_id}

    def run(self) -> None:
        """Claim whenever a slot is free, until draining starts."""
        s = self.settings
        idle = Backoff(min(0.5, s.poll_seconds), s.poll_seconds)
        failures = Backoff(0.5, 15.0)
        try:
            self._dispatch(idle, failures)
        finally:
            # Claiming ends with the drain, which may outlast any liveness allowance.
            self.health.forget("dispatcher")

    def _dispatch(self, idle: Backoff, failures: Backoff) -> None:
        s = self.settings
        while not self.draining.is_set():
            self.health.tick("dispatcher")
            if self.executor.capacity - len(self.jobs) <= 0:
                self.wake.wait(s.poll_seconds)
                self.wake.clear()
                continue
            # Cleared before claiming: a notification during the claim keeps it set.
            self.wake.clear()
            try:
                short, claimed = self._claim_free()
            except LeaseqError as exc:
                if isinstance(exc, NOT_READY_ERRORS):
                    self.health.db_failed(exc)
                delay = failures.next()
                log.warning("claim failed (%s); retrying in %.1fs", exc, delay, extra=self._fields)
                self.wake.wait(delay)
                continue
            except Exception:
                log.exception("dispatcher error; continuing", extra=self._fields)
                self.wake.wait(failures.next())
                continue
            failures.reset()
            if not short:
                idle.reset()
                continue
            if claimed:
                idle.reset()
            self.wake.wait(idle.next())

    def _claim_free(self) -> tuple[bool, list[InFlight]]:
        """Claim as many jobs as there is free capacity; when those jobs raised it (they
        opened batches, which take up to ``max_batch`` jobs per slot), claim again for the
        new room at once, so a batch fills from a backlog instead of waiting ``max_wait``
        alone. Stops as soon as a claim returns fewer jobs than asked for (the queue has no
        more: never a loop on an empty queue), no capacity is free or draining started, and
        after ``concurrency + 1`` claims (enough for one batch opening per slot; if room is
        left, the dispatcher is woken to claim for it). Returns whether the last claim came
        up short (the dispatcher then backs off) and the attempts started."""
        started: list[InFlight] = []
        rounds = self.settings.concurrency + 1
        with self._claiming:
            while (free := self.executor.capacity - len(self.jobs)) > 0:
                if self.draining.is_set():
                    break
                if rounds == 0:
                    # Room is left (jobs finished meanwhile): the dispatcher claims for it.
                    self.wake.set()
                    break
                rounds -= 1
                asked = min(free, MAX_CLAIM_BATCH)
                claimed = self._claim(asked)
                started += claimed
                if len(claimed) < asked:
                    return True, started
        return False, started

    def refill(self) -> None:
        """After a completion group: claim for the slots it freed, on this thread. If the
        claim fails, the dispatcher takes over (with its backoff)."""
        if self.draining.is_set():
            self.wake.set()
            return
        try:
            self._claim_free()
        except Exception:
            self.wake.set()

    def _claim(self, free: int) -> list[InFlight]:
        s = self.settings
        if not self.registry.job_types:
            return []  # it serves nothing, so it claims nothing (said at start-up)
        sent = time.monotonic()
        # Only the types this worker serves: one it does not know stays pending, no attempt
        # spent, for a worker that does (a rolling deploy that ships a new type).
        claimed = self.queue.claim(
            s.queues,
            s.worker_id,
            limit=min(free, MAX_CLAIM_BATCH),
            lease_seconds=s.lease_seconds,
            job_types=self.registry.job_types,
            plan=self.planner,
        )
        received = time.monotonic()
        self.health.db_ok()
        self.metrics.claim_latency.observe(received - sent)
        started = []
        # Counted once per (queue, job type) of the claim, not once per job.
        kinds: Counter[tuple[str, str]] = Counter()
        for job in claimed:
            attempt = InFlight.start(
                job,
                self.registry.get(job.job_type),
                JobContext(job, self.queue, s.worker_id, self.draining),
                sent_at=sent,
                received_at=received,
                lease_seconds=s.lease_seconds,
                heartbeat_seconds=s.heartbeat_seconds,
            )
            self.jobs.add(attempt)
            kinds[job.queue, job.job_type] += 1
            started.append(attempt)
        for (queue, job_type), count in kinds.items():
            series = self.metrics.series(queue, job_type)
            series.in_flight.inc(count)
            series.claimed.inc(count)
        for attempt in started:
            self.start(attempt)
        return started
