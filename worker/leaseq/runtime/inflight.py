"""The worker's table of jobs in flight, shared by slots, the heartbeat loop and shutdown.

Exactly one party settles each attempt: the slot (handler returned or raised), the heartbeat
loop (lease lost, timed out, no progress) or shutdown (released at the end of the drain). It
wins the right by :meth:`InFlight.take`; everybody else leaves the job alone from then on,
which is how a result that arrives after its lease was lost is never reported.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from leaseq.core.models import ClaimedJob
from leaseq.runtime.context import JobContext
from leaseq.runtime.latch import Latch
from leaseq.runtime.outcomes import Settler
from leaseq.runtime.registry import JobType

# The attempt is settled this long before its max runtime as measured locally, so the
# fail(timed_out) call reaches PostgreSQL while the lease (capped at the deadline) still holds.
TIMEOUT_MARGIN_SECONDS = 0.5


@dataclass(eq=False)
class InFlight:
    """One claimed attempt and the worker's local view of its lease."""

    job: ClaimedJob
    job_type: JobType | None
    context: JobContext
    #: Local monotonic time by which the lease has surely expired unless renewed.
    lease_bound: float
    #: Local monotonic time at which to give the attempt up as timed out (None: no timeout).
    deadline: float | None
    #: Local monotonic time of the next lease renewal: one heartbeat interval after the
    #: claim, so an attempt that settles sooner never sends a heartbeat.
    renew_at: float
    #: Held while a heartbeat for this job is in flight and while settling is decided.
    lock: threading.RLock = field(default_factory=threading.RLock)
    settled_by: Settler | None = None
    #: Set once the settling call (complete, fail or release) has returned or given up.
    settled: Latch = field(default_factory=Latch)
    sent_progress_version: int = 0
    #: Local monotonic time before which the lease surely still holds (its earliest end):
    #: a child process stops at it by itself (:mod:`leaseq.runtime.child`).
    lease_floor: float = float("inf")
    #: Local monotonic time at or before the job's max runtime ends in database time: no
    #: renewal extends the lease past it.
    runtime_floor: float = float("inf")
    #: How long the last claim or renewal held the lease for (seconds, at least).
    granted: float = float("inf")

    @classmethod
    def start(
        cls,
        job: ClaimedJob,
        job_type: JobType | None,
        context: JobContext,
        *,
        sent_at: float,
        received_at: float,
        lease_seconds: float,
        heartbeat_seconds: float,
    ) -> InFlight:
        """Local bounds from a claim sent at ``sent_at`` and answered at ``received_at``: the
        database's start time lies between the two."""
        deadline = None
        runtime_floor = float("inf")
        if job.timeout_seconds is not None:
            margin = min(TIMEOUT_MARGIN_SECONDS, job.timeout_seconds / 4)
            deadline = sent_at + job.timeout_seconds - margin
            runtime_floor = sent_at + job.timeout_seconds
        attempt = cls(
            job,
            job_type,
            context,
            lease_bound=received_at + lease_seconds,
            deadline=deadline,
            renew_at=received_at + heartbeat_seconds,
            runtime_floor=runtime_floor,
        )
        attempt.renewed(sent_at, lease_seconds)
        return attempt

    def renewed(self, sent_at: float, lease_seconds: float) -> None:
        """Record a claim or renewal sent at ``sent_at`` that PostgreSQL granted: the lease
        ends ``least(lease_seconds, started_at + timeout - now)`` after the statement's
        ``now()`` (database time, as job_claim and job_heartbeat_many compute it), and that
        statement ran after ``sent_at``, so ``sent_at`` plus that length is a local time at
        or before the lease's end, whatever the offset between the two hosts' clocks (only
        durations are measured here)."""
        self.lease_floor = min(sent_at + lease_seconds, self.runtime_floor)
        self.granted = self.lease_floor - sent_at

    @property
    def running(self) -> bool:
        """Nobody has taken the attempt to settle it yet."""
        return self.settled_by is None

    def fields(self) -> dict[str, object]:
        """The attempt's structured log fields."""
        lease = self.job.lease
        return {
            "job_id": lease.job_id,
            "queue": self.job.queue,
            "job_type": self.job.job_type,
            "worker": lease.owner,
            "attempt": lease.attempt,
            "token": lease.token,
        }

    def take(self, by: Settler) -> bool:
        """Claim the right to settle the attempt; False if someone else already has it."""
        with self.lock:
            if self.settled_by is not None:
                return False
            self.settled_by = by
            return True


class InFlightTable:
    """Thread-safe set of in-flight attempts by job id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[int, InFlight] = {}

    def add(self, attempt: InFlight) -> None:
        with self._lock:
            self._jobs[attempt.job.id] = attempt

    def remove(self, attempts: list[InFlight]) -> None:
        """Forget ``jobs`` (each only if it is still the attempt held under its job id)."""
        with self._lock:
            for attempt in attempts:
                if self._jobs.get(attempt.job.id) is attempt:
                    del self._jobs[attempt.job.id]

    def snapshot(self) -> list[InFlight]:
        with self._lock:
            return list(self._jobs.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)

    def running(self) -> list[InFlight]:
        """Attempts nobody has settled yet."""
        return [attempt for attempt in self.snapshot() if attempt.running]

    def wait_settled(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every taken attempt's settling call returned."""
        end = time.monotonic() + timeout
        for attempt in self.snapshot():
            left = max(0.0, end - time.monotonic())
            if attempt.settled_by is not None and not attempt.settled.wait(left):
                return False
        return True
