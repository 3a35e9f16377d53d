"""What settling an attempt came to: who settled it and how it ended.

Its own module so that the table of attempts in flight (:mod:`leaseq.runtime.inflight`), the
metrics and the settling calls (:mod:`leaseq.runtime.settlement`) share these names without
importing each other.
"""

from __future__ import annotations

import enum

from leaseq.runtime.context import StopReason


class Settler(enum.StrEnum):
    """Who settled an attempt: the handler's slot, or the stop reason that took it away."""

    HANDLER = "handler"
    LEASE_LOST = StopReason.LEASE_LOST.value
    CANCELLED = StopReason.CANCELLED.value
    DRAINING = StopReason.DRAINING.value
    TIMED_OUT = StopReason.TIMED_OUT.value
    NO_PROGRESS = StopReason.NO_PROGRESS.value

    @classmethod
    def stopped(cls, reason: StopReason) -> Settler:
        return cls(reason.value)


class Outcome(enum.StrEnum):
    """How a claimed attempt ended for this worker (``leaseq_jobs_finished_total{outcome}``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"
    #: Stopped at an uncertain durable step until an operator settles it.
    HELD = "held"
    TIMED_OUT = "timed_out"
    RELEASED = "released"
    LEASE_LOST = "lease_lost"
    FENCED = "fenced"
    CANCELLED = "cancelled"
