"""The worker process: claim, run, renew, settle; drain on SIGTERM.

Threads: the main thread waits for signals and runs the drain; a dispatcher claims as many
jobs as there are free slots (:mod:`leaseq.runtime.dispatcher`, whose claim planner chooses
the statements) and hands each to the executor's long-lived slots
(:mod:`leaseq.runtime.executor`); successful attempts are completed in groups, one
``complete_many`` per group (:mod:`leaseq.runtime.completions`); one heartbeat loop renews
the leases of attempts older than one heartbeat interval; a listener holds the LISTEN
connection. A slot counts as busy from the claim until its attempt
is settled, so the next claim never precedes the commit of the slot's previous result.
Every database call is one autocommit statement from a psycopg_pool pool, so no transaction
is ever open while a handler runs.

Guarantees, on top of the queue's: an attempt is settled (completed, failed, released or
dropped) by exactly one party (:mod:`leaseq.runtime.inflight`); a result is never reported for an
attempt whose lease PostgreSQL declared lost; calls that fail because the database is
unreachable are retried with backoff while the lease may still be held, and after that the
reaper takes the job back. No error ends the process silently: every loop logs and carries on.

With ``--isolation process`` the slots are child processes (:mod:`leaseq.runtime.processes`)
and an attempt given up is killed with its child, which frees the slot at once. Threads
cannot be killed: a handler that ignores ``ctx.should_stop`` after its attempt was
given up keeps its slot (and ``leaseq_jobs_in_flight``) until it returns; its result is
dropped. At exit, such threads are abandoned (they are daemons), after their jobs were
settled, so a SIGTERM never waits on them past the drain window, but for one case in both
modes: a job inside a durable step is released only once the step ended (its effect
written and recorded), never while the step's function may still write it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from leaseq import config
from leaseq.core import validation
from leaseq.core.backoff import Backoff
from leaseq.core.db import Conn, open_pool
from leaseq.core.errors import DatabaseUnavailable, InvalidJob, LeaseqError, SchemaNotReady
from leaseq.core.models import STEP_UNCERTAIN_CODE, Call, RetryPolicy, WorkerState
from leaseq.core.queue import Queue, checked_plan
from leaseq.core.schedules import Schedules
from leaseq.core.schema import Schema
from leaseq.core.workers import Workers
from leaseq.runtime.batching import Batching
from leaseq.runtime.child import ChildSpec
from leaseq.runtime.completions import Completions
from leaseq.runtime.context import PermanentError, StopReason
from leaseq.runtime.dispatcher import Dispatcher
from leaseq.runtime.executor import (
    Ending,
    Executor,
    HandlerOutcome,
    OnDone,
    ThreadExecutor,
    format_traceback,
)
from leaseq.runtime.failover import ServerWatch
from leaseq.runtime.health import NOT_READY_ERRORS, Health
from leaseq.runtime.heartbeat import PROCESS_HINT, THREAD_HINT, HeartbeatLoop
from leaseq.runtime.http_server import ProbeServer
from leaseq.runtime.inflight import InFlight, InFlightTable
from leaseq.runtime.leading import worker_leader
from leaseq.runtime.listener import Listener
from leaseq.runtime.metrics import WorkerMetrics
from leaseq.runtime.outcomes import Settler
from leaseq.runtime.processes import ProcessExecutor, mark_supervisor
from leaseq.runtime.registry import Registry
from leaseq.runtime.settings import Isolation, WorkerSettings
from leaseq.runtime.settlement import Answer, Done, Settlement
from leaseq.runtime.shutdown import SignalWatch

log = logging.getLogger("leaseq.worker")

#: How long, after the drain, the worker waits for settling calls already under way.
SETTLE_GRACE_SECONDS = 5.0
#: How often, after the drain window, the worker looks whether a held step has ended.
STEP_POLL_SECONDS = 0.1


def application_name(conninfo: str, worker_id: str) -> str:
    """``conninfo`` with application_name set to the worker (unless the URL sets one), so
    an operator can find this worker's sessions in pg_stat_activity."""
    if conninfo_to_dict(conninfo).get("application_name"):
        return conninfo
    return make_conninfo(conninfo, application_name=f"leaseq worker {worker_id}"[:63])


class Worker:
    """One worker process. Build it with settings and a registry, then :meth:`run` it."""

    def __init__(
        self, settings: WorkerSettings, registry: Registry, *, retry: RetryPolicy | None = None
    ) -> None:
        """``retry``: backoff between failed attempts (default :class:`RetryPolicy`)."""
        if settings.isolation is Isolation.PROCESS:
            mark_supervisor()  # before the first thread (the pool's) starts
        self.settings = settings
        self.registry = registry
        # By this host's clock, the one the kubelet dates a container's termination by: a
        # worker that started before its container terminated ran in it, and the operator
        # ends its leases at once (leaseq.workers.boot_at). Not for an id given by the user:
        # a restarted container's worker could hold leases under it.
        self.boot_at = datetime.now(UTC) if settings.own_id else None
        self.metrics = WorkerMetrics(settings.queues, registry.job_types)
        self.health = Health()
        self.jobs = InFlightTable()
        self.draining = threading.Event()
        self.stopping = threading.Event()
        self.wake = threading.Event()
        # Bound first: a busy port must fail before anything else is started.
        self.http: ProbeServer | None = None
        if settings.metrics_port != 0:
            self.http = ProbeServer(
                config.bind_port(settings.metrics_port),
                self.metrics.registry,
                self.health.healthy,
                self.health.ready,
                address=settings.metrics_address,
            )
        self.conninfo = application_name(settings.database_url, settings.worker_id)
        self.server = ServerWatch(self._failed_over)
        self.pool = open_pool(
            self.conninfo,
            min_size=2,
            max_size=settings.concurrency + 4,
            name=f"leaseq-{settings.worker_id}",
            timeout=max(2.0, min(10.0, settings.lease_seconds / 2)),
            prepare=settings.prepared_statements,
            configure=self._on_connection,
        )
        self.queue = Queue(self.pool, retry=retry)
        self.workers = Workers(self.pool)
        self.settlement = Settlement(
            self.queue,
            metrics=self.metrics,
            health=self.health,
            stopping=self.stopping,
        )
        # Handlers that have not reported yet (their results may still join a group).
        self._unreported = 0
        self._count_lock = threading.Lock()
        self.executor = self._executor()
        self.dispatcher = Dispatcher(
            settings,
            registry,
            self.queue,
            executor=self.executor,
            jobs=self.jobs,
            metrics=self.metrics,
            health=self.health,
            draining=self.draining,
            wake=self.wake,
            start=self._start,
        )
        self.completions = Completions(
            self.settlement,
            running=lambda: self._unreported,
            finished=self._finished_group,
            after=self.dispatcher.refill,
        )
        self.heartbeat = HeartbeatLoop(
            self.queue,
            self.jobs,
            lease_seconds=settings.lease_seconds,
            interval=settings.heartbeat_seconds,
            metrics=self.metrics,
            health=self.health,
            give_up=self.give_up,
            register=self._every_interval,
            stopping=self.stopping,
            hint=PROCESS_HINT if settings.isolation is Isolation.PROCESS else THREAD_HINT,
        )
        self.listener = Listener(
            self.conninfo,
            settings.queues,
            self.wake.set,
            job_types=registry.job_types,
            health=self.health,
            stopping=self.stopping,
        )
        self._threads: list[threading.Thread] = []
        # Where no operator or `leaseq reaper` runs, one worker leads (leaseq.runtime.leading).
        self.leader = worker_leader(self.pool, settings.worker_id) if settings.lead else None
        # Set once on_startup has finished: until then the worker reports `loading`.
        self.startup_seconds: float | None = None
        self._registering = threading.Lock()
        self.health.loading = True
        self.metrics.loading.set(1)

    def _executor(self) -> Executor:
        """Slots per ``--isolation``; wrapped in :class:`Batching` when there are batch types."""
        s = self.settings

        def slots(on_done: OnDone) -> Executor:
            if s.isolation is Isolation.PROCESS:
                spec = ChildSpec(s.app, s.worker_id, s.log_level, s.log_format)
                started = self.metrics.children_started.inc
                return ProcessExecutor(s.concurrency, on_done, spec=spec, started=started)
            return ThreadExecutor(s.concurrency, on_done, startup=self.registry.run_startup)

        if self.registry.largest_batch > 1:
            return Batching(self.registry, self._handled, slots)
        return slots(self._handled)

    @property
    def _fields(self) -> dict[str, Any]:
        return {"worker": self.settings.worker_id}

    # -- lifecycle --------------------------------------------------------------------

    def run(self, signals: SignalWatch) -> int:
        """Serve until the first signal, drain, release what is left, deregister; returns
        the exit status (0 after a drain). A signal that arrived before start-up finished
        stops it without a single claim. ``signals`` is installed by the caller (the CLI),
        or triggered by code that embeds the worker."""
        s = self.settings
        log.info(
            "worker starting: queues %s, concurrency %d, lease %.1fs, heartbeat %.1fs",
            ",".join(s.queues),
            s.concurrency,
            s.lease_seconds,
            s.heartbeat_seconds,
            extra=self._fields,
        )
        if not self.registry.job_types:
            log.warning("%s registers no job types: this worker claims nothing", s.app)
        try:
            if self.http:
                self.http.start()
            if not self._wait_for_schema(signals):
                return 0
            self._declare_schedules()
            self._offer_to_lead()
            # The heartbeat loop keeps the registry row fresh while on_startup runs.
            self._start_loop("heartbeat", self.heartbeat.run, 3 * s.heartbeat_seconds + 60)
            self._load()
            if signals.count:
                # Stopped before it ever claimed: nothing to drain, no job touched.
                log.info("signal during start-up: stopping without claiming", extra=self._fields)
                return 0
            self._start_threads()
            seen = signals.wait(0, None)
            self.drain(signals, seen)
            return 0
        finally:
            self.stopping.set()
            self.wake.set()
            self.heartbeat.nudge.set()
            for thread in self._threads:
                thread.join(timeout=5.0)
            if self.leader is not None:
                self.leader.stop()
            self.executor.close(timeout=0.5)
            self._deregister()
            self.pool.close()
            if self.http:
                self.http.stop()
            self.settlement.tally.summary(self._fields, force=True)
            log.info("worker stopped", extra=self._fields)

    def _wait_for_schema(self, signals: SignalWatch) -> bool:
        """Wait (with backoff) until PostgreSQL answers with the schema this code needs;
        False if a signal arrived first. SchemaTooNew and other errors propagate."""
        backoff = Backoff(0.5, 10.0)
        while True:
            try:
                Schema(self.pool).check()
                self.health.db_ok()
                return True
            except (DatabaseUnavailable, SchemaNotReady) as exc:
                self.health.db_failed(exc)
                delay = backoff.next()
                log.warning("waiting for the database: %s (retry in %.1fs)", exc, delay)
                if signals.wait(0, delay) > 0:
                    return False

    def _declare_schedules(self) -> None:
        """Upsert the registry's schedules and disable the ones this app no longer declares
        (:meth:`leaseq.Schedules.declare`). A failure is logged and leaves the schedules as
        they were: it never stops the worker from running jobs."""
        try:
            Schedules(self.pool).declare(self.settings.app, self.registry.schedules)
        except LeaseqError as exc:
            log.warning("could not declare schedules: %s", exc, extra=self._fields)

    def _offer_to_lead(self) -> None:
        """Stand for the leader lease: this worker leads (reaps, ticks schedules, moves
        history) while no operator, ``leaseq reaper`` or other worker holds it."""
        if self.leader is None:
            return
        log.info(
            "offering to lead: this worker reaps, ticks schedules and moves history while it "
            "holds the leader lease (held by no operator, leaseq reaper or other worker)",
            extra=self._fields,
        )
        self.leader.start()

    def _load(self) -> None:
        """Run the on_startup hooks (a model load) while registered as ``loading``: not
        ready, not claiming, but counted by the operator as capacity already coming. Then
        record how long they took (row, metric, log) and report ``running``. An exception
        in a hook propagates: the worker exits without having claimed anything."""
        self.register()
        started = time.monotonic()
        # The executor runs the hooks where handlers run: here, or once in each child.
        self.executor.start()
        self.startup_seconds = time.monotonic() - started
        self.metrics.startup.set(self.startup_seconds)
        self.metrics.loading.set(0)
        self.health.loading = False
        log.info("on_startup finished in %.3fs", self.startup_seconds, extra=self._fields)
        self.register()

    def _start_loop(self, name: str, target: Callable[[], None], allowance: float) -> None:
        self.health.expect(name, allowance)
        thread = threading.Thread(target=target, name=f"leaseq-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _start_threads(self) -> None:
        s = self.settings
        self._start_loop("dispatcher", self.dispatcher.run, 3 * s.poll_seconds + 60)
        if s.listen:
            self._start_loop("listener", self.listener.run, 120.0)
        self._completions_thread = self.completions.start()

    # -- registry of workers ----------------------------------------------------------

    def register(self) -> None:
        """Upsert this worker's row (state and in-flight count); failures are logged only.
        Serialised, so a heartbeat's stale state never lands after a newer one."""
        s = self.settings
        try:
            with self._registering:
                self.workers.register(
                    s.worker_id,
                    pod=s.pod_name,
                    node=s.node_name,
                    queues=s.queues,
                    concurrency=s.concurrency,
                    state=self._state(),
                    in_flight=len(self.jobs),
                    startup_seconds=self.startup_seconds,
                    job_types=self.registry.job_types,
                    boot_at=self.boot_at,
                )
        except LeaseqError as exc:
            if isinstance(exc, NOT_READY_ERRORS):
                self.health.db_failed(exc)
            log.warning("could not update the workers table: %s", exc, extra=self._fields)
            return
        self.health.db_ok()
        self.metrics.last_heartbeat.set_to_current_time()

    def _every_interval(self) -> None:
        """The heartbeat loop's once-per-interval duty: refresh this worker's row, and log
        the summary of settled attempts when one is due."""
        self.register()
        self.settlement.tally.summary(self._fields)

    def _state(self) -> WorkerState:
        if self.draining.is_set():
            return WorkerState.DRAINING
        return WorkerState.LOADING if self.startup_seconds is None else WorkerState.RUNNING

    def _deregister(self) -> None:
        try:
            self.workers.remove(self.settings.worker_id)
        except LeaseqError as exc:
            log.warning("could not remove this worker's row: %s", exc, extra=self._fields)

    # -- starting a claimed attempt ----------------------------------------------------

    def _start(self, attempt: InFlight) -> None:
        """Hand a claimed attempt to the executor; give it straight back if SIGTERM arrived
        while its claim was in flight."""
        if self.draining.is_set():
            self.give_up(attempt, StopReason.DRAINING)
            self._finished(attempt)
            return
        if log.isEnabledFor(logging.DEBUG):
            log.debug("claimed", extra=attempt.fields())
        with self._count_lock:
            self._unreported += 1
        self.executor.submit(attempt)

    # -- a handler's outcome ------------------------------------------------------------

    def _handled(self, attempts: list[InFlight], outcomes: list[HandlerOutcome]) -> None:
        """The executor's report of a unit: its successes join one completion group (one
        statement for a batch); anything else is settled here with one statement per
        attempt. Unless the attempt was given up meanwhile."""
        with self._count_lock:
            self._unreported -= len(attempts)
        successes = []
        for attempt, outcome in zip(attempts, outcomes, strict=True):
            self.metrics.series(attempt.job.queue, attempt.job.job_type).duration.observe(
                outcome.seconds
            )
            if outcome.ending is Ending.RETURNED:
                done = self._success(attempt, outcome.value, outcome.spawn)
                if done is not None:
                    successes.append(done)
                continue
            try:
                if outcome.ending is Ending.BACK_OFF:
                    back_off = partial(
                        self.queue.back_off,
                        attempt.job.lease,
                        float(outcome.value),
                        reason=outcome.error or "told to back off",
                    )
                    self.settlement.settle(attempt, Call.RELEASE, back_off)
                elif outcome.ending is Ending.SLEPT:
                    sleep = partial(self.queue.sleep, attempt.job.lease, outcome.value)
                    self.settlement.settle(attempt, Call.RELEASE, sleep)
                elif outcome.ending is Ending.WAITING:
                    name, until = outcome.value
                    wait = partial(self.queue.wait, attempt.job.lease, name, until)
                    self.settlement.settle(attempt, Call.RELEASE, wait)
                elif outcome.ending is Ending.INTERRUPTED:
                    # Free only while the worker shuts down; otherwise it counts (bounded).
                    release = partial(
                        self.queue.release,
                        attempt.job.lease,
                        reason="handler interrupted",
                        shutdown=self.draining.is_set(),
                    )
                    self.settlement.settle(attempt, Call.RELEASE, release)
                else:
                    retryable = outcome.ending is not Ending.PERMANENT
                    if outcome.error_code == STEP_UNCERTAIN_CODE:
                        job = attempt.job
                        self.metrics.steps_uncertain.labels(job.queue, job.job_type).inc()
                    self._fail(
                        attempt, outcome.error, outcome.error_code, retryable, outcome.traceback
                    )
            except Exception:
                log.exception("error settling the attempt", extra=attempt.fields())
            finally:
                self._finished(attempt)
        if successes:
            self.completions.put(successes)

    def _finished(self, attempt: InFlight) -> None:
        """Free the attempt's slot and wake the dispatcher to claim for it."""
        self._finished_group([attempt])
        self.wake.set()

    def _finished_group(self, attempts: list[InFlight]) -> None:
        """Free the attempts' slots (the completion loop claims for its groups itself)."""
        self.jobs.remove(attempts)
        for queue, count in Counter(attempt.job.queue for attempt in attempts).items():
            self.metrics.in_flight.labels(queue).dec(count)

    def _success(self, attempt: InFlight, result: Any, spawn: Any = None) -> Done | None:
        """The attempt's result, final progress and spawned jobs, to complete; None (the
        attempt failed here) when the result cannot be stored or the spawned graph is
        invalid (a cycle, a bad job: retrying would not change it)."""
        try:
            validation.json_value("result", result)
            if spawn is not None:
                checked_plan(spawn)
        except InvalidJob as exc:
            # The handler's return value cannot be stored: retrying would not change it.
            error = PermanentError(f"handler returned an unusable result: {exc}")
            try:
                self._fail(
                    attempt,
                    f"PermanentError: {error}",
                    "PermanentError",
                    retryable=False,
                    traceback=format_traceback(exc),
                )
            finally:
                self._finished(attempt)
            return None
        progress, version = attempt.context.pending_progress()
        final = progress if version > attempt.sent_progress_version else None
        try:
            validation.json_value("progress", final, limit=65536)
        except InvalidJob:
            final = None  # the heartbeat already logged why it was not stored
        return Done(attempt, result, final, spawn)

    def _fail(
        self,
        attempt: InFlight,
        error: str,
        error_code: str,
        retryable: bool,
        traceback: str | None = None,
    ) -> None:
        call = partial(
            self.queue.fail,
            attempt.job.lease,
            error,
            retryable=retryable,
            error_code=error_code,
            traceback=traceback,
        )
        self.settlement.settle(attempt, Call.FAIL, call)

    def _on_connection(self, conn: Conn) -> None:
        # A session setting: not behind a transaction pooler (prepared statements off).
        if self.settings.prepared_statements:
            Queue.tune_worker_session(conn)
        self.server.check(conn)

    def _failed_over(self, change: str) -> None:
        """The pool reached another primary: every lease taken before is void there."""
        attempts = self.jobs.running()
        self.metrics.failovers.inc()
        log.warning("reconnected to %s: the %d lease(s) in flight are void; their handlers "
                    "are told to stop", change, len(attempts))  # fmt: skip
        for attempt in attempts:
            self.give_up(attempt, StopReason.LEASE_LOST)

    # -- giving up --------------------------------------------------------------------

    def give_up(self, attempt: InFlight, reason: StopReason) -> None:
        """Take the attempt away from its handler (which sees ``should_stop``) and settle it:
        failed as timed out, failed for lack of progress, released, or, when the lease is
        already gone, dropped without reporting anything."""
        if not attempt.take(Settler.stopped(reason)):
            return
        self.executor.stop(attempt, reason)
        # Where handlers can be killed (child processes), they are: the attempt is over,
        # and what the handler holds (a GPU's memory) is freed. Its outcome is then never
        # reported, so the attempt leaves the table once settled here.
        killed = self.executor.kill(attempt)
        lease = attempt.job.lease
        if reason in (StopReason.LEASE_LOST, StopReason.CANCELLED):
            if reason is StopReason.CANCELLED:
                # Asked for, not a fault: the attempt row already says cancelled (job_cancel).
                log.info("job cancelled: handler told to stop", extra=attempt.fields())
                self.settlement.cancelled(attempt)
            else:
                log.warning("lease lost: result will not be reported", extra=attempt.fields())
                self.settlement.lost(attempt)
            attempt.settled.set()
            if killed:
                self._forget(attempt)
            return
        call: Callable[[], Answer]
        if reason is StopReason.DRAINING:
            # Bounded: the pod's grace period is running out.
            until = time.monotonic() + SETTLE_GRACE_SECONDS
            release = partial(self.queue.release, lease, reason="worker draining")
            self.settlement.settle_taken(attempt, Call.RELEASE, release, until)
            if killed:
                self._forget(attempt)
            return
        if reason is StopReason.TIMED_OUT:
            error = f"timed out: ran past its max runtime of {attempt.job.timeout_seconds}s"
        else:
            limit = attempt.job_type.progress_timeout if attempt.job_type else None
            error = f"no progress reported for {limit}s"
        # Said when it happens: a thread cannot be killed, so its handler may run on for long
        # and the only later trace would be its result being refused.
        log.warning(
            "%s; %s",
            error,
            "handler killed" if killed else "handler told to stop, its result will be dropped",
            extra=attempt.fields(),
        )
        call = partial(
            self.queue.fail,
            lease,
            error,
            error_code=reason.name,
            timed_out=reason is StopReason.TIMED_OUT,
        )

        def settle() -> None:
            self.settlement.settle_taken(attempt, Call.FAIL, call)
            if killed:
                self._forget(attempt)

        # Off the heartbeat thread: retries must not delay other jobs' renewals.
        threading.Thread(target=settle, name=f"leaseq-giveup-{attempt.job.id}", daemon=True).start()

    def _forget(self, attempt: InFlight) -> None:
        """A killed attempt: its handler will never report, so its slot is free now."""
        with self._count_lock:
            self._unreported -= 1
        self._finished(attempt)

    # -- draining ---------------------------------------------------------------------

    def _release_between_steps(self, attempts: list[InFlight]) -> list[InFlight]:
        """Release (give up as draining) each of ``attempts`` still running that is not inside
        a step, and let none of them start another; the ones inside a step, left running.

        A step's function may be writing its effect (a payment, a row) that a released job's
        next attempt would reconcile too early, find missing and write again; in thread mode
        the function cannot even be stopped. So such a job keeps its lease (the heartbeat
        renews it) until the step is recorded or withdrawn, whatever signals arrive; its max
        runtime still ends it, and a SIGKILL leaves its lease to expire (database time)
        before another worker can claim it."""
        held = []
        for attempt in attempts:
            if not attempt.running:
                continue
            if attempt.context.close_steps():
                held.append(attempt)
            else:
                self.give_up(attempt, StopReason.DRAINING)
        return held

    def drain(self, signals: SignalWatch, seen: int) -> None:
        """Stop claiming now, let running attempts finish for ``drain_seconds``, then release
        what is left (at once on a second signal; a job inside a step once its step ended:
        :meth:`_release_between_steps`) and wait briefly for settling calls."""
        s = self.settings
        self.draining.set()
        self.health.draining = True
        self.metrics.draining.set(1)
        self.wake.set()
        log.info(
            "draining: %d job(s) in flight, up to %.1fs to finish",
            len(self.jobs.running()),
            s.drain_seconds,
            extra=self._fields,
        )
        self.register()
        end = time.monotonic() + s.drain_seconds
        while self.jobs.running() and time.monotonic() < end and signals.count <= seen:
            signals.wait(seen, min(0.1, max(0.0, end - time.monotonic())))
        if signals.count > seen:
            log.info("second signal: releasing in-flight jobs now", extra=self._fields)
        held = self._release_between_steps(self.jobs.running())
        if held:
            log.info(
                "drain window over: %d job(s) inside a step keep their lease until the step "
                "ends, then are released (SIGKILL stops the worker now: their leases then "
                "expire before another worker takes them)",
                len(held),
                extra=self._fields,
            )
        while held:
            signals.wait(signals.count, STEP_POLL_SECONDS)
            held = self._release_between_steps(held)
        if not self.jobs.wait_settled(SETTLE_GRACE_SECONDS):
            log.warning("some attempts were still settling at exit", extra=self._fields)
        # Results that arrived during the drain are queued; the loop delivers them first.
        self.completions.close()
        self._completions_thread.join(SETTLE_GRACE_SECONDS)
