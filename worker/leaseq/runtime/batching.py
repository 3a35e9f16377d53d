"""Micro-batching: attempts of a batch job type wait (briefly) for company, then run as one
unit on one slot.

:class:`Batching` wraps the slots' executor. Attempts of ordinary job types pass straight
through; attempts of a batch type (``@registry.batch(name, max_batch=, max_wait=)``) join
their type's open batch, which is submitted as one unit when it holds ``max_batch``
attempts or ``max_wait`` seconds after it opened, whichever comes first. Every claim that
fills a batch is its own autocommit statement, made before the handler starts, so no
transaction is open while the model runs. Each attempt keeps its own lease, token and
heartbeat; the batch is reported as one unit, so its successes complete in one
``complete_many`` (each lease fenced on its own).

Capacity (what the dispatcher may hold): one per slot, where a batch, open or running,
takes one slot whatever its size. So an open batch lets the worker claim up to
``max_batch - 1`` more jobs to fill it, which it does at once (a batch fills from a
backlog in a second claim, not one job per ``max_wait``), and without batch work a worker
claims exactly as without batching. Jobs of other types claimed while a batch fills wait
for a slot under their renewed lease: serve batch types from a queue of their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from leaseq.runtime.executor import Executor, HandlerOutcome, OnDone
from leaseq.runtime.inflight import InFlight
from leaseq.runtime.registry import Registry


@dataclass(eq=False)
class _Batch:
    """A batch: open (taking attempts until ``deadline``) or submitted (until reported)."""

    job_type: str
    max_batch: int
    deadline: float
    attempts: list[InFlight] = field(default_factory=list)
    open: bool = True

    def extra(self) -> int:
        """Capacity beyond its one slot: room to fill while open, its other jobs after."""
        return self.max_batch - 1 if self.open else max(len(self.attempts) - 1, 0)


class Batching(Executor):
    """Batches attempts of batch job types before the slots (``slots(on_done)``, built
    here so that reports pass through) run them."""

    def __init__(
        self, registry: Registry, on_done: OnDone, slots: Callable[[OnDone], Executor]
    ) -> None:
        self.inner = slots(self._reported)
        super().__init__(self.inner.capacity, on_done)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._open: dict[str, _Batch] = {}  # by job type
        self._batches: set[_Batch] = set()  # open, or submitted with attempts unreported
        self._of: dict[int, _Batch] = {}  # job id -> its batch
        self._closing = False
        self._thread = threading.Thread(target=self._flush_due, name="leaseq-batcher", daemon=True)

    @property
    def capacity(self) -> int:
        with self._lock:
            return self.inner.capacity + sum(b.extra() for b in self._batches)

    def start(self) -> None:
        self.inner.start()
        self._thread.start()

    def submit(self, attempt: InFlight) -> None:
        spec = attempt.job_type.batch if attempt.job_type else None
        if spec is None:
            self.inner.submit(attempt)
            return
        name = attempt.job.job_type
        unit: list[InFlight] = []
        with self._changed:
            batch = self._open.get(name)
            if batch is None:
                batch = _Batch(name, spec.max_batch, time.monotonic() + spec.max_wait)
                self._open[name] = batch
                self._batches.add(batch)
                self._changed.notify()
            batch.attempts.append(attempt)
            self._of[attempt.job.id] = batch
            if len(batch.attempts) >= batch.max_batch:
                unit = self._close_batch(batch)
        self._submit(unit)

    def submit_batch(self, attempts: list[InFlight]) -> None:
        self.inner.submit_batch(attempts)

    def _close_batch(self, batch: _Batch) -> list[InFlight]:
        """Stop ``batch`` taking attempts (lock held); the unit to submit (empty when every
        attempt was killed while it waited)."""
        batch.open = False
        del self._open[batch.job_type]
        if not batch.attempts:
            self._batches.discard(batch)
        return list(batch.attempts)

    def _submit(self, unit: list[InFlight]) -> None:
        if len(unit) == 1:
            self.inner.submit(unit[0])
        elif unit:
            self.inner.submit_batch(unit)

    def _flush_due(self) -> None:
        """Submit open batches when their ``max_wait`` is up (all of them when closing)."""
        while True:
            with self._changed:
                while not self._closing:
                    now = time.monotonic()
                    if any(b.deadline <= now for b in self._open.values()):
                        break
                    nearest = min((b.deadline for b in self._open.values()), default=None)
                    self._changed.wait(None if nearest is None else nearest - now)
                now = time.monotonic()
                due = [b for b in self._open.values() if self._closing or b.deadline <= now]
                units = [self._close_batch(batch) for batch in due]
                closing = self._closing
            for unit in units:
                self._submit(unit)
            if closing:
                return

    def _reported(self, attempts: list[InFlight], outcomes: list[HandlerOutcome]) -> None:
        """The slots reported a unit: its batch no longer holds capacity for these attempts
        (accounted before the worker is told, so the dispatcher never over-counts)."""
        with self._lock:
            for attempt in attempts:
                self._forget(attempt)
        self.on_done(attempts, outcomes)

    def _forget(self, attempt: InFlight) -> None:
        """``attempt`` no longer counts in its batch (lock held)."""
        batch = self._of.pop(attempt.job.id, None)
        if batch is None:
            return
        batch.attempts.remove(attempt)
        if not batch.open and not batch.attempts:
            self._batches.discard(batch)

    def kill(self, attempt: InFlight) -> bool:
        with self._lock:
            batch = self._of.get(attempt.job.id)
            if batch is not None and batch.open:
                # Not started: it simply never runs (and is never reported).
                self._forget(attempt)
                return True
        killed = self.inner.kill(attempt)
        if killed:
            with self._lock:
                self._forget(attempt)
        return killed

    def close(self, timeout: float) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify()
        if self._thread.ident is not None:  # not started when the worker stopped first
            self._thread.join(timeout)
        self.inner.close(timeout)
