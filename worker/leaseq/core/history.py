"""History: finished jobs leave the hot table for partitioned history, then the ledger.

``leaseq.jobs`` holds live jobs and recently finished ones. The leader's mover
(:mod:`leaseq.leader.history`) moves finished jobs older than the hot retention, with their
attempts, into ``leaseq.job_history`` and ``leaseq.job_attempt_history`` (partitioned by UTC
day of finishing, each day by retention in days), one statement per batch, and writes a
ledger row per job that outlives the history. Retention drops whole partitions. Every
method is one statement, or one short transaction bounded by a timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from leaseq.core import validation
from leaseq.core._store.store import Store
from leaseq.core.db import Db, borrow, transaction
from leaseq.core.errors import InvalidJob, JobNotFound
from leaseq.core.models import (
    FINISHED_STATUSES,
    AttemptRecord,
    ExpireStep,
    FinishedCount,
    JobStatus,
    JobWhereabouts,
    Moved,
    RetentionRule,
)

#: The rule that applies to every queue without one of its own.
EVERY_QUEUE = "*"


@dataclass(frozen=True)
class MoverState:
    """The mover's shared state: the batch size it reached, and the ledger's retention."""

    batch: int
    ledger_keep_days: int


@dataclass(frozen=True)
class Waiting:
    """Finished jobs in the hot table, and how many are older than the hot retention."""

    finished: int
    due: int


def _finished(status: str) -> JobStatus:
    if status not in FINISHED_STATUSES:
        raise InvalidJob(
            "status", f"{status!r} is not a final state {tuple(map(str, FINISHED_STATUSES))}"
        )
    return JobStatus(status)


class History:
    """The history of one database, over one connection or a pool."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._store = Store()

    # -- the leader's duties ------------------------------------------------------------

    def ensure_partitions(
        self, *, ahead: int, timeout: float, now: datetime | None = None
    ) -> list[str]:
        """Create the missing day partitions (and retention leaves) the mover may write
        into, up to ``ahead`` days after now; returns the names created. Bounded by
        ``timeout`` seconds (a CREATE waits for a brief lock on the parent)."""
        validation.at_least("ahead", ahead, 1)
        with transaction(self._db, "create partitions") as c:
            self._store.leader_pass_bounds(c, seconds=timeout)
            return self._store.history_ensure_partitions(c, ahead=ahead, now=now)

    def move(
        self, *, hot_retention: float, batch: int, timeout: float, now: datetime | None = None
    ) -> Moved:
        """Move at most ``batch`` jobs finished more than ``hot_retention`` seconds ago out of
        the hot table: their rows and attempts into history (or, already past retention,
        only into the ledger), a ledger row each, the hourly counts. One statement under a
        ``timeout``-second bound: all of it happens or none (StatementTimeout). Concurrent
        movers skip each other's rows, so each job moves exactly once."""
        validation.non_negative("hot_retention", hot_retention)
        validation.at_least("batch", batch, 1)
        with transaction(self._db, "move history") as c:
            self._store.leader_pass_bounds(c, seconds=timeout)
            return self._store.history_move(c, hot_retention=hot_retention, batch=batch, now=now)

    def mover_state(self) -> MoverState:
        with borrow(self._db, "read mover state") as c:
            row = self._store.history_mover_state(c)
        return MoverState(batch=int(row["batch"]), ledger_keep_days=int(row["ledger_keep_days"]))

    def record_batch(self, *, batch: int, timed_out: bool) -> None:
        """Store the batch size the next mover (this one or a new leader) starts from (the
        jobs moved are counted by :meth:`move` itself)."""
        with borrow(self._db, "record mover state") as c:
            self._store.history_mover_record(c, batch=batch, timeouts=int(timed_out))

    def expire_step(
        self, *, batch: int, timeout: float, now: datetime | None = None
    ) -> ExpireStep | None:
        """One short transaction of retention: up to ``batch`` effects of the oldest expired
        history leaf deleted, and the leaf dropped once none is left; None when nothing has
        expired."""
        validation.at_least("batch", batch, 1)
        with transaction(self._db, "expire history") as c:
            self._store.leader_pass_bounds(c, seconds=timeout)
            return self._store.history_expire_step(c, batch=batch, now=now)

    def expire_ledger(self, *, batch: int, timeout: float, now: datetime | None = None) -> int:
        """Delete one batch of ledger rows (and hourly counts) past the ledger's retention."""
        with transaction(self._db, "expire ledger") as c:
            self._store.leader_pass_bounds(c, seconds=timeout)
            return self._store.history_ledger_expire(c, batch=batch, now=now)

    # -- retention rules ----------------------------------------------------------------

    def retention(self) -> list[RetentionRule]:
        """Every rule, the ``*`` ones (every queue) first."""
        with borrow(self._db, "read retention") as c:
            return self._store.history_retention_list(c)

    def set_retention(self, status: str, keep_days: int, *, queue: str = EVERY_QUEUE) -> None:
        """Keep moved jobs of ``queue`` (default every queue) in ``status`` for ``keep_days``
        days of history. Applies to jobs moved from now on; no longer than the ledger."""
        validation.at_least("keep_days", keep_days, 1)
        if queue != EVERY_QUEUE:
            validation.queue_name(queue)
        ledger = self.mover_state().ledger_keep_days
        if keep_days > ledger:
            raise InvalidJob(
                "keep_days",
                f"{keep_days} days is longer than the ledger's retention ({ledger} days): "
                "raise the ledger's first, so every job in history keeps its ledger row",
            )
        with borrow(self._db, "set retention") as c:
            self._store.history_retention_set(
                c, queue=queue, status=_finished(status), keep_days=keep_days
            )

    def unset_retention(self, status: str, *, queue: str) -> bool:
        """Remove ``queue``'s own rule for ``status`` (it then follows ``*``); False if none."""
        if queue == EVERY_QUEUE:
            raise InvalidJob("queue", "the '*' rules cannot be removed, only changed")
        with borrow(self._db, "unset retention") as c:
            return self._store.history_retention_unset(c, queue=queue, status=_finished(status))

    def set_ledger_retention(self, keep_days: int) -> None:
        """Keep ledger rows (and hourly counts) ``keep_days`` days after their job finished;
        never shorter than the longest history retention."""
        validation.at_least("keep_days", keep_days, 1)
        longest = max((r.keep_days for r in self.retention()), default=0)
        if keep_days < longest:
            raise InvalidJob(
                "keep_days",
                f"the ledger must outlive the history: {keep_days} days is shorter than the "
                f"longest history retention ({longest} days)",
            )
        with borrow(self._db, "set ledger retention") as c:
            self._store.history_ledger_retention_set(c, keep_days=keep_days)

    # -- reading ------------------------------------------------------------------------

    def counts(
        self, *, since: float, queue: str | None = None, now: datetime | None = None
    ) -> list[FinishedCount]:
        """Finished jobs per queue and final state in the last ``since`` seconds (to the hour
        for moved jobs), from the mover's hourly rollup and the hot table: never a scan of
        the history."""
        validation.positive("since", since)
        with borrow(self._db, "count history") as c:
            return self._store.history_counts(c, since=since, queue=queue, now=now)

    def waiting(self, *, hot_retention: float) -> Waiting:
        with borrow(self._db, "count finished jobs") as c:
            row = self._store.history_waiting(c, hot_retention=hot_retention)
        return Waiting(finished=int(row["finished"]), due=int(row["due"]))

    def whereabouts(self, job_id: int) -> tuple[JobWhereabouts, Sequence[AttemptRecord]]:
        """The job wherever it is (hot table, history or ledger) and its recorded attempts
        (none once only the ledger remains). JobNotFound when no place knows it."""
        with borrow(self._db, "show job") as c:
            found = self._store.job_whereabouts(c, job_id)
            if found is None:
                raise JobNotFound(job_id)
            return found, self._store.job_attempts_anywhere(c, job_id)
