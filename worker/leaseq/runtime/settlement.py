"""Settling an attempt: who may settle it, the call that does, and what the attempt came to.

Exactly one party settles each attempt (:meth:`leaseq.runtime.inflight.InFlight.take`): the
handler's slot, or the stop reason that took the attempt away. The settling call (complete,
fail or release) is retried while PostgreSQL is unreachable and the lease may still hold; a
retried call that comes back fenced is checked against the audit trail, since the first try
may have been applied before the connection dropped.

What is logged per attempt (:meth:`Settlement._record`): a success only at DEBUG (checked
before anything is formatted); a retry, a release or a cancellation at INFO; a dead job and a
fenced call at WARNING, each with the job id, queue, worker, attempt and token. Every outcome
is counted in the worker's finished counter; a :class:`Tally` reads it, and the worker logs
one INFO line per interval in which something settled, so a busy worker says how much it did
without a line per job.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from leaseq.core.backoff import Backoff
from leaseq.core.errors import DatabaseUnavailable, LeaseqError, StatementTimeout
from leaseq.core.models import (
    AttemptOutcome,
    Call,
    Completed,
    Failed,
    Fenced,
    JobStatus,
    Released,
)
from leaseq.core.queue import Queue
from leaseq.runtime.health import Health
from leaseq.runtime.inflight import InFlight
from leaseq.runtime.metrics import WorkerMetrics
from leaseq.runtime.outcomes import Outcome, Settler

if TYPE_CHECKING:
    import threading

    from prometheus_client import Counter

log = logging.getLogger("leaseq.worker")

#: What a settling call returns.
Answer = Completed | Failed | Released | Fenced

T = TypeVar("T")


@dataclass(frozen=True)
class Done:
    """A successful attempt waiting to be completed: its result and its final progress."""

    attempt: InFlight
    result: Any
    progress: Any
    #: Jobs the handler spawned (a leaseq.Graph), written with the completion.
    spawn: Any = None


# Attempt-row outcomes that show an ambiguous call (retried after a lost connection) had
# in fact been applied, by the call that was retried.
_APPLIED = {
    Call.COMPLETE: {AttemptOutcome.SUCCEEDED},
    Call.FAIL: {AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT},
    Call.RELEASE: {AttemptOutcome.RELEASED, AttemptOutcome.INTERRUPTED},
}


#: How often (seconds) a worker logs its :class:`Tally` (when something settled meanwhile).
SUMMARY_SECONDS = 60.0


class Tally:
    """Attempt outcomes per queue since the last summary line, read from the worker's
    ``leaseq_jobs_finished_total`` counter (the settling path counts nothing a second time);
    :meth:`summary` logs one INFO line with the counts and starts a new interval, or logs
    nothing when nothing settled."""

    def __init__(
        self,
        finished: Counter,
        interval: float = SUMMARY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self._finished = finished
        self._clock = clock
        self._seen: dict[tuple[str, str], float] = {}
        self._since = clock()

    def take(self) -> tuple[float, dict[str, dict[str, int]]]:
        """The seconds since the last take and the counts meanwhile (queue -> outcome ->
        count, outcomes in :class:`Outcome` order), starting a new interval."""
        now = self._clock()
        seconds, self._since = now - self._since, now
        totals: dict[tuple[str, str], float] = {}
        for metric in self._finished.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    key = (sample.labels["queue"], sample.labels["outcome"])
                    totals[key] = totals.get(key, 0.0) + sample.value
        by_queue: dict[str, dict[str, int]] = {}
        for outcome in Outcome:
            for (queue, found), total in sorted(totals.items()):
                n = int(total - self._seen.get((queue, found), 0.0))
                if found == outcome.value and n:
                    by_queue.setdefault(queue, {})[outcome.value] = n
        self._seen = totals
        return seconds, dict(sorted(by_queue.items()))

    def due(self) -> bool:
        """True once ``interval`` has passed since the last summary."""
        return self._clock() - self._since >= self.interval

    def summary(self, fields: dict[str, object], *, force: bool = False) -> None:
        """Log the counts (if any) when the interval has passed, or at once with ``force``
        (at exit, so a short run still says what it did)."""
        if not force and not self.due():
            return
        seconds, counts = self.take()
        if not counts:
            return
        text = "; ".join(
            f"{queue}: " + ", ".join(f"{n} {outcome}" for outcome, n in per.items())
            for queue, per in counts.items()
        )
        log.info(
            "attempts settled in the last %.0fs: %s",
            seconds,
            text,
            extra={**fields, "counts": counts, "seconds": round(seconds, 3)},
        )


def outcome_of(answer: Answer, settled_by: Settler | None) -> Outcome:
    """The outcome a settling call's answer stands for."""
    if isinstance(answer, Fenced):
        # Refused because someone cancelled the job: what was asked for, not a lost lease.
        return Outcome.CANCELLED if answer.status is JobStatus.CANCELLED else Outcome.FENCED
    if isinstance(answer, Completed):
        return Outcome.SUCCEEDED
    if isinstance(answer, Released):
        return Outcome.DEAD if answer.status is JobStatus.DEAD else Outcome.RELEASED
    if settled_by is Settler.TIMED_OUT:
        return Outcome.TIMED_OUT
    if answer.status is JobStatus.HELD:
        return Outcome.HELD
    return Outcome.DEAD if answer.status is JobStatus.DEAD else Outcome.FAILED


class Settlement:
    """Delivers settling calls for a worker and records their outcomes."""

    def __init__(
        self,
        queue: Queue,
        *,
        metrics: WorkerMetrics,
        health: Health,
        stopping: threading.Event,
    ) -> None:
        self.queue = queue
        self.metrics = metrics
        self.health = health
        self.stopping = stopping
        self.tally = Tally(metrics.finished)

    def settle(self, attempt: InFlight, call: Call, fn: Callable[[], Answer]) -> None:
        """Settle as the handler if nobody else has; otherwise drop the result, logged."""
        if not attempt.take(Settler.HANDLER):
            log.info(
                "attempt already given up (%s); result not reported",
                attempt.settled_by,
                extra=attempt.fields(),
            )
            return
        self.settle_taken(attempt, call, fn)

    def settle_taken(
        self, attempt: InFlight, call: Call, fn: Callable[[], Answer], until: float | None = None
    ) -> None:
        """Deliver ``fn`` for an attempt this party has taken, then mark it settled."""
        try:
            outcome = self._deliver(attempt, call, fn, until)
            if outcome is not None:
                self._record(attempt, call, outcome)
        finally:
            attempt.settled.set()

    def complete(self, group: Sequence[Done]) -> None:
        """Complete attempts this party has taken, in one ``complete_many`` statement (one
        commit; each lease fenced on its own), then record each outcome and mark it settled.

        While PostgreSQL is unreachable the statement is retried with backoff; attempts whose
        lease has surely expired meanwhile are left to the reaper. A statement that fails for
        another reason (one result PostgreSQL refuses) is split, so only that attempt is
        left undelivered."""
        try:
            if len(group) > 1 and self._complete_group(group):
                return
            # One attempt, or a group PostgreSQL refused as a whole: one statement each.
            for done in group:
                try:
                    self.settle_taken(
                        done.attempt, Call.COMPLETE, partial(self._complete_one, done)
                    )
                except LeaseqError as exc:
                    log.error(
                        "complete refused: %s; the reaper will return the job",
                        exc,
                        extra=done.attempt.fields(),
                    )
        finally:
            for done in group:
                done.attempt.settled.set()

    def _complete_many(self, group: Sequence[Done]) -> list[Completed | Fenced]:
        answers = self.queue.complete_many(
            [d.attempt.job.lease for d in group],
            [d.result for d in group],
            # The enqueuer's key, if any: a job without one gets no effect row.
            effect_keys=[d.attempt.job.idempotency_key for d in group],
            progresses=[d.progress for d in group],
            spawns=[d.spawn for d in group],
        )
        for done, answer in zip(group, answers, strict=True):
            if isinstance(answer, Completed) and answer.effect_dropped:
                self._effect_dropped(done.attempt, answer)
        return answers

    def _effect_dropped(self, attempt: InFlight, answer: Completed) -> None:
        job = attempt.job
        self.metrics.series(job.queue, job.job_type).effects_not_written.inc()
        log.warning(
            "job succeeded but its effect was not written: key %r is held by another job's "
            "effect in queue %s, type %s (keys are shared by every producer of the queue)",
            answer.effect_key,
            job.queue,
            job.job_type,
            extra=attempt.fields(),
        )

    def _complete_one(self, done: Done) -> Answer:
        return self._complete_many([done])[0]

    def _complete_group(self, group: Sequence[Done]) -> bool:
        """Deliver the group; False if PostgreSQL refused the statement for a reason other
        than being unreachable (nothing was applied then)."""
        pending = list(group)

        def keep_trying(exc: LeaseqError) -> bool:
            now = time.monotonic()
            for done in [d for d in pending if now > d.attempt.lease_bound]:
                log.error(
                    "complete not delivered before the lease expired: %s; "
                    "the reaper will return the job",
                    exc,
                    extra=done.attempt.fields(),
                )
            # In place: the next try completes only what is left.
            pending[:] = [d for d in pending if now <= d.attempt.lease_bound]
            return bool(pending) and not self.stopping.is_set()

        try:
            reached = self._retried(
                lambda: self._complete_many(pending),
                keep_trying,
                lambda: f"complete of {len(pending)}",
            )
        except LeaseqError as exc:
            log.warning("complete of %d refused (%s); completing one by one", len(pending), exc)
            return False
        if reached is None:
            return True
        answers, retried = reached
        # Successes are counted once per (queue, job type) of the group.
        succeeded: collections.Counter[tuple[str, str]] = collections.Counter()
        for done, answer in zip(pending, answers, strict=True):
            outcome = None
            if retried and isinstance(answer, Fenced):
                outcome = self._applied(done.attempt, Call.COMPLETE)
            outcome = outcome or outcome_of(answer, None)
            if outcome is Outcome.SUCCEEDED:
                succeeded[done.attempt.job.queue, done.attempt.job.job_type] += 1
            self._record(done.attempt, Call.COMPLETE, outcome, counted=True)
        for (queue, job_type), count in succeeded.items():
            self.metrics.finish(queue, job_type, Outcome.SUCCEEDED, count)
        return True

    def _deliver(
        self, attempt: InFlight, call: Call, fn: Callable[[], Answer], until: float | None
    ) -> Outcome | None:
        """``fn()``, retried while PostgreSQL is unreachable, the lease may still hold and
        ``until`` (monotonic) has not passed; returns the attempt's outcome, or None after
        giving up (the reaper will take the job back). A retried call that comes back fenced
        is checked against the audit trail: if the first try had been applied before the
        connection dropped, that is the outcome."""

        def keep_trying(exc: LeaseqError) -> bool:
            limit = attempt.lease_bound if until is None else min(until, attempt.lease_bound)
            if time.monotonic() > limit or self.stopping.is_set():
                log.error(
                    "%s not delivered before the lease expired: %s; the reaper will return the job",
                    call,
                    exc,
                    extra=attempt.fields(),
                )
                return False
            return True

        reached = self._retried(fn, keep_trying, lambda: str(call), attempt.fields)
        if reached is None:
            return None
        answer, retried = reached
        if retried and isinstance(answer, Fenced):
            applied = self._applied(attempt, call)
            if applied is not None:
                log.info(
                    "%s had been applied before the connection dropped",
                    call,
                    extra=attempt.fields(),
                )
                return applied
        return outcome_of(answer, attempt.settled_by)

    def _retried(
        self,
        fn: Callable[[], T],
        keep_trying: Callable[[LeaseqError], bool],
        what: Callable[[], str],
        fields: Callable[[], dict[str, object]] | None = None,
    ) -> tuple[T, bool] | None:
        """``fn()`` and whether it had to be tried again: while PostgreSQL is unreachable, or
        the statement waited out its lock_timeout (a session holding the job's row idle: it
        changed nothing), it is retried with backoff for as long as ``keep_trying`` (which
        logs why it gives up) says so; None once it said not to. Any other error propagates
        at once."""
        backoff = Backoff(0.1, 2.0)
        retried = False
        while True:
            try:
                answer = fn()
            except (DatabaseUnavailable, StatementTimeout) as exc:
                if isinstance(exc, DatabaseUnavailable):
                    self.health.db_failed(exc)
                if not keep_trying(exc):
                    return None
                delay = backoff.next()
                log.warning(
                    "%s failed (%s); retrying in %.1fs",
                    what(),
                    exc,
                    delay,
                    extra=None if fields is None else fields(),
                )
                time.sleep(delay)
                retried = True
                continue
            self.health.db_ok()
            return answer, retried

    def _applied(self, attempt: InFlight, call: Call) -> Outcome | None:
        """The outcome if the audit trail shows ``call`` was applied for this lease."""
        try:
            attempts = self.queue.attempts(attempt.job.id)
            mine = [
                a.outcome
                for a in attempts
                if a.lease_token == attempt.job.lease.token and a.outcome in _APPLIED[call]
            ]
            if not mine:
                return None
            if mine[0] is AttemptOutcome.FAILED:
                status = self.queue.get(attempt.job.id).status
                if status is JobStatus.DEAD:
                    return Outcome.DEAD
                if status is JobStatus.HELD:
                    return Outcome.HELD
            if mine[0] is AttemptOutcome.INTERRUPTED:
                return Outcome.RELEASED
            return Outcome(mine[0].value)
        except LeaseqError:
            return None

    def _finish(self, attempt: InFlight, outcome: Outcome) -> None:
        queue = attempt.job.queue
        self.metrics.finish(queue, attempt.job.job_type, outcome)

    def _record(
        self, attempt: InFlight, call: Call, outcome: Outcome, *, counted: bool = False
    ) -> None:
        """Count the outcome (a success unless the caller ``counted`` it); log it per job
        only when it is not a success (a success is logged at DEBUG, and only formatted when
        DEBUG is on)."""
        if outcome is Outcome.SUCCEEDED:
            if not counted:
                self._finish(attempt, outcome)
            if log.isEnabledFor(logging.DEBUG):
                fields = {**attempt.fields(), "outcome": outcome}
                log.debug("attempt settled: %s", outcome, extra=fields)
            return
        self._finish(attempt, outcome)
        if outcome is Outcome.FENCED:
            self.metrics.fenced.labels(attempt.job.queue).inc()
            log.warning("%s fenced: the lease was lost", call, extra=attempt.fields())
            return
        level = logging.WARNING if outcome is Outcome.DEAD else logging.INFO
        log.log(
            level, "attempt settled: %s", outcome, extra={**attempt.fields(), "outcome": outcome}
        )

    def cancelled(self, attempt: InFlight) -> None:
        """Count an attempt whose job was cancelled while it ran: nothing is reported for it."""
        self._finish(attempt, Outcome.CANCELLED)

    def lost(self, attempt: InFlight) -> None:
        """Count an attempt whose lease is gone: nothing is reported for it."""
        self.metrics.losses.labels(attempt.job.queue).inc()
        self._finish(attempt, Outcome.LEASE_LOST)
