"""What a handler sees of its job: identity, progress, checkpoints and a stop flag."""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any, Protocol

from leaseq.core.backoff import Backoff
from leaseq.core.errors import DatabaseUnavailable, LeaseqError
from leaseq.core.graph import Graph, Node, Parent
from leaseq.core.models import After, ClaimedJob, Lease, ParentResult
from leaseq.runtime.latch import Latch


class PermanentError(Exception):
    """Raise from a handler when retrying cannot help (bad input): the job goes to ``dead`` at
    once with this message as its last error."""


class Interrupted(Exception):
    """Raise from a handler to hand the job back without spending an attempt, e.g. after
    saving a checkpoint when :attr:`JobContext.draining` is set. If the worker has already
    given the job up (``should_stop``), nothing more is reported."""


class BackOff(Interrupted):
    """Raise from a handler when the service it calls says to back off (HTTP 429,
    Retry-After): the job is handed back without spending an attempt, to run no sooner than
    ``seconds`` from now, and its flow-control key (if it has one) is paused until then, so no
    worker starts another job of that key meanwhile."""

    def __init__(self, seconds: float, reason: str = "told to back off") -> None:
        super().__init__(f"{reason} for {seconds:g}s")
        self.seconds = float(seconds)
        self.reason = reason


class StopReason(enum.Enum):
    """Why a handler should stop; after any of these its result is not reported."""

    #: The lease is gone (expired while the worker could not renew it, or taken over).
    LEASE_LOST = "lease_lost"
    #: Someone ran ``leaseq cancel`` on the job.
    CANCELLED = "cancelled"
    #: The worker's drain window ended and the job was released to another worker.
    DRAINING = "draining"
    #: The job reached its maximum runtime (``timeout``) and was failed as timed out.
    TIMED_OUT = "timed_out"
    #: The job type's progress timeout passed without a ``progress()`` call.
    NO_PROGRESS = "no_progress"


class Checkpoints(Protocol):
    """Where :meth:`JobContext.checkpoint` stores state: the :class:`leaseq.Queue` in the
    worker process; in a child process (``--isolation process``), the supervisor, which
    makes the same fenced call."""

    def checkpoint(self, lease: Lease, state: Any) -> bool: ...


class JobContext:
    """Handed to a handler with its payload. Thread-safe; one per attempt."""

    def __init__(
        self, job: ClaimedJob, queue: Checkpoints, worker_id: str, draining: threading.Event
    ) -> None:
        self._job = job
        self._queue = queue
        self._draining = draining
        self._stop = Latch()
        self._lock = threading.Lock()
        self._reason: StopReason | None = None
        self._progress: Any = None
        self._progress_version = 0
        self._progress_at = time.monotonic()
        self._spawned: Graph | None = None
        self.worker_id = worker_id
        self._log: logging.LoggerAdapter[logging.Logger] | None = None

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """The handler's logger (``leaseq.job.<job type>``), every line with the attempt's
        fields. Made on first use: most handlers never log, and it costs a lookup per job."""
        if self._log is None:
            job = self._job
            self._log = logging.LoggerAdapter(
                logging.getLogger(f"leaseq.job.{job.job_type}"),
                {
                    "job_id": job.id,
                    "queue": job.queue,
                    "job_type": job.job_type,
                    "worker": self.worker_id,
                    "attempt": job.attempt,
                    "token": job.lease.token,
                },
            )
        return self._log

    # -- identity ---------------------------------------------------------------------

    @property
    def job_id(self) -> int:
        return self._job.id

    @property
    def queue(self) -> str:
        return self._job.queue

    @property
    def job_type(self) -> str:
        return self._job.job_type

    @property
    def payload(self) -> Any:
        return self._job.payload

    @property
    def attempt(self) -> int:
        """1 for the first attempt; a released attempt is not counted."""
        return self._job.attempt

    @property
    def max_attempts(self) -> int:
        return self._job.max_attempts

    @property
    def lease_token(self) -> int:
        return self._job.lease.token

    @property
    def effect_key(self) -> str:
        """The job's effect key, derived from the work and the same on every attempt: the
        enqueuer's idempotency key (completion writes the effect row under it), else
        ``job:<id>`` (no effect row; the job's result stays in its own row). Use it for your
        own external writes so a repeat execution is a no-op there too."""
        return self._job.effect_key

    @property
    def last_checkpoint(self) -> Any:
        """What an earlier attempt saved with :meth:`checkpoint` (None on a fresh job)."""
        return self._job.checkpoint

    # -- reporting --------------------------------------------------------------------

    def progress(self, value: Any) -> None:
        """Record progress (any JSON value). It is stored with the next lease renewal, and it
        resets the job type's progress timeout. Cheap: call it as often as you like."""
        with self._lock:
            self._progress = value
            self._progress_version += 1
            self._progress_at = time.monotonic()

    def checkpoint(self, state: Any) -> bool:
        """Durably save ``state`` for the next attempt (:attr:`last_checkpoint`), now. Returns
        False, and sets :attr:`should_stop`, when the lease is no longer held. While
        PostgreSQL is unreachable it waits and retries (never raising into the handler) until
        the worker gives the attempt up."""
        retry = Backoff(0.05, 1.0)
        while True:
            try:
                stored = self._queue.checkpoint(self._job.lease, state)
                break
            except DatabaseUnavailable as exc:
                # An infrastructure fault must not fail the attempt: wait for the database
                # while the lease may hold; the heartbeat loop sets the stop flag when it ends.
                self.log.warning("checkpoint not stored yet (%s); retrying", exc)
                if self._stop.wait(retry.next()):
                    return False
        if not stored:
            self.request_stop(StopReason.LEASE_LOST)
        return stored

    # -- pipelines --------------------------------------------------------------------

    def spawn(
        self,
        queue: str,
        job_type: str,
        payload: Any = None,
        *,
        key: str | None = None,
        after: Iterable[Parent] = (),
        when: After = After.SUCCEEDED,
        priority: int = 100,
        run_at: datetime | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> Node:
        """Add a job to this attempt's fan-out (``after``: nodes spawned here, their keys, or
        existing job ids, as in :meth:`leaseq.Graph.add`). Nothing is written now: the jobs
        are inserted in the same transaction as this job's completion, only if it applies, so
        a crash can neither lose nor double them and a stale (fenced) completion adds none.
        An attempt that fails or is retried spawns nothing; the next attempt spawns anew."""
        with self._lock:
            if self._spawned is None:
                self._spawned = Graph(f"{self.job_type} {self.job_id}")
            graph = self._spawned
        return graph.add(
            queue,
            job_type,
            payload,
            key=key,
            after=after,
            when=when,
            priority=priority,
            run_at=run_at,
            delay=delay,
            max_attempts=max_attempts,
            timeout=timeout,
            idempotency_key=idempotency_key,
        )

    def add_graph(self, graph: Graph) -> None:
        """Add a whole :class:`leaseq.Graph` to this attempt's fan-out (as :meth:`spawn`
        does one job; keys must not collide with jobs spawned already)."""
        with self._lock:
            if self._spawned is None:
                self._spawned = Graph(f"{self.job_type} {self.job_id}")
            self._spawned.include(graph)

    def spawned(self) -> Graph | None:
        """What :meth:`spawn` collected (None: nothing), for the worker runtime."""
        with self._lock:
            return self._spawned

    def parent_results(self, *, page: int = 1000) -> Iterator[ParentResult]:
        """This job's parents with their status and result, read from the database in keyset
        pages of ``page`` (each page its own short statement; none is held open while you
        iterate), in parent id order: a 10,000-wide fan-in is never loaded at once, nor copied
        into the payload."""
        reader = getattr(self._queue, "iter_parent_results", None)
        if reader is None:
            raise LeaseqError("parent_results() needs the worker's queue")
        results: Iterator[ParentResult] = reader(self.job_id, page=page)
        return results

    def parent_results_page(self, *, after_id: int, limit: int) -> list[ParentResult]:
        """One keyset page of :meth:`parent_results` (for a supervisor answering its child:
        under ``--isolation process`` each page is read by the supervisor's queue)."""
        reader = getattr(self._queue, "parent_results", None)
        if reader is None:
            raise LeaseqError("parent_results() needs the worker's queue")
        rows: list[ParentResult] = reader(self.job_id, after_id=after_id, limit=limit)
        return rows

    # -- stopping ---------------------------------------------------------------------

    @property
    def should_stop(self) -> bool:
        """True once the worker gave this attempt up (see :attr:`stop_reason`): stop working;
        whatever the handler returns afterwards is not reported."""
        return self._stop.is_set()

    @property
    def stop_reason(self) -> StopReason | None:
        return self._reason

    @property
    def draining(self) -> bool:
        """True once the worker is shutting down: finish soon, or checkpoint and raise
        :class:`Interrupted`; at the end of the drain window the job is released."""
        return self._draining.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking early when the handler should stop; returns
        :attr:`should_stop`. Use it instead of ``time.sleep`` in handlers."""
        return self._stop.wait(seconds)

    def raise_if_stopped(self) -> None:
        """Raise :class:`Interrupted` if the handler should stop."""
        if self._stop.is_set():
            raise Interrupted(f"stopped: {self._reason.value if self._reason else '?'}")

    # -- for the worker runtime -------------------------------------------------------

    def request_stop(self, reason: StopReason) -> None:
        """Set the stop flag with ``reason`` (the first reason wins)."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._stop.set()

    def pending_progress(self) -> tuple[Any, int]:
        """The latest progress value and its version, for the heartbeat to send."""
        with self._lock:
            return self._progress, self._progress_version

    def seconds_since_progress(self) -> float:
        """Seconds since the last progress call (or since the attempt started)."""
        with self._lock:
            return time.monotonic() - self._progress_at
