"""``--isolation process``: every slot is a child process that runs handlers, supervised
from the worker process, which keeps the leases.

The supervisor (this module, in the worker process) owns everything that touches a lease:
the claim, the heartbeat, checkpoints and settling. A child (:mod:`leaseq.runtime.child`)
only runs ``on_startup`` (once per child: it loads the model) and handlers. So a handler
that holds the GIL in a C call, blocks, leaks or crashes cannot delay a renewal: it is
another process.

Per slot, one supervisor thread sends the child a unit (one job, or one batch) and pumps
its messages until the unit is done: progress is recorded on the attempt's context (and
goes out with the next renewal), a checkpoint is stored by the supervisor (fenced) and
answered, ``stop`` and draining go down. :meth:`ProcessExecutor.kill` SIGKILLs the child
(freeing whatever it held, GPU memory included); the slot starts a new child before its next
unit. A child that dies on its own (a segfault, the OOM killer, ``os._exit``) fails only
the attempts it was running, with the signal or exit code as their error, and is replaced.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from leaseq._orphans import SUPERVISOR_ENV
from leaseq.core.backoff import Backoff
from leaseq.core.errors import LeaseqError
from leaseq.core.models import ClaimedJob
from leaseq.runtime import child
from leaseq.runtime.child import ChildSpec, Msg
from leaseq.runtime.context import StopReason
from leaseq.runtime.executor import Ending, Executor, HandlerOutcome, OnDone
from leaseq.runtime.inflight import InFlight
from leaseq.runtime.launch import ChildProcess
from leaseq.runtime.steps import StepOp

log = logging.getLogger("leaseq.worker")

#: How often a slot's supervisor thread looks up from the pipe (to pass on draining).
PUMP_SECONDS = 0.1
#: Most a child's guard kills it ahead of its lease's earliest end (seconds); less for
#: leases shorter than 8 times this.
LEASE_MARGIN_SECONDS = 0.25
#: Error code of an attempt whose child process died under it.
CHILD_CRASHED = "CHILD_CRASHED"


#: How often a worker that is PID 1 reaps the orphans reparented to it (seconds).
ORPHAN_REAP_SECONDS = 1.0


def mark_supervisor() -> None:
    """Name this process as the supervisor in the environment its children inherit, so each
    dies with it from its first ``import leaseq`` (:mod:`leaseq._orphans`). Call it before
    any thread starts: the environment is process-wide and not safe to change under them."""
    os.environ[SUPERVISOR_ENV] = str(os.getpid())


def reap_orphans() -> list[int]:
    """Reap this process's zombie children that ``multiprocessing`` did not start (it reaps
    its own, keeping their exit codes); returns their pids.

    A worker that is PID 1 (a container's entrypoint) inherits every orphan of its PID
    namespace, the guard of each child that died first among them (:func:`child._guard`),
    and only PID 1 can reap them. In process isolation the worker itself starts nothing but
    its children and multiprocessing's resource tracker, so a zombie that is neither is an
    orphan, and nobody else waits for it."""
    me = str(os.getpid())
    candidates = _zombie_children(me)
    # First let multiprocessing reap (and record) what is its own.
    multiprocessing.active_children()
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    own = {p.pid for p in multiprocessing.active_children()} | {tracker}
    reaped = []
    for pid in candidates:
        if pid in own or pid not in _zombie_children(me, only=pid):
            continue
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
    return reaped


def _zombie_children(parent: str, only: int | None = None) -> list[int]:
    """Pids of ``parent``'s children that are zombies (of ``only``, if given), from /proc."""
    pids = [only] if only is not None else [int(e) for e in os.listdir("/proc") if e.isdigit()]
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name, which is in parentheses and may hold anything.
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if state == "Z" and ppid == parent:
            found.append(pid)
    return found


def without_secret(job: ClaimedJob) -> ClaimedJob:
    """``job`` as a child receives it: without its lease's secret. The supervisor makes
    every call under the lease, so a handler's process never holds a secret at all."""
    return dataclasses.replace(job, lease=dataclasses.replace(job.lease, secret=b""))


class ChildStartupFailed(LeaseqError):
    """A child process could not start: its ``on_startup`` hook (or the app import) failed."""


def exit_cause(exitcode: int | None) -> str:
    """Words for how a child process ended, from its exit code (negative: a signal)."""
    if exitcode is None:
        return "child process vanished"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the OOM killer sends SIGKILL)" if -exitcode == signal.SIGKILL else ""
        return f"child process killed by {name} (signal {-exitcode}){hint}"
    return f"child process exited with code {exitcode}"


def lease_margin(attempts: list[InFlight]) -> float:
    """How long before its lease's earliest end a child's guard kills it: room for the
    kill and for the child's last write to land before another worker can claim the job."""
    return min(LEASE_MARGIN_SECONDS, *(a.granted / 8 for a in attempts))


class _Child:
    """One running child process, its end of the pipe, and its guard's deadline."""

    def __init__(self, process: BaseProcess, conn: Connection, deadline: child.Deadline) -> None:
        self.process = process
        self.conn = conn
        self.deadline = deadline
        self.lock = threading.Lock()  # one sender at a time

    def guard(self, attempts: list[InFlight]) -> float:
        """Set the guard's deadline for ``attempts`` (infinity for none); returns it."""
        until = float("inf")
        if attempts:
            until = min(a.lease_floor for a in attempts) - lease_margin(attempts)
        self.deadline.value = until
        return until

    def send(self, *message: Any) -> None:
        with self.lock:
            self.conn.send(message)

    def kill(self) -> None:
        """SIGKILL (a no-op once the child has been reaped)."""
        self.process.kill()


class _Slot:
    """A supervisor thread and its child; runs one unit at a time."""

    def __init__(self, executor: ProcessExecutor, index: int) -> None:
        self.executor = executor
        self.index = index
        self.child: _Child | None = None
        self.lock = threading.Lock()
        #: The unit running now, by job id, and which of its attempts were killed.
        self.unit: dict[int, InFlight] = {}
        self.killed: set[int] = set()

    # -- child lifecycle ----------------------------------------------------------------

    def launch(self) -> _Child:
        """Start a child (returns before its ``on_startup`` finished), its
        ``PR_SET_PDEATHSIG`` set before its interpreter starts (:mod:`.launch`). It follows
        the thread that starts it: the worker's main thread at start-up, this slot's thread
        for a replacement; both outlive the child's use."""
        ctx = multiprocessing.get_context("spawn")
        here, there = ctx.Pipe(duplex=True)
        deadline = ctx.RawValue(ctypes.c_double, math.inf)
        process = ChildProcess(
            target=child.main,
            args=(there, self.executor.spec, os.getpid(), deadline),
            name=f"leaseq-slot-{self.index}",
        )
        process.start()
        there.close()
        return _Child(process, here, deadline)

    def await_ready(self, new: _Child) -> None:
        """Wait until ``new`` finished ``on_startup``; ChildStartupFailed if it did not."""
        while True:
            ready = wait([new.conn, new.process.sentinel])
            if new.conn in ready:
                try:
                    tag, *args = new.conn.recv()
                except EOFError:
                    pass
                else:
                    if tag == Msg.READY:
                        self.child = new
                        self.executor.started()
                        return
                    new.kill()
                    raise ChildStartupFailed(f"slot {self.index}: on_startup failed: {args[0]}")
            new.process.join(5.0)
            raise ChildStartupFailed(
                f"slot {self.index}: {exit_cause(new.process.exitcode)} during start-up"
            )

    def discard_child(self, grace: float = 0.0) -> None:
        """End the child: closing the pipe lets an idle one exit; after ``grace`` seconds
        it is killed."""
        gone, self.child = self.child, None
        if gone is None:
            return
        gone.conn.close()
        gone.process.join(grace)
        gone.kill()
        gone.process.join(5.0)

    # -- running units ------------------------------------------------------------------

    def serve(self) -> None:
        restarts = Backoff(0.5, 30.0)
        while (unit := self.executor.next_unit()) is not None:
            try:
                if self.child is None or not self.child.process.is_alive():
                    self.discard_child()
                    self.replace()
                    restarts.reset()
            except (ChildStartupFailed, OSError) as exc:
                # Not the jobs' fault: hand them back (no attempt spent), wait, try again.
                delay = restarts.next()
                log.error("%s; releasing its jobs, retrying in %.1fs", exc, delay)
                self.report(unit, [HandlerOutcome(Ending.INTERRUPTED, error=str(exc))] * len(unit))
                time.sleep(delay)
                continue
            try:
                self.run(unit)
            except Exception:
                log.exception("slot %d: supervising error; replacing its child", self.index)
                self.discard_child()
                self.report(unit, [HandlerOutcome(Ending.INTERRUPTED)] * len(unit))
            if self.child is None and not any(a.context.draining for a in unit):
                # Load the next child's model now, not when the next job is waiting for it.
                try:
                    self.replace()
                except (ChildStartupFailed, OSError) as exc:
                    log.error("%s; will retry when the next job comes", exc)

    def replace(self) -> None:
        """Start a child for this slot and wait until it is ready."""
        log.info("slot %d: starting a new child process", self.index)
        self.await_ready(self.launch())

    def run(self, attempts: list[InFlight]) -> None:
        assert self.child is not None
        current = self.child
        with self.lock:
            self.unit = {a.job.id: a for a in attempts}
            self.killed = set()
        draining = any(a.context.draining for a in attempts)
        until = current.guard(attempts)
        current.send(Msg.RUN, [without_secret(a.job) for a in attempts], draining)
        outcomes: list[HandlerOutcome] | None = None
        started = time.monotonic()
        stopped: set[int] = set()
        while outcomes is None:
            ready = wait([current.conn, current.process.sentinel], PUMP_SECONDS)
            # Renewals move the leases' ends: the guard follows (not for attempts already
            # given up, whose leases are no longer renewed and may be gone).
            until = current.guard([a for a in attempts if a.running] or attempts)
            if not draining and any(a.context.draining for a in attempts):
                draining = True
                self._send_quietly(current, Msg.DRAINING)
            # Whoever stopped an attempt here (give-up, a lease found expired, a refused
            # checkpoint), the handler's context in the child hears of it.
            for a in attempts:
                reason = a.context.stop_reason
                if reason is not None and a.job.id not in stopped:
                    stopped.add(a.job.id)
                    self._send_quietly(current, Msg.STOP, a.job.id, reason.value)
            if current.conn in ready:
                try:
                    message = current.conn.recv()
                except (EOFError, OSError):
                    break
                outcomes = self.handle(current, message)
            elif current.process.sentinel in ready:
                break
        current.guard([])
        if outcomes is None:
            current.process.join(5.0)
            cause = exit_cause(current.process.exitcode)
            if current.process.exitcode == -signal.SIGKILL and time.monotonic() >= until:
                cause = "child process stopped by its guard at the end of its lease"
            self.discard_child()
            crashed = HandlerOutcome(
                Ending.CRASHED,
                error=cause,
                error_code=CHILD_CRASHED,
                seconds=time.monotonic() - started,
            )
            self.report(attempts, [crashed] * len(attempts))
            return
        self.report(attempts, outcomes)

    def handle(self, current: _Child, message: tuple[Any, ...]) -> list[HandlerOutcome] | None:
        """Act on one message from the child; the unit's outcomes once it is done."""
        tag, *args = message
        if tag == Msg.DONE:
            return list(args[0])
        attempt = self.unit.get(
            args[1] if tag in (Msg.CHECKPOINT, Msg.PARENTS, Msg.STEP) else args[0]
        )
        if tag == Msg.PROGRESS and attempt is not None:
            attempt.context.progress(args[1])
        elif tag == Msg.CHECKPOINT:
            request_id, _, state = args
            stored, error = False, ""
            if attempt is not None:
                try:
                    stored = attempt.context.checkpoint(state)
                except LeaseqError as exc:
                    error = f"{type(exc).__name__}: {exc}"
            self._send_quietly(current, Msg.CHECKPOINTED, request_id, stored, error)
        elif tag == Msg.PARENTS:
            request_id, _, after_id, limit = args
            rows: list[Any] = []
            error = "" if attempt is not None else "the attempt is no longer running here"
            if attempt is not None:
                try:
                    rows = attempt.context.parent_results_page(after_id=after_id, limit=limit)
                except LeaseqError as exc:
                    error = f"{type(exc).__name__}: {exc}"
            self._send_quietly(current, Msg.PARENTS_PAGE, request_id, rows, error)
        elif tag == Msg.STEP:
            request_id, _, op, call_args = args
            value: Any = None
            error = "" if attempt is not None else "the attempt is no longer running here"
            if attempt is not None:
                try:
                    value = attempt.context.step_call(StepOp(op), tuple(call_args))
                except LeaseqError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                # Why a step was refused goes first: the child's handler reads its answer
                # knowing it (a drain refuses steps on purpose, a lost lease is a warning).
                reason = attempt.context.stop_reason
                if reason is not None:
                    self._send_quietly(current, Msg.STOP, attempt.job.id, reason.value)
            self._send_quietly(current, Msg.STEPPED, request_id, value, error)
        return None

    def report(self, attempts: list[InFlight], outcomes: list[HandlerOutcome]) -> None:
        """Report the unit's outcomes, but for the attempts that were killed; from now on
        :meth:`kill` no longer finds them (they are reported)."""
        with self.lock:
            killed = set(self.killed)
            self.unit = {}
        kept = [(a, o) for a, o in zip(attempts, outcomes, strict=True) if a.job.id not in killed]
        if kept:
            self.executor.on_done([a for a, _ in kept], [o for _, o in kept])

    @staticmethod
    def _send_quietly(current: _Child, *message: Any) -> None:
        # A dead child is noticed by the pump through its sentinel.
        with contextlib.suppress(OSError):
            current.send(*message)

    # -- from other threads -------------------------------------------------------------

    def kill(self, attempt: InFlight) -> bool:
        """Kill the child if ``attempt`` is in its unit and every other attempt of the unit
        was killed too (a batch keeps running for the jobs still wanted); True if ``attempt``
        is this slot's (its outcome will not be reported)."""
        with self.lock:
            if attempt.job.id not in self.unit:
                return False
            self.killed.add(attempt.job.id)
            everyone = self.killed >= self.unit.keys()
            current = self.child
        if everyone and current is not None:
            reason = attempt.context.stop_reason
            # A cancel is asked for: killing its child is the cancel working, not a fault.
            level = logging.INFO if reason is StopReason.CANCELLED else logging.WARNING
            log.log(
                level,
                "killing the child process of slot %d (%s)",
                self.index,
                reason or "stopped",
                extra=attempt.fields(),
            )
            current.kill()
        return True


class ProcessExecutor(Executor):
    """``slots`` child processes. :meth:`start` starts them all and waits until every child
    has run ``on_startup``; ChildStartupFailed if one could not."""

    def __init__(
        self, slots: int, on_done: OnDone, *, spec: ChildSpec, started: Callable[[], None]
    ) -> None:
        """``started()`` is called each time a child has become ready."""
        super().__init__(slots, on_done)
        self.spec = spec
        self.started = started
        self._changed = threading.Condition()
        self._pending: collections.deque[list[InFlight] | None] = collections.deque()
        self._slots = [_Slot(self, i) for i in range(slots)]
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        launched = [slot.launch() for slot in self._slots]
        try:
            for slot, new in zip(self._slots, launched, strict=True):
                slot.await_ready(new)
        except ChildStartupFailed:
            for new in launched:
                new.kill()
            raise
        for slot in self._slots:
            thread = threading.Thread(target=slot.serve, name=f"leaseq-slot-{slot.index}")
            thread.daemon = True
            thread.start()
            self._threads.append(thread)
        if os.getpid() == 1:
            threading.Thread(target=self._reap, name="leaseq-orphans", daemon=True).start()

    def _reap(self) -> None:
        """As PID 1: reap orphans for as long as the process lives."""
        while True:
            try:
                for pid in reap_orphans():
                    log.debug("reaped orphan process %d", pid)
            except Exception:
                log.exception("reaping orphans failed; trying again")
            time.sleep(ORPHAN_REAP_SECONDS)

    def next_unit(self) -> list[InFlight] | None:
        """The next unit to run (None: the slot should end); waits for one."""
        with self._changed:
            while not self._pending:
                self._changed.wait()
            return self._pending.popleft()

    def _put(self, unit: list[InFlight] | None) -> None:
        with self._changed:
            self._pending.append(unit)
            self._changed.notify()

    def submit(self, attempt: InFlight) -> None:
        self._put([attempt])

    def submit_batch(self, attempts: list[InFlight]) -> None:
        self._put(list(attempts))

    def kill(self, attempt: InFlight) -> bool:
        """Kill the child running ``attempt`` (or drop it before it starts); True unless
        ``attempt`` has already been reported."""
        with self._changed:
            for unit in self._pending:
                if unit is not None and attempt in unit:
                    unit.remove(attempt)
                    if not unit:
                        self._pending.remove(unit)
                    return True
        return any(slot.kill(attempt) for slot in self._slots)

    def close(self, timeout: float) -> None:
        """End the slots (after the drain: their attempts are settled) and their children:
        an idle child exits when its pipe closes; one that does not is killed."""
        for _ in self._threads:
            self._put(None)
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        for slot in self._slots:
            slot.discard_child(grace=max(0.0, end - time.monotonic()))
