"""Where handlers run: a long-lived pool of slots behind one interface.

The worker hands each claimed attempt to an :class:`Executor` and hears back once, through
``on_done``, how the handler ended (:class:`HandlerOutcome`). Everything else about an
attempt (its lease, its heartbeat, settling it) stays with the worker, so an executor only
runs code: a thread executor runs handlers on threads of this process; a process executor
(issue 12) runs them in child processes it can kill.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from leaseq.core import tracing
from leaseq.core.errors import NoHandler
from leaseq.core.waiters import handler_running
from leaseq.runtime.context import (
    BackOff,
    Interrupted,
    PermanentError,
    Sleeping,
    StopReason,
    Suspended,
    Waiting,
)
from leaseq.runtime.handler_loop import awaited
from leaseq.runtime.inflight import InFlight
from leaseq.runtime.registry import ExceptionTypes, JobType, batch_results

log = logging.getLogger("leaseq.worker")

#: Frames kept of a handler's traceback, innermost last (where it raised is what matters).
TRACEBACK_FRAMES = 50


class Ending(enum.StrEnum):
    """How a handler ended."""

    #: It returned a value (the job's result).
    RETURNED = "returned"
    #: It raised: the attempt fails and is retried while attempts remain.
    ERROR = "error"
    #: It raised :class:`PermanentError`, or a type its job type marks permanent: the job
    #: goes to dead.
    PERMANENT = "permanent"
    #: It raised :class:`Interrupted`: the job is handed back without spending an attempt.
    INTERRUPTED = "interrupted"
    #: It raised :class:`BackOff`: handed back for ``value`` seconds, its key paused as long.
    BACK_OFF = "back_off"
    #: It slept (``ctx.sleep``): handed back, free, to run again at ``value`` (a datetime).
    SLEPT = "slept"
    #: It waits for a signal (``ctx.wait_for``): handed back, free, ``value`` (name, deadline).
    WAITING = "waiting"
    #: What ran it died (a child process killed or crashed); only a process executor says so.
    CRASHED = "crashed"


@dataclass(frozen=True)
class HandlerOutcome:
    """What a slot reports for one attempt. ``error`` and ``error_code`` describe an ERROR,
    PERMANENT or CRASHED ending, ``traceback`` the exception's (formatted where the handler
    ran, so a child sends it up its pipe as text); ``seconds`` is the handler's wall time."""

    ending: Ending
    value: Any = None
    error: str = ""
    error_code: str = ""
    seconds: float = 0.0
    traceback: str | None = None
    #: Jobs the handler spawned (``ctx.spawn``): completed with the attempt, in its
    #: transaction (a :class:`leaseq.Graph`; pickled up a child's pipe like the value).
    spawn: Any = None

    @classmethod
    def of_value(cls, value: Any, seconds: float, permanent: ExceptionTypes) -> HandlerOutcome:
        """The outcome of a handler that returned ``value`` (an exception instance in a
        batch handler's results stands for that job's error)."""
        if isinstance(value, BaseException):
            return cls.of_exception(value, seconds, permanent)
        return cls(Ending.RETURNED, value, seconds=seconds)

    @classmethod
    def of_exception(
        cls, exc: BaseException, seconds: float, permanent: ExceptionTypes
    ) -> HandlerOutcome:
        """The outcome of a handler that raised ``exc``: PERMANENT for a
        :class:`PermanentError` or one of the ``permanent`` types, ERROR for any other."""
        if isinstance(exc, Sleeping):
            return cls(Ending.SLEPT, exc.until, seconds=seconds)
        if isinstance(exc, Waiting):
            return cls(Ending.WAITING, (exc.name, exc.until), seconds=seconds)
        if isinstance(exc, BackOff):
            return cls(Ending.BACK_OFF, exc.seconds, error=exc.reason, seconds=seconds)
        if isinstance(exc, Interrupted):
            return cls(Ending.INTERRUPTED, seconds=seconds)
        ending = Ending.PERMANENT if isinstance(exc, (PermanentError, *permanent)) else Ending.ERROR
        return cls(
            ending,
            error=f"{type(exc).__name__}: {exc}",
            error_code=type(exc).__name__,
            seconds=seconds,
            traceback=format_traceback(exc),
        )


def format_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as stored with a failed attempt (its innermost frames)."""
    return "".join(traceback.format_exception(exc, limit=-TRACEBACK_FRAMES))


#: Called from an executor thread when a unit's handler ended: once per submitted unit (an
#: attempt, or a batch), with one outcome per attempt, in order. Attempts the executor was
#: told to kill are left out (and a unit whose every attempt was killed is not reported).
OnDone = Callable[[list[InFlight], list[HandlerOutcome]], None]


def run_handler(attempt: InFlight) -> HandlerOutcome:
    """Run ``attempt``'s handler here and now, under its attempt's span (a consumer span:
    :func:`leaseq.core.tracing.attempt_span`); never raises (an exception is an outcome)."""
    job, lease = attempt.job, attempt.job.lease
    with tracing.attempt_span(
        job.queue,
        job.id,
        job.job_type,
        lease.attempt,
        lease.token,
        lease.owner,
        job.trace_context,
    ):
        return _run_handler(attempt)


def _run_handler(attempt: InFlight) -> HandlerOutcome:
    started = time.monotonic()
    job_type = attempt.job_type
    if job_type is None:
        return _no_handler(attempt)
    try:
        with handler_running():
            value = awaited(
                job_type.handler(attempt.job.payload, attempt.context), (attempt.context,)
            )
    except (Exception, Suspended) as exc:
        if not isinstance(exc, Interrupted | PermanentError | Suspended):
            log.warning("handler raised %r", exc, extra=attempt.fields(), exc_info=True)
        outcome = HandlerOutcome.of_exception(exc, time.monotonic() - started, job_type.permanent)
        tracing.attempt_ended(outcome.ending.value, exc, outcome.error_code)
        return outcome
    tracing.attempt_ended(Ending.RETURNED.value, None, "")
    return HandlerOutcome(Ending.RETURNED, value, seconds=time.monotonic() - started)


def _no_handler(attempt: InFlight) -> HandlerOutcome:
    """The outcome of an attempt whose type has no handler here: a retryable error, so the
    slot takes its next unit and the attempt is settled like any failure."""
    exc = NoHandler(attempt.job.job_type, attempt.context.worker_id)
    log.error("%s", exc, extra=attempt.fields())
    outcome = HandlerOutcome.of_exception(exc, 0.0, ())
    tracing.attempt_ended(outcome.ending.value, exc, outcome.error_code)
    return outcome


def run_unit(attempts: list[InFlight]) -> list[HandlerOutcome]:
    """Run one unit: a single attempt, or a batch of attempts of one batch job type (one
    call of its batch handler); one outcome per attempt, in order. Never raises."""
    outcomes = zip(attempts, _run_unit(attempts), strict=True)
    return [_with_spawn(a, _as_asked(a, o)) for a, o in outcomes]


def _as_asked(attempt: InFlight, outcome: HandlerOutcome) -> HandlerOutcome:
    """``outcome``, or the sleep or wait the handler asked for when it caught that and then
    returned or raised something else: an attempt that asked to suspend never succeeds (nor
    fails) past it, so a wait's deadline and a sleep's wake time are kept."""
    asked = attempt.context.suspension
    if asked is None or outcome.ending in (Ending.SLEPT, Ending.WAITING):
        return outcome
    log.warning(
        "handler %s after it asked to suspend (%s): the attempt ends suspended",
        "returned" if outcome.ending is Ending.RETURNED else f"ended {outcome.ending.value}",
        asked,
        extra=attempt.fields(),
    )
    return HandlerOutcome.of_exception(asked, outcome.seconds, ())


def _with_spawn(attempt: InFlight, outcome: HandlerOutcome) -> HandlerOutcome:
    """A returned outcome with what its handler spawned, if anything."""
    if outcome.ending is not Ending.RETURNED:
        return outcome
    spawned = attempt.context.spawned()
    return outcome if spawned is None else dataclasses.replace(outcome, spawn=spawned)


def _run_unit(attempts: list[InFlight]) -> list[HandlerOutcome]:
    job_type = attempts[0].job_type
    if len(attempts) == 1 or job_type is None:
        return [run_handler(attempt) for attempt in attempts]
    first = attempts[0]
    with tracing.batch_span(
        first.job.queue,
        first.job.job_type,
        first.job.lease.owner,
        [a.job.trace_context for a in attempts],
    ):
        return _run_batch(attempts, job_type)


def _run_batch(attempts: list[InFlight], job_type: JobType) -> list[HandlerOutcome]:
    started = time.monotonic()
    assert job_type.batch is not None, "only batch types batch"
    try:
        contexts = [a.context for a in attempts]
        with handler_running():
            values = batch_results(
                awaited(
                    job_type.batch.handler([a.job.payload for a in attempts], contexts), contexts
                ),
                len(attempts),
            )
    except (Exception, Suspended) as exc:
        if not isinstance(exc, Interrupted | PermanentError | Suspended):
            log.warning("batch handler raised %r", exc, extra=attempts[0].fields(), exc_info=True)
        outcome = HandlerOutcome.of_exception(exc, time.monotonic() - started, job_type.permanent)
        tracing.attempt_ended(outcome.ending.value, exc, outcome.error_code)
        return [outcome] * len(attempts)
    tracing.attempt_ended(Ending.RETURNED.value, None, "")
    seconds = time.monotonic() - started
    return [HandlerOutcome.of_value(value, seconds, job_type.permanent) for value in values]


class Executor(abc.ABC):
    """A pool of slots that run handlers. The worker submits an attempt only while fewer than
    ``capacity`` of its attempts are unreported (``on_done`` not yet called, nor killed), so
    a free slot is always waiting and ``submit`` never blocks."""

    def __init__(self, capacity: int, on_done: OnDone) -> None:
        self._capacity = capacity
        self.on_done = on_done

    @property
    def capacity(self) -> int:
        """How many attempts may be unreported at once (the worker claims up to this)."""
        return self._capacity

    @abc.abstractmethod
    def start(self) -> None:
        """Start the slots. Start-up hooks run where handlers run, before the first claim."""

    @abc.abstractmethod
    def submit(self, attempt: InFlight) -> None:
        """Run ``attempt``'s handler on a slot; returns at once."""

    @abc.abstractmethod
    def submit_batch(self, attempts: list[InFlight]) -> None:
        """Run a batch (attempts of one batch job type) on one slot, by one call of the
        batch handler; returns at once. ``on_done`` reports the batch as one unit, so its
        successes complete together."""

    def stop(self, attempt: InFlight, reason: StopReason) -> None:
        """Ask the handler to stop (it sees ``ctx.should_stop``); cooperative."""
        attempt.context.request_stop(reason)

    def kill(self, attempt: InFlight) -> bool:
        """Stop the handler by force, freeing what it holds; False when this executor cannot
        (then the handler runs on and its result is dropped)."""
        return False

    @abc.abstractmethod
    def close(self, timeout: float) -> None:
        """Stop the slots, waiting up to ``timeout`` seconds for idle ones."""


class ThreadExecutor(Executor):
    """``capacity`` long-lived daemon threads taking attempts from one queue. Handlers share
    the process (and its GIL) with the heartbeat; threads cannot be killed."""

    def __init__(self, capacity: int, on_done: OnDone, *, startup: Callable[[], None]) -> None:
        super().__init__(capacity, on_done)
        self._startup = startup
        self._work: queue.SimpleQueue[list[InFlight] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._startup()
        for i in range(self.capacity):
            thread = threading.Thread(target=self._slot, name=f"leaseq-slot-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, attempt: InFlight) -> None:
        self._work.put([attempt])

    def submit_batch(self, attempts: list[InFlight]) -> None:
        self._work.put(list(attempts))

    def _slot(self) -> None:
        while (unit := self._work.get()) is not None:
            outcomes = run_unit(unit)
            try:
                self.on_done(unit, outcomes)
            except Exception:
                # The slot must outlive any bug in reporting: log it and take the next unit.
                log.exception("error reporting a handler's outcome", extra=unit[0].fields())

    def close(self, timeout: float) -> None:
        for _ in self._threads:
            self._work.put(None)
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
