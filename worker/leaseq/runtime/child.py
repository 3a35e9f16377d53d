"""The child side of ``--isolation process``: load the app, run ``on_startup`` once, then run the
handlers the supervisor sends, one unit (a job, or a batch of jobs) at a time.

A child is started by :mod:`leaseq.runtime.processes` with ``spawn`` (a fresh interpreter: no
inherited threads, locks or database connections). It holds no lease and no connection:
progress goes up the pipe, a checkpoint or a durable step's write is a request the supervisor
answers (the supervisor makes the fenced call), stop and draining come down the pipe. SIGINT
and SIGTERM are ignored (the supervisor decides when a child ends, and a terminal's Ctrl-C
reaches the whole process group); a child dies with its supervisor (``PR_SET_PDEATHSIG`` where
Linux offers it, else at EOF on the pipe), and at the end of the lease it runs under, even when
the supervisor is stopped (its guard, :func:`_guard`).
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn, Protocol

from leaseq._orphans import die_with_parent
from leaseq.core import validation
from leaseq.core.errors import LeaseqError
from leaseq.core.models import ClaimedJob, Lease, ParentResult, StepRecord
from leaseq.runtime import logs, telemetry
from leaseq.runtime.context import JobContext, StopReason
from leaseq.runtime.executor import Ending, HandlerOutcome, run_unit
from leaseq.runtime.handler_errors import Interrupted
from leaseq.runtime.inflight import InFlight
from leaseq.runtime.registry import Registry, load_app
from leaseq.runtime.steps import StepOp

log = logging.getLogger("leaseq.child")

#: Longest sleep of a child's lease guard between two reads of its deadline (a deadline
#: set while it sleeps is at least a lease's margin away: see processes.LEASE_MARGIN).
GUARD_POLL_SECONDS = 0.05
#: How often a child sends its handlers' latest progress up the pipe (the last value before
#: a result always goes with it).
PROGRESS_INTERVAL_SECONDS = 0.1


class Msg(enum.StrEnum):
    """Tags of the messages on a slot's pipe (each message is a tuple led by its tag)."""

    # child -> supervisor
    READY = "ready"  # ()
    STARTUP_FAILED = "startup_failed"  # (error)
    PROGRESS = "progress"  # (job_id, value)
    CHECKPOINT = "checkpoint"  # (request_id, job_id, state)
    PARENTS = "parents"  # (request_id, job_id, after_id, limit): a page of parent results
    STEP = "step"  # (request_id, job_id, op, args): a durable step's store call
    DONE = "done"  # (outcomes, one per job of the unit, in order)
    # supervisor -> child
    RUN = "run"  # (jobs, draining)
    STOP = "stop"  # (job_id, reason)
    DRAINING = "draining"  # ()
    CHECKPOINTED = "checkpointed"  # (request_id, stored, error)
    PARENTS_PAGE = "parents_page"  # (request_id, [ParentResult], error)
    STEPPED = "stepped"  # (request_id, value, error)


@dataclass(frozen=True)
class ChildSpec:
    """What a child needs to know to become a slot."""

    app: str
    worker_id: str
    log_level: str
    log_format: str


def main(conn: Connection, spec: ChildSpec, supervisor: int, deadline: Deadline) -> None:
    """The child process's entry point (``multiprocessing`` target); ``supervisor`` is the
    pid of the worker process that started it, ``deadline`` the shared lease deadline its
    guard enforces (:func:`_guard`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent(supervisor)
    # Forked now, while this process has one thread (spawn started a fresh interpreter).
    if os.fork() == 0:
        conn.close()  # the pipe's ends stay the child's and the supervisor's alone
        _guard(deadline)
    logs.configure(spec.log_level, spec.log_format)
    # Its own tracer provider: the handlers' spans are this process's to export.
    stop_tracing = telemetry.configure()
    try:
        registry = load_app(spec.app)
        registry.run_startup()
    except BaseException as exc:
        log.exception("start-up failed in a child process")
        conn.send((Msg.STARTUP_FAILED, f"{type(exc).__name__}: {exc}"))
        return
    try:
        Child(conn, spec, registry).serve()
    finally:
        stop_tracing()


class Deadline(Protocol):
    """A ``c_double`` in memory shared with the supervisor (``multiprocessing.RawValue``)."""

    value: float


def _guard(deadline: Deadline) -> NoReturn:
    """The child's lease guard, a process forked from the child before it loads anything:
    it SIGKILLs the child when the monotonic clock passes ``deadline`` and exits with it.

    The supervisor writes ``deadline`` (the running unit's earliest lease end, less a
    margin; infinity while the child is idle) into shared memory at each renewal, so the
    guard needs neither the supervisor nor the child to run: a stopped supervisor (SIGSTOP,
    a frozen node process) cannot let the child run past its lease, and a handler holding
    the child's GIL can neither delay the kill nor be killed while its lease is renewed.
    CLOCK_MONOTONIC is one clock for every process of a host."""
    child = os.getppid()
    die_with_parent(child)
    while True:
        remaining = deadline.value - time.monotonic()
        if remaining <= 0:
            os.kill(child, signal.SIGKILL)
            os._exit(0)
        time.sleep(min(remaining, GUARD_POLL_SECONDS))


class _Checkpoints:
    """A ``JobContext``'s checkpoint store in a child: the supervisor makes the fenced call."""

    def __init__(self, child: Child) -> None:
        self._child = child

    def checkpoint(self, lease: Lease, state: Any) -> bool:
        validation.json_value("checkpoint", state)
        return self._child.request_checkpoint(lease.job_id, state)

    def steps(self, job_id: int) -> list[StepRecord]:
        rows: list[StepRecord] | None = self._child.request_step(job_id, StepOp.LIST, ())
        if rows is None:
            raise Interrupted("stopped while the job's steps could not be read")
        return rows

    def step_intend(self, lease: Lease, name: str, *, seen_token: int | None) -> bool:
        return bool(self._child.request_step(lease.job_id, StepOp.INTEND, (name, seen_token)))

    def step_record(self, lease: Lease, name: str, result: Any) -> bool:
        validation.json_value(f"step {name!r} result", result)
        return bool(self._child.request_step(lease.job_id, StepOp.RECORD, (name, result)))

    def step_withdraw(self, lease: Lease, name: str) -> bool:
        return bool(self._child.request_step(lease.job_id, StepOp.WITHDRAW, (name,)))

    def emit(self, lease: Lease, value: Any) -> int | None:
        offset: int | None = self._child.request_step(lease.job_id, StepOp.EMIT, (value,))
        return offset

    def signal_read(self, lease: Lease, name: str) -> tuple[bool, Any] | None:
        found: tuple[bool, Any] | None = self._child.request_step(
            lease.job_id, StepOp.SIGNAL, (name,)
        )
        return None if found is None else (bool(found[0]), found[1])

    def iter_parent_results(self, job_id: int, *, page: int) -> Iterator[ParentResult]:
        """A job's parents, page by page, each page read by the supervisor's queue."""
        after_id = 0
        while True:
            rows = self._child.request_parents(job_id, after_id, page)
            yield from rows
            if len(rows) < page:
                return
            after_id = rows[-1].job_id


class Child:
    """A slot's child: a reader thread for the pipe, a progress thread, and the main thread
    running handlers."""

    def __init__(self, conn: Connection, spec: ChildSpec, registry: Registry) -> None:
        self.conn = conn
        self.spec = spec
        self.registry = registry
        self.draining = threading.Event()
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._units: queue.SimpleQueue[list[InFlight]] = queue.SimpleQueue()
        self._contexts: dict[int, JobContext] = {}
        self._sent_versions: dict[int, int] = {}
        self._requests = itertools.count()
        self._answers: dict[int, tuple[threading.Event, list[Any]]] = {}

    def send(self, *message: Any) -> None:
        with self._send_lock:
            self.conn.send(message)

    def serve(self) -> None:
        threading.Thread(target=self._read, name="leaseq-child-reader", daemon=True).start()
        threading.Thread(target=self._forward, name="leaseq-child-progress", daemon=True).start()
        self.send(Msg.READY)
        while True:
            self._run(self._units.get())

    # -- from the supervisor ----------------------------------------------------------

    def _read(self) -> None:
        try:
            while True:
                tag, *args = self.conn.recv()
                if tag == Msg.RUN:
                    jobs, draining = args
                    if draining:
                        self.draining.set()
                    self._units.put(self._prepare(jobs))
                elif tag == Msg.STOP:
                    job_id, reason = args
                    with self._lock:
                        ctx = self._contexts.get(job_id)
                    if ctx is not None:
                        ctx.request_stop(StopReason(reason))
                elif tag == Msg.DRAINING:
                    self.draining.set()
                elif tag in (Msg.CHECKPOINTED, Msg.PARENTS_PAGE, Msg.STEPPED):
                    request_id, stored, error = args
                    with self._lock:
                        done, answer = self._answers.pop(request_id)
                    answer.extend((stored, error))
                    done.set()
        except (EOFError, OSError):
            # The supervisor is gone or closed the slot: nothing here is worth finishing.
            os._exit(0)

    def _request(self, tag: Msg, failed: str, *args: Any) -> Any:
        """Send ``tag`` with a new request id and ``args``, and wait for the supervisor's
        answer; LeaseqError (``failed``: what did not happen) when it answers with an error."""
        request_id = next(self._requests)
        done, answer = threading.Event(), list[Any]()
        with self._lock:
            self._answers[request_id] = (done, answer)
        self.send(tag, request_id, *args)
        done.wait()
        value, error = answer
        if error:
            raise LeaseqError(f"{failed}: {error}")
        return value

    def request_checkpoint(self, job_id: int, state: Any) -> bool:
        """Ask the supervisor to store ``state`` for ``job_id`` and wait for its answer."""
        return bool(self._request(Msg.CHECKPOINT, "checkpoint not stored", job_id, state))

    def request_parents(self, job_id: int, after_id: int, limit: int) -> list[ParentResult]:
        """Ask the supervisor for one keyset page of ``job_id``'s parents, and wait for it."""
        rows = self._request(Msg.PARENTS, "parent results not read", job_id, after_id, limit)
        return list(rows)

    def request_step(self, job_id: int, op: StepOp, args: tuple[Any, ...]) -> Any:
        """Ask the supervisor to make a step's store call for ``job_id`` (fenced by the lease
        it holds) and wait for its answer."""
        return self._request(Msg.STEP, f"step call {op.value} not made", job_id, op.value, args)

    # -- to the supervisor ------------------------------------------------------------

    def _forward(self) -> None:
        while True:
            time.sleep(PROGRESS_INTERVAL_SECONDS)
            self._send_progress()

    def _send_progress(self) -> None:
        with self._lock:
            contexts = list(self._contexts.items())
        for job_id, ctx in contexts:
            value, version = ctx.pending_progress()
            with self._lock:
                if version <= self._sent_versions.get(job_id, 0):
                    continue
                self._sent_versions[job_id] = version
            try:
                self.send(Msg.PROGRESS, job_id, value)
            except (TypeError, ValueError, AttributeError, pickle.PicklingError) as exc:
                log.error("progress not sent (not picklable): %r", exc, extra=ctx.log.extra)

    # -- running ----------------------------------------------------------------------

    def _prepare(self, jobs: list[ClaimedJob]) -> list[InFlight]:
        """The unit's attempts, their contexts registered (by the reader, so that a stop
        sent right after the unit always finds its context)."""
        checkpoints = _Checkpoints(self)
        attempts = []
        for job in jobs:
            ctx = JobContext(job, checkpoints, self.spec.worker_id, self.draining)
            # The supervisor keeps the lease: here an attempt is only a handler's inputs.
            attempts.append(
                InFlight(
                    job,
                    self.registry.get(job.job_type),
                    ctx,
                    lease_bound=float("inf"),
                    deadline=None,
                    renew_at=float("inf"),
                )
            )
        with self._lock:
            self._contexts = {a.job.id: a.context for a in attempts}
            self._sent_versions = {}
        return attempts

    def _run(self, attempts: list[InFlight]) -> None:
        outcomes = run_unit(attempts)
        self._send_progress()
        with self._lock:
            self._contexts = {}
        try:
            self.send(Msg.DONE, outcomes)
        except Exception as exc:
            # Pickling failed before anything was written: the pipe is still clean.
            log.warning("result cannot be sent to the supervisor: %r", exc)
            error = f"PermanentError: handler returned a result that cannot be sent: {exc}"
            unsendable = HandlerOutcome(Ending.PERMANENT, error=error, error_code="PermanentError")
            self.send(
                Msg.DONE, [unsendable if o.ending is Ending.RETURNED else o for o in outcomes]
            )
