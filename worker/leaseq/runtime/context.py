"""What a handler sees of its job: identity, progress, checkpoints, durable steps and a stop
flag."""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NoReturn, Protocol, TypeVar

from leaseq.core import tracing, validation
from leaseq.core.backoff import Backoff
from leaseq.core.errors import DatabaseUnavailable, LeaseqError, WaitTimedOut
from leaseq.core.graph import INHERIT, FlowKey, Graph, Node, Parent
from leaseq.core.models import After, ClaimedJob, Lease, ParentResult

# Re-exported: handlers and the runtime import them from here.
from leaseq.runtime.handler_errors import BackOff as BackOff
from leaseq.runtime.handler_errors import Interrupted as Interrupted
from leaseq.runtime.handler_errors import PermanentError as PermanentError
from leaseq.runtime.handler_errors import Sleeping as Sleeping
from leaseq.runtime.handler_errors import Suspended as Suspended
from leaseq.runtime.handler_errors import Waiting as Waiting
from leaseq.runtime.latch import Latch
from leaseq.runtime.step_gate import StepGate
from leaseq.runtime.steps import Intent, StepOp, Steps, StepStore, dispatch, step_key

T = TypeVar("T")


class StopReason(enum.Enum):
    """Why a handler should stop; after any of these its result is not reported."""

    #: The lease is gone (expired while the worker could not renew it, or taken over).
    LEASE_LOST = "lease_lost"
    #: The job was cancelled: ``leaseq cancel`` on it or on an ancestor, or its pipeline's.
    CANCELLED = "cancelled"
    #: The worker's drain window ended and the job was released to another worker.
    DRAINING = "draining"
    #: The job reached its maximum runtime (``timeout``) and was failed as timed out.
    TIMED_OUT = "timed_out"
    #: The job type's progress timeout passed without a ``progress()`` call.
    NO_PROGRESS = "no_progress"


class Checkpoints(StepStore, Protocol):
    """Where :meth:`JobContext.checkpoint` stores state and :meth:`JobContext.step` its steps:
    the :class:`leaseq.Queue` in the worker process; in a child process (``--isolation
    process``), the supervisor, which makes the same fenced calls."""

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
        # Called once the attempt is given up: cancels an async handler's coroutine.
        self._on_stop: list[Callable[[], object]] = []
        self._progress: Any = None
        self._progress_version = 0
        self._progress_at = time.monotonic()
        self._made_at = self._progress_at
        self._sleeps = 0
        self._waits = 0
        # The first sleep or wait the handler asked for: it ends the attempt, whatever the
        # handler does after catching it.
        self._suspension: Suspended | None = None
        self._spawned: Graph | None = None
        self._steps: Steps | None = None
        self._gate = StepGate()
        self._emitting = threading.Lock()
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
        stored = self._patiently(
            "checkpoint", lambda: self._queue.checkpoint(self._job.lease, state)
        )
        if not stored:
            self.request_stop(StopReason.LEASE_LOST)
        return bool(stored)

    async def checkpoint_async(self, state: Any) -> bool:
        """:meth:`checkpoint` for an ``async def`` handler, made on a thread of the loop's
        executor (as :meth:`step_async` makes its records): a statement that waits holds up
        no other job on the loop."""
        return await asyncio.to_thread(self.checkpoint, state)

    def _patiently(self, what: str, call: Callable[[], T]) -> T | None:
        """``call()``, waiting out an unreachable PostgreSQL; None once the worker gives the
        attempt up meanwhile. After the handler asked to sleep or wait it makes no call: it
        raises that sleep or wait again, which ends the attempt."""
        if self._suspension is not None:
            raise self._suspension
        retry = Backoff(0.05, 1.0)
        while True:
            try:
                return call()
            except DatabaseUnavailable as exc:
                # An infrastructure fault must not fail the attempt: wait for the database
                # while the lease may hold; the heartbeat loop sets the stop flag when it ends.
                self.log.warning("%s not stored yet (%s); retrying", what, exc)
                if self._stop.wait(retry.next()):
                    return None

    # -- durable steps ----------------------------------------------------------------

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        reconcile: Callable[[Intent], Any] | None = None,
        idempotent: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as the job's step ``name``, once: its JSON result is
        recorded, and every later attempt of the job gets the recorded result back without
        calling ``fn``. Names are unique per job (a repeated name in one attempt raises
        :class:`leaseq.runtime.steps.StepNameReused`, which fails the job at once); name a
        loop's steps apart (``f"page-{i}"``).

        Before ``fn`` runs its intent is committed. An attempt that finds an intent without a
        result (an earlier one died in the step) calls ``reconcile(intent)``, which returns
        the step's result (recorded) or raises :class:`leaseq.NotDone` (``fn`` runs again);
        or, with ``idempotent=True``, runs ``fn`` again (it passes :attr:`step_key` to the
        destination, which dedupes); with neither, raises :class:`leaseq.StepUncertain`: the
        job is held (unfinished) until ``leaseq steps resolve`` settles the step. If ``fn``
        raises, the intent is withdrawn (the step did not happen) and the exception goes on.
        When the lease is lost nothing is recorded and :class:`Interrupted` is raised."""
        call = partial(fn, *args, **kwargs)
        return self._step_runner().run(name, call, reconcile, idempotent)

    async def step_async(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        reconcile: Callable[[Intent], Any] | None = None,
        idempotent: bool = False,
        **kwargs: Any,
    ) -> Any:
        """:meth:`step` for an ``async def`` handler: ``fn`` and ``reconcile`` may be
        ``async def`` functions (or return awaitables), which are awaited here. The step is
        recorded as :meth:`step` records it, its intent committed before ``fn`` runs; each
        record is one short statement, made on a thread of the loop's executor, so one that
        waits holds up no other job on the loop."""
        call = partial(fn, *args, **kwargs)
        return await self._step_runner().run_async(name, call, reconcile, idempotent)

    def _step_runner(self) -> Steps:
        if self._steps is None:
            self._steps = Steps(self._job.id, self.step_call, self._step_lease_lost)
        return self._steps

    def sleep(self, seconds: float, *, name: str | None = None) -> None:
        """Sleep durably for ``seconds`` (finite, at most 3650 days): see :meth:`sleep_until`,
        the wake time being ``seconds`` after the first attempt that reached this call."""
        validation.within_horizon("seconds", seconds)
        self.sleep_until(self._database_now() + timedelta(seconds=seconds), name=name)

    async def sleep_async(self, seconds: float, *, name: str | None = None) -> None:
        """:meth:`sleep` for an ``async def`` handler, its record made on a thread of the
        loop's executor: ``await ctx.sleep_async(60)``."""
        await asyncio.to_thread(self.sleep, seconds, name=name)

    def sleep_until(self, when: datetime, *, name: str | None = None) -> None:
        """Sleep durably until ``when`` (timezone-aware, database time, at most 3650 days
        away): the wake time is recorded once, as the step ``name`` (by default the n-th
        sleep of the handler: ``leaseq.sleep-<n>``), then the attempt ends by raising
        :class:`Sleeping`, which is not an ``Exception`` (``except Exception`` lets it
        through) and ends the attempt asleep even if the handler catches it. The job is
        handed back holding nothing (no lease, slot or unit of its key's limit) and without
        spending an attempt; at the wake time the handler runs again from the start, its
        finished steps returning their recorded results and this call returning at once.
        Not for batch handlers."""
        now = self._database_now()
        validation.wake_time("when", when, now)
        self._sleeps += 1
        recorded = self.step(name or f"leaseq.sleep-{self._sleeps}", when.isoformat)
        wake = datetime.fromisoformat(recorded)
        if wake > now:
            self._suspend(Sleeping(wake))

    async def sleep_until_async(self, when: datetime, *, name: str | None = None) -> None:
        """:meth:`sleep_until` for an ``async def`` handler, its record made on a thread of
        the loop's executor."""
        await asyncio.to_thread(self.sleep_until, when, name=name)

    def wait_for(self, name: str, *, timeout: float, step: str | None = None) -> Any:
        """The payload (JSON) of the signal ``name`` sent to this job (:meth:`leaseq.Queue.signal`,
        ``leaseq signal``, ``leaseq.signal(...)`` in SQL), waiting for it durably for at most
        ``timeout`` seconds (finite, at most 3650 days) from the first attempt that reached
        this call.

        A signal sent already (before the wait, too: it is kept) is returned at once and
        recorded as the step ``<step>.signal``, so every later attempt gets the same payload.
        Otherwise the deadline is recorded once, as the step ``step`` (by default the n-th
        wait of the handler: ``leaseq.wait-<n>``), and the attempt ends by raising
        :class:`Waiting`, which is not an ``Exception`` (``except Exception`` lets it
        through) and ends the attempt waiting even if the handler catches it: the job is
        handed back holding nothing (no lease, slot or unit of its key's limit), without
        spending an attempt, and shows what it waits for; it is claimable again as soon as
        the signal is sent, or at the deadline, when the handler runs again from the start.
        Run again after the deadline
        with no signal, this raises :class:`leaseq.WaitTimedOut` (the job goes to dead unless
        the handler catches it). Not for batch handlers."""
        validation.signal_name("name", name)
        validation.within_horizon("timeout", timeout)
        now = self._database_now()
        self._waits += 1
        base = step or f"leaseq.wait-{self._waits}"
        received = f"{base}.signal"
        record = self._step_runner().recorded(received)
        if record is not None:
            payload = record.result
        else:
            found = self.step_call(StepOp.SIGNAL, (name,))
            if found is None:
                self._step_lease_lost(f"lease lost: signal {name!r} could not be read")
                raise Interrupted(f"lease lost: signal {name!r} could not be read")
            there, payload = found
            if not there:
                deadline = self.step(base, (now + timedelta(seconds=timeout)).isoformat)
                until = datetime.fromisoformat(deadline)
                if until > now:
                    self._suspend(Waiting(name, until))
                raise WaitTimedOut(self.job_id, name, deadline)
        # Recorded once: every later attempt gets this payload back.
        return self.step(received, lambda: payload)

    async def wait_for_async(self, name: str, *, timeout: float, step: str | None = None) -> Any:
        """:meth:`wait_for` for an ``async def`` handler, its reads and records made on a
        thread of the loop's executor: ``await ctx.wait_for_async("approve", timeout=3600)``."""
        return await asyncio.to_thread(self.wait_for, name, timeout=timeout, step=step)

    def _suspend(self, how: Suspended) -> NoReturn:
        """End the attempt as the sleep or wait ``how``, the first one asked for winning."""
        with self._lock:
            if self._suspension is None:
                self._suspension = how
                _trace_suspension(how)
            first = self._suspension
        raise first

    @property
    def suspension(self) -> Suspended | None:
        """The sleep or wait the handler asked for (None: none), for the worker runtime: the
        attempt ends as it, even if the handler caught it and returned."""
        return self._suspension

    def _database_now(self) -> datetime:
        """The database's time now, near enough: the claim's (``clock_timestamp()`` when it
        was leased) plus the time since, so a worker's clock skew does not move a wake."""
        return self._job.lease.started_at + timedelta(seconds=time.monotonic() - self._made_at)

    @property
    def step_key(self) -> str:
        """The running step's stable key (the job id and the step's name), the same on every
        attempt: pass it to a destination that dedupes (payment APIs, object stores, model
        gateways). Read inside a step's function or ``reconcile`` check only."""
        current = self._steps.current if self._steps is not None else None
        if current is None:
            raise LeaseqError("ctx.step_key is read inside a step's function or check only")
        return step_key(self._job.id, current)

    def step_call(self, op: StepOp, args: tuple[Any, ...]) -> Any:
        """One step call for this attempt on its store (a supervisor answers its child's with
        it); None once the worker gave the attempt up while PostgreSQL was unreachable.

        A step is open (:mod:`leaseq.runtime.step_gate`) from its intent to its record or
        withdrawal. Once the worker's drain closed the gate, an intent is refused (False, as
        for a lost lease) and the attempt is told to stop as draining: the job is handed
        back between two steps, never during one."""
        opens = op is StepOp.INTEND
        ends = op in (StepOp.RECORD, StepOp.WITHDRAW)
        if opens and not self._gate.enter(args[0]):
            self.request_stop(StopReason.DRAINING)
            return False
        try:
            answer = self._patiently(
                f"step {op.value}", lambda: dispatch(self._queue, self._job.lease, op, args)
            )
        except BaseException:
            if opens or ends:
                self._gate.leave()
            raise
        if ends or (opens and not answer):
            self._gate.leave()
        return answer

    def close_steps(self) -> bool:
        """Let no step of this attempt start from now on; True while one is still open (its
        function may be writing its effect), False once none is (the job may be handed
        back)."""
        return self._gate.close() is not None

    def emit(self, value: Any) -> int:
        """Append ``value`` (JSON, at most 64 KiB; not None) to the job's stream, now, for
        producers reading it with :meth:`leaseq.Queue.stream`: its offset. For progress and
        partial results of a long job, not per-token output: a stream holds at most 10,000
        items, and each is a commit. Fenced like a step: when the lease is lost nothing is
        written and :class:`Interrupted` is raised."""
        with self._emitting:  # offsets are taken in order, one append at a time
            offset = self.step_call(StepOp.EMIT, (value,))
        if offset is None:
            self._step_lease_lost("lease lost: stream item not written")
            raise Interrupted("lease lost: stream item not written")
        tracing.event("leaseq.stream.item", {"leaseq.stream.offset": int(offset)})
        return int(offset)

    async def emit_async(self, value: Any) -> int:
        """:meth:`emit` for an ``async def`` handler, the append made on a thread of the
        loop's executor: ``await ctx.emit_async({"page": 3})``."""
        return await asyncio.to_thread(self.emit, value)

    def _step_lease_lost(self, message: str) -> None:
        if self._reason is StopReason.DRAINING:
            # The drain refused the step, or handed the job back: nothing went wrong.
            return
        self.log.warning("%s", message)
        self.request_stop(StopReason.LEASE_LOST)

    # -- pipelines --------------------------------------------------------------------

    def spawn(
        self,
        queue: str,
        job_type: str,
        payload: Any = None,
        *,
        name: str | None = None,
        key: FlowKey = INHERIT,
        after: Iterable[Parent] = (),
        when: After = After.SUCCEEDED,
        priority: int = 100,
        run_at: datetime | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> Node:
        """Add a job to this attempt's fan-out (``name`` names it among the jobs spawned
        here; ``after``: nodes spawned here, their names, or existing job ids, as in
        :meth:`leaseq.Graph.add`). ``key`` is its flow-control key: by default this job's own
        (so a tenant's limit holds across its fan-out), another key, or None for none.
        Nothing is written now: the jobs are inserted in the same transaction as this job's
        completion, only if it applies, so a crash can neither lose nor double them and a
        stale (fenced) completion adds none. An attempt that fails or is retried spawns
        nothing; the next attempt spawns anew."""
        with self._lock:
            if self._spawned is None:
                self._spawned = Graph(f"{self.job_type} {self.job_id}")
            graph = self._spawned
        return graph.add(
            queue,
            job_type,
            payload,
            name=name,
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
        does one job; node names must not collide with jobs spawned already). Its nodes
        that leave ``key`` at INHERIT take this job's flow key."""
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
    def cancelled(self) -> bool:
        """True once the job was cancelled while this attempt ran (``leaseq cancel``, or a
        cancel of its pipeline or of an ancestor job), seen at the worker's next lease
        renewal: stop working; nothing the handler returns or spawns afterwards is written."""
        return self._reason is StopReason.CANCELLED

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
        """Set the stop flag with ``reason``. The first reason wins, but for one case: a
        refused step, stream item or checkpoint can only be read here as a lost lease, and
        the worker's renewal then says whether the job was cancelled (the lease ended
        because of it), so CANCELLED replaces LEASE_LOST."""
        with self._lock:
            if self._reason is None or (
                self._reason is StopReason.LEASE_LOST and reason is StopReason.CANCELLED
            ):
                self._reason = reason
            # Set under the lock: whoever sees a reason (on_stop) sees should_stop too.
            self._stop.set()
            calls, self._on_stop = self._on_stop, []
        for call in calls:
            call()

    def on_stop(self, call: Callable[[], object]) -> None:
        """Call ``call`` once, when the attempt is given up (at once if it was already)."""
        with self._lock:
            if self._reason is None:
                self._on_stop.append(call)
                return
        call()

    def pending_progress(self) -> tuple[Any, int]:
        """The latest progress value and its version, for the heartbeat to send."""
        with self._lock:
            return self._progress, self._progress_version

    def seconds_since_progress(self) -> float:
        """Seconds since the last progress call (or since the attempt started)."""
        with self._lock:
            return time.monotonic() - self._progress_at


def _trace_suspension(how: Suspended) -> None:
    """An event on the attempt's span for the sleep or wait that ends it: when it wakes (and
    what signal it waits for)."""
    if isinstance(how, Sleeping):
        tracing.event("leaseq.sleep", {"leaseq.wake_at": how.until.isoformat()})
    elif isinstance(how, Waiting):
        tracing.event(
            "leaseq.wait",
            {"leaseq.signal.name": how.name, "leaseq.wait.deadline": how.until.isoformat()},
        )
