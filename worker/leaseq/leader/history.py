"""The history duties of the leader: move finished jobs out of the hot table, drop expired
history partitions, expire the ledger.

They run after each reap pass, in the replica that holds the reaper lease (the operator's
leader or ``leaseq reaper``), each on its own: a failure of one is logged, counted in
``leaseq_history_duty_failures{outcome=<duty>}`` and never stops the reap pass or the other
duties. Their correctness does not depend on the lease: every batch is one atomic statement
(``SKIP LOCKED`` keeps two movers off each other's rows, and a SIGKILL mid-batch rolls the
whole batch back), and a retention step is one short transaction.

The mover's batch size adapts: a batch that hits its statement timeout is rolled back and
the size halved (down to :data:`MIN_BATCH`); each full batch that succeeds doubles it back
(up to :data:`MAX_BATCH`). The size lives in ``leaseq.history_mover``, so a new leader starts
where the last one was, and never stays small for good.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge

from leaseq.core.errors import LeaseqError, StatementTimeout
from leaseq.core.history import History

log = logging.getLogger("leaseq.leader.history")

MIN_BATCH = 10
MAX_BATCH = 5000
#: Batches one pass may move before handing the thread back to the reaper.
BATCHES_PER_PASS = 20
#: Day partitions created ahead of today.
PARTITIONS_AHEAD = 3
#: Effects deleted per retention step, and steps per pass.
EXPIRE_BATCH = 10000
EXPIRE_STEPS_PER_PASS = 20
LEDGER_BATCH = 10000
DUTIES = ("partitions", "move", "retention", "ledger")


@dataclass
class HistoryMetrics:
    """The duties' series: jobs moved, batch timeouts, the batch size, failures per duty."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.moved = Counter(
            "leaseq_history_moved", "Jobs moved out of the hot table", registry=self.registry
        )
        self.timeouts = Counter(
            "leaseq_history_move_timeouts",
            "Mover batches rolled back by their statement timeout (the batch size was halved)",
            registry=self.registry,
        )
        self.batch = Gauge(
            "leaseq_history_move_batch", "The mover's current batch size", registry=self.registry
        )
        self.dropped = Counter(
            "leaseq_history_partitions_dropped",
            "History partitions dropped by retention",
            registry=self.registry,
        )
        self.failures = Counter(
            "leaseq_history_duty_failures",
            "History duty passes that failed, by duty (outcome)",
            ["outcome"],
            registry=self.registry,
        )
        for duty in DUTIES:
            self.failures.labels(duty)


@dataclass
class HistoryDuty:
    """The leader's history duties; :meth:`run` does one pass of each, each guarded."""

    history: History
    #: Seconds a finished job stays in the hot table.
    hot_retention: float
    #: Seconds one statement (a batch, a step) may take before it is rolled back.
    timeout: float
    #: Seconds of batches one pass may start (the last one started may run ``timeout`` more):
    #: the pass must end well within the leader lease it runs under.
    budget: float
    metrics: HistoryMetrics = field(default_factory=HistoryMetrics)
    clock: Callable[[], float] = time.monotonic
    #: Outside a pass (a direct call) there is no budget.
    _deadline: float = field(default=float("inf"), init=False)

    @classmethod
    def for_lease(
        cls,
        history: History,
        hot_retention: float,
        lease_ttl: float,
        metrics: HistoryMetrics | None = None,
    ) -> HistoryDuty:
        """Duties bounded by the leader lease's length: each statement by a sixth of it, each
        pass to a quarter plus one statement, so a pass never outlives the lease."""
        return cls(
            history,
            hot_retention,
            timeout=lease_ttl / 6,
            budget=lease_ttl / 4,
            metrics=metrics or HistoryMetrics(),
        )

    def _more(self) -> bool:
        return self.clock() < self._deadline

    def run(self, now: datetime | None = None) -> None:
        """One pass: partitions, retention, the ledger, then moving (the one with a backlog,
        last, so it never starves the others). Never raises."""
        self._deadline = self.clock() + self.budget
        try:
            self._run(now)
        finally:
            self._deadline = float("inf")

    def _run(self, now: datetime | None) -> None:
        for duty, step in (
            ("partitions", self.partitions),
            ("retention", self.retention),
            ("ledger", self.ledger),
            ("move", self.move),
        ):
            if duty != "partitions" and not self._more():
                break
            try:
                step(now)
            except LeaseqError as exc:
                self.metrics.failures.labels(duty).inc()
                log.warning("history duty %s failed: %s", duty, exc, extra={"duty": duty})
            except Exception:
                self.metrics.failures.labels(duty).inc()
                log.exception("history duty %s failed unexpectedly", duty, extra={"duty": duty})

    def partitions(self, now: datetime | None = None) -> list[str]:
        created = self.history.ensure_partitions(
            ahead=PARTITIONS_AHEAD, timeout=self.timeout, now=now
        )
        if created:
            log.info("created %d history partitions", len(created), extra={"first": created[0]})
        return created

    def move(self, now: datetime | None = None) -> int:
        """Move batches until one is short, one times out, :data:`BATCHES_PER_PASS` or the
        pass's budget."""
        batch = min(MAX_BATCH, max(MIN_BATCH, self.history.mover_state().batch))
        total = 0
        for _ in range(BATCHES_PER_PASS):
            if total and not self._more():
                break
            try:
                moved = self.history.move(
                    hot_retention=self.hot_retention, batch=batch, timeout=self.timeout, now=now
                )
            except StatementTimeout as exc:
                smaller = max(MIN_BATCH, batch // 2)
                self.history.record_batch(batch=smaller, timed_out=True)
                self.metrics.timeouts.inc()
                self.metrics.batch.set(smaller)
                log.warning(
                    "history batch of %d timed out (%s); next batch %d", batch, exc, smaller
                )
                break
            full = moved.moved == batch
            grown = min(MAX_BATCH, batch * 2) if full else batch
            if grown != batch:
                self.history.record_batch(batch=grown, timed_out=False)
            self.metrics.moved.inc(moved.moved)
            self.metrics.batch.set(grown)
            total += moved.moved
            batch = grown
            if not full:
                break
        if total:
            log.info("moved %d finished jobs to history", total)
        return total

    def retention(self, now: datetime | None = None) -> list[str]:
        """Drop expired history leaves (their effects first); returns the dropped names."""
        dropped: list[str] = []
        for _ in range(EXPIRE_STEPS_PER_PASS):
            if dropped and not self._more():
                break
            step = self.history.expire_step(batch=EXPIRE_BATCH, timeout=self.timeout, now=now)
            if step is None:
                break
            if step.dropped:
                dropped.append(step.leaf)
                self.metrics.dropped.inc()
                log.info("dropped history partition %s", step.leaf, extra={"effects": step.effects})
        return dropped

    def ledger(self, now: datetime | None = None) -> int:
        deleted = self.history.expire_ledger(batch=LEDGER_BATCH, timeout=self.timeout, now=now)
        if deleted:
            log.info("expired %d ledger rows", deleted)
        return deleted
