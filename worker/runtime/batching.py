"""Micro-batching: attempts of a batch job type wait (briefly) for company, then run as one
unit on one slot.

:class:`Batching` wraps an executor. Attempts of ordinary job types pass straight through;
attempts of a batch type (``@registry.batch(name, max_batch=, max_wait=)``) join their
type's open batch, which is submitted as one unit when it holds ``max_batch`` attempts or
``max_wait`` seconds after it opened, whichever comes first. Every claim that fills a batch
is its own autocommit statement, made before the handler starts, so no transaction is open
while the model runs. Each attempt keeps its own lease, token and heartbeat; results are
settled per attempt (successes grouped into one ``complete_many`` by the completions loop,
each lease fenced on its own).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from leaseq.runtime.context import StopReason
from leaseq.runtime.executor import Executor
from leaseq.runtime.inflight import InFlight
from leaseq.runtime.registry import Registry


@dataclass
class _Open:
    """A batch still taking attempts."""

    deadline: float
    attempts: list[InFlight] = field(default_factory=list)


class Batching(Executor):
    """An executor that batches attempts of batch job types before ``inner`` runs them.
    Its capacity is ``inner``'s slots times the largest ``max_batch``, so a slot's worth of
    claims can fill a whole batch."""

    def __init__(self, inner: Executor, registry: Registry) -> None:
        super().__init__(inner.capacity * registry.largest_batch, inner.on_done)
        self.inner = inner
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._open: dict[str, _Open] = {}
        self._closing = False
        self._thread = threading.Thread(target=self._flush_due, name="leaseq-batcher", daemon=True)

    def start(self) -> None:
        self.inner.start()
        self._thread.start()

    def submit(self, attempt: InFlight) -> None:
        spec = attempt.job_type.batch if attempt.job_type else None
        if spec is None:
            self.inner.submit(attempt)
            return
        name = attempt.job.job_type
        with self._changed:
            batch = self._open.get(name)
            if batch is None:
                batch = self._open[name] = _Open(time.monotonic() + spec.max_wait)
                self._changed.notify()
            batch.attempts.append(attempt)
            full = len(batch.attempts) >= spec.max_batch
            if full:
                del self._open[name]
        if full:
            self._submit(batch.attempts)

    def submit_batch(self, attempts: list[InFlight]) -> None:
        self.inner.submit_batch(attempts)

    def _submit(self, attempts: list[InFlight]) -> None:
        if len(attempts) == 1:
            self.inner.submit(attempts[0])
        elif attempts:  # empty when every attempt was killed while it waited
            self.inner.submit_batch(attempts)

    def _flush_due(self) -> None:
        while True:
            with self._changed:
                while not self._closing:
                    now = time.monotonic()
                    due = [n for n, b in self._open.items() if b.deadline <= now]
                    if due:
                        break
                    nearest = min((b.deadline for b in self._open.values()), default=None)
                    self._changed.wait(None if nearest is None else nearest - now)
                due = list(self._open) if self._closing else due
                batches = [self._open.pop(name).attempts for name in due]
                closing = self._closing
            for attempts in batches:
                self._submit(attempts)
            if closing:
                return

    def stop(self, attempt: InFlight, reason: StopReason) -> None:
        self.inner.stop(attempt, reason)

    def kill(self, attempt: InFlight) -> bool:
        with self._lock:
            for batch in self._open.values():
                if attempt in batch.attempts:
                    # Not started yet: it simply never runs (and is never reported).
                    batch.attempts.remove(attempt)
                    return True
        return self.inner.kill(attempt)

    def close(self, timeout: float) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join(timeout)
        self.inner.close(timeout)
