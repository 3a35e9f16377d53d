"""Typed values of schedules (:class:`leaseq.Schedules`): what is stored, and what a tick did."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from leaseq.core.cron import DEFAULT_CATCHUP_SECONDS
from leaseq.core.errors import LeaseqError
from leaseq.core.models import JobStatus


class ScheduleNotFound(LeaseqError, LookupError):
    """No schedule has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}")
        self.name = name


class ScheduleOrigin(enum.StrEnum):
    """Who declared a schedule (PostgreSQL type ``leaseq.schedule_origin``)."""

    CODE = "code"  # registry.schedule(...), upserted when a worker starts
    RUNTIME = "runtime"  # leaseq schedules add, or Schedules.add


class Overlap(enum.StrEnum):
    """What a slot does while the previous slot's job is still pending or running."""

    SKIP = "skip"  # record the slot as skipped, enqueue nothing (the default)
    ALLOW = "allow"  # enqueue anyway


class SlotOutcome(enum.StrEnum):
    """What became of one slot (PostgreSQL type ``leaseq.slot_outcome``)."""

    ENQUEUED = "enqueued"
    SKIPPED = "skipped"


class ScheduleState(enum.StrEnum):
    """A schedule as ``leaseq schedules list`` shows it."""

    ACTIVE = "active"
    PAUSED = "paused"
    DISABLED = "disabled"  # declared in code by an app whose registry no longer lists it


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule to declare: fire a ``job_type`` job on ``queue`` at every slot of ``cron``
    (wall-clock time in ``timezone``). A tick fires every slot at most ``catchup_seconds``
    old, oldest first, and of older ones only the latest (the rest are missed). The default
    (:data:`leaseq.core.cron.DEFAULT_CATCHUP_SECONDS`, 60 s) covers slots between two passes
    and a leader takeover; 0 fires only the latest slot. A cron with slots closer than the
    leader's pass (5 s) needs a window of at least that (refused otherwise)."""

    name: str
    cron: str
    queue: str
    job_type: str
    payload: Any = field(default_factory=dict)
    timezone: str = "UTC"
    priority: int = 100
    max_attempts: int = 5
    overlap: Overlap = Overlap.SKIP
    catchup_seconds: float = DEFAULT_CATCHUP_SECONDS


@dataclass(frozen=True)
class ScheduleRecord:
    """A stored schedule, with its last slot, the next one (from the database's now) and
    the state of the last slot's job (None when none was enqueued or it was pruned)."""

    name: str
    cron: str
    timezone: str
    queue: str
    job_type: str
    payload: Any
    priority: int
    max_attempts: int
    overlap: Overlap
    catchup_seconds: float
    paused: bool
    enabled: bool
    declared_by: ScheduleOrigin
    declared_in: str | None
    disabled_reason: str | None
    fire_after: datetime
    last_slot: datetime | None
    last_job_id: int | None
    last_job_status: JobStatus | None
    missed_slots: int
    created_at: datetime
    updated_at: datetime
    next_slot: datetime | None
    #: Seconds between the last slot and the tick that fired it.
    lag_seconds: float | None
    #: Seconds since the latest due slot that no tick has recorded yet (0: up to date; None
    #: while paused or disabled). A few seconds is a tick interval; more, no scheduler runs.
    late_seconds: float | None = None

    @property
    def state(self) -> ScheduleState:
        if not self.enabled:
            return ScheduleState.DISABLED
        return ScheduleState.PAUSED if self.paused else ScheduleState.ACTIVE


@dataclass(frozen=True)
class FiredSlot:
    """One slot a tick recorded: its job (None when skipped for overlap)."""

    schedule: str
    slot: datetime
    outcome: SlotOutcome
    job_id: int | None


@dataclass(frozen=True)
class Tick:
    """What one scheduler tick did: slots recorded here (a slot another scheduler recorded
    first is not listed), slots missed, and schedules whose tick failed (by name: error)."""

    fired: tuple[FiredSlot, ...] = ()
    missed: int = 0
    failed: dict[str, str] = field(default_factory=dict)
