"""The worker's claim planner: which claim statements each claim runs, and in which order.

A worker asks for two kinds of work: keyless jobs (job_claim) and keyed ones, leased by the
cheapest of three statements that keeps the queues' flow control (job_claim_keyed_open
while they have no limit or rate set, job_claim_keyed_slots while they have limits but no
rate, job_claim_keyed with rates). What its last claims found decides what the next one
runs first; the worker owns that memory, as River's producer owns its fetch state, and the
queue's statements (:class:`leaseq.core.claims.Claims`) only run and answer. The decisions
are the pure functions below; :class:`ClaimPlanner` keeps the state they read.
"""

from __future__ import annotations

import enum
import threading

from leaseq.core.claims import Claims
from leaseq.core.models import ClaimedJob

#: A kind of work that the last claim of it did not find goes first in every PROBE-th round.
PROBE = 16
#: Every REOPEN-th round asks job_claim_keyed_open again, to come back down once limits
#: or rates are removed.
REOPEN = 64


class KeyedBy(enum.StrEnum):
    """The keyed claim statements, cheapest first."""

    OPEN = "job_claim_keyed_open"
    SLOTS = "job_claim_keyed_slots"
    FULL = "job_claim_keyed"


def keyed_first(round_: int, keyed_seen: bool, keyless_seen: bool) -> bool:
    """Whether claim round ``round_`` (counted from 1) looks for keyed jobs before keyless
    ones, given whether the last claim of each kind found work. A kind that was not found
    goes first only every PROBE-th round (and fills a short batch otherwise), so queues of
    one kind pay one statement a claim; while both kinds show, they alternate."""
    probe = round_ % PROBE == 0
    if keyed_seen == keyless_seen:
        return round_ % 2 == 0 if keyed_seen else probe
    return keyed_seen != probe


def keyed_start(round_: int, last: KeyedBy) -> KeyedBy:
    """The keyed statement round ``round_`` tries first: the one the last keyed claim
    settled on, but OPEN every REOPEN-th round. A stale choice costs a statement, never a
    limit: each statement refuses queues whose flow control it does not keep."""
    return KeyedBy.OPEN if round_ % REOPEN == 0 else last


def keyed_instead(by: KeyedBy, *, limited: bool, rated: bool) -> KeyedBy | None:
    """The statement to run after ``by`` found its queues have a limit (``limited``) or a
    rate (``rated``) it does not keep; None when ``by`` kept them (it never escalates past
    FULL, which keeps both)."""
    if by is KeyedBy.OPEN and limited:
        return KeyedBy.FULL if rated else KeyedBy.SLOTS
    if by is KeyedBy.SLOTS and rated:
        return KeyedBy.FULL
    return None


class ClaimPlanner:
    """A claim plan (:data:`leaseq.core.claims.ClaimPlan`) with the memory of one worker's
    claims: pass it to every :meth:`leaseq.Queue.claim` of that worker. Thread-safe; the
    statements run outside its lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds = 0
        # Whether the last claim of each kind found work.
        self._keyed_seen = False
        self._keyless_seen = True
        # The keyed statement the last keyed claim settled on.
        self._keyed_by = KeyedBy.OPEN

    def __call__(self, claims: Claims, limit: int) -> list[ClaimedJob]:
        """Up to ``limit`` jobs: the kind :func:`keyed_first` picks, then the other kind for
        the rest of the batch."""
        with self._lock:
            self._rounds += 1
            round_ = self._rounds
            first = keyed_first(round_, self._keyed_seen, self._keyless_seen)
        got: list[ClaimedJob] = []
        for keyed in (first, not first):
            room = limit - len(got)
            if room <= 0:
                break
            found = self._keyed(claims, room, round_) if keyed else claims.keyless(room)
            with self._lock:
                if keyed:
                    self._keyed_seen = bool(found)
                else:
                    self._keyless_seen = bool(found)
            got += found
        return got

    def _keyed(self, claims: Claims, room: int, round_: int) -> list[ClaimedJob]:
        """Keyed jobs by :func:`keyed_start`'s statement, then by each one
        :func:`keyed_instead` names (at most OPEN, SLOTS, FULL); remembers the last."""
        with self._lock:
            by = keyed_start(round_, self._keyed_by)
        while True:
            found, instead = _run_keyed(claims, by, room)
            if instead is None:
                break
            by = instead
        with self._lock:
            self._keyed_by = by
        return found


def _run_keyed(claims: Claims, by: KeyedBy, room: int) -> tuple[list[ClaimedJob], KeyedBy | None]:
    """The jobs statement ``by`` leased, and :func:`keyed_instead`'s answer to it."""
    if by is KeyedBy.OPEN:
        opened = claims.keyed_open(room)
        return opened.jobs, keyed_instead(by, limited=opened.limited, rated=opened.rated)
    if by is KeyedBy.SLOTS:
        slots = claims.keyed_slots(room)
        # It ran because a limit was found: only a rate sends it on.
        return slots.jobs, keyed_instead(by, limited=True, rated=slots.rated)
    return claims.keyed(room), None
