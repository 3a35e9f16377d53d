"""Typed values of flow control (:class:`leaseq.FlowControl`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class Keep(enum.Enum):
    """The default of :meth:`leaseq.FlowControl.update_limit`'s arguments: the part of the
    limit not given keeps its value."""

    KEEP = "keep"


@dataclass(frozen=True)
class FlowLimit:
    """A limit set for a queue and key (or key pattern with ``*``)."""

    queue: str
    key_pattern: str
    max_running: int | None
    weight: float
    updated_at: datetime
    per_second: float | None = None
    burst: float | None = None


@dataclass(frozen=True)
class FlowKeyStatus:
    """A key with unfinished jobs: its limit, what runs, what is ready and claimable now."""

    queue: str
    key: str
    max_running: int | None
    weight: float
    vtime: float
    running: int
    ready: int
    saturated: bool
    claimable: int
    #: Until when the key is paused (no worker starts a job of it meanwhile); None if it is
    #: not.
    paused_until: datetime | None = None
    #: Units held by workers silent by :func:`leaseq.core.models.is_silent`'s rule (or not
    #: registered): they come back when the reaper reaps their jobs at lease expiry.
    held_silent: int = 0


@dataclass(frozen=True)
class BlockedAggregate:
    """An aggregate whose head job is dead: nothing behind it runs until it is retried or
    skipped."""

    queue: str
    ordering_key: str
    head: int
    blocked_at: datetime | None
    waiting: int


@dataclass(frozen=True)
class FlowQueueSummary:
    """Flow control in one queue: jobs workers could claim now, keys with ready work but no
    free unit of their limit, aggregates blocked by a dead head."""

    queue: str
    claimable: int
    saturated_keys: int
    blocked: int


@dataclass(frozen=True)
class KeysSettled:
    """What one sweep of a queue's keys did (:meth:`leaseq.FlowControl.settle`): keys
    deactivated (no job left), put to sleep until their next job is due, and woken."""

    idle: int
    asleep: int
    woken: int
