"""The reaper: brings back jobs whose worker died, in exactly one operator replica at a time.

Two mechanisms, on purpose:

* **Who reaps** is decided by a leader lease in PostgreSQL (``leaseq.leader_leases``: holder,
  term, expiry in database time). The holder renews it every pass, only while the term it
  holds is still the row's term; a refused renewal steps it down at once. A renewal that
  fails (the database unreachable for a moment) keeps the term: the row is still this
  holder's until it expires, so the next pass renews it and reaps, instead of waiting a whole
  TTL for its own lease to lapse. A lease,
  not a session advisory lock, because it survives reconnects and poolers, is visible (who
  leads, since when, in which term), and expires by itself when its holder hangs. kopf
  peering is not used: it coordinates event handling, it is not a lock. The replica holding
  the lease is also the one that scales WorkerPools (see :mod:`leaseq_operator.handlers`).
* **That no two reap at once** is guaranteed by the transaction-scoped advisory lock every
  reap pass takes (``leader_reap_lock``) in the same transaction as the reap statement. A
  lease alone cannot promise that: a leader paused past its TTL (GC, a frozen node) still
  believes it leads when it wakes. The lock makes overlapping passes impossible, and the
  reap statement's ``SKIP LOCKED`` keeps even the rows safe. The same statement checks that
  the holder's term is still the lease's current one, so a leader that wakes after a takeover
  cannot act; and the pass's transaction is bounded by the TTL, so a reaper frozen mid-pass
  loses its session (and the lock) instead of blocking every other replica forever.

The same reaper runs without Kubernetes as ``leaseq reaper`` (:mod:`leaseq_operator.standalone`).

Every reaped job is logged with its previous owner and token, counted in
``leaseq_reaped_total{queue,outcome}``, and recorded in ``job_attempts`` by the statement.

After each pass the leader also runs the history duties (:mod:`leaseq.leader.history`:
moving finished jobs out of the hot table, retention), each guarded on its own, forgets
workers silent for ten minutes (a SIGKILLed pod never removes its own row from
``leaseq.workers``) and vacuums ``leaseq.jobs`` once it holds ``vacuum_dead_tuples`` dead
row versions (:meth:`leaseq.Queue.vacuum`): churn buries the claim index's head in dead
entries faster than autovacuum's once-a-minute wake-up clears them.

Then it ticks the schedules (:meth:`leaseq.Schedules.tick`), a duty whose correctness does
not depend on the lease (one job per slot is the slot key's); its failure is logged and
counted (``on_ticked`` gets None), never stopping the next reap pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from leaseq.core.errors import LeaseqError, PermissionDenied
from leaseq.core.flow import SETTLE_BATCH, FlowControl
from leaseq.core.leadership import Leadership
from leaseq.core.models import LeaderKind, LeaseHolder, Reaped
from leaseq.core.queue import Queue
from leaseq.core.schedule_models import Tick
from leaseq.core.schedules import Schedules
from leaseq.core.workers import Workers
from leaseq.leader.history import HistoryDuty

log = logging.getLogger("leaseq.leader.reaper")

LEASE_NAME = "reaper"
REAP_BATCH = 1000
#: Sweeps of the keys' turn one pass may run while each takes a whole batch out of it.
SETTLE_SWEEPS = 100
# Registry rows of workers silent this long are removed (ten times the operator's 60 s
# liveness horizon for leaseq_queue_workers, so a slow worker is never forgotten).
FORGET_WORKERS_AFTER = 600.0


@dataclass(frozen=True)
class Pass:
    """What one reaper pass did: ``leading`` after renewal, ``locked`` if it got the lock."""

    leading: bool
    locked: bool
    reaped: tuple[Reaped, ...] = ()


@dataclass
class LeaderLease:
    """This replica's view of the named lease: held while ``term`` is set and not lapsed."""

    leadership: Leadership
    holder: str
    ttl: float
    name: str = LEASE_NAME
    clock: Callable[[], float] = time.monotonic
    term: int = 0
    #: What this holder is: the database refuses a worker a lease an operator or reaper
    #: held last.
    kind: LeaderKind = LeaderKind.OPERATOR
    #: Who held the lease at the last refused renewal (None while this holder leads, and
    #: when nobody held it): what an operator reports when it cannot lead.
    other: LeaseHolder | None = field(default=None, init=False)
    _valid_until: float = field(default=0.0, init=False)
    _led_until: float = field(default=0.0, init=False)
    _yielding: bool = field(default=False, init=False)  # said that it yields to an operator

    @property
    def held(self) -> bool:
        """True while the last renewal succeeded less than a TTL ago (by the local clock)."""
        return self.term > 0 and self.clock() < self._valid_until

    @property
    def led_recently(self) -> bool:
        """True in the replica whose last successful renewal is less than a TTL old, even if
        a renewal failed since (the database is down: no other replica can have taken over
        within that TTL). It reports the outage on WorkerPools; it never reaps or scales."""
        return self.clock() < self._led_until

    def renew(self, now: datetime | None = None) -> bool:
        """Take or renew the lease; on refusal, step down. On a database error, re-raise and
        keep the term: the lease is still this holder's until it expires (``held`` lapses by
        the local clock meanwhile), so the next renewal takes it straight back."""
        started = self.clock()
        try:
            held = self.leadership.acquire(
                self.name, self.holder, term=self.term, ttl=self.ttl, kind=self.kind, now=now
            )
            self.other = None if held else self.leadership.holder(self.name, now)
        except LeaseqError as exc:
            # The reaper's loop says once per outage that passes fail (this runs every pass).
            log.debug(
                "reaper lease renewal failed (%s); keeping term %d", exc, self.term,
                extra={"holder": self.holder},
            )  # fmt: skip
            raise
        if held is None:
            self._step_down("another replica holds the lease")
            self._led_until = 0.0
            self._say_yielding()
            return False
        term = held.term
        if term != self.term:
            log.info("reaper lease acquired", extra={"holder": self.holder, "term": term})
        self.term = term
        self._valid_until = self._led_until = started + self.ttl
        return True

    def release(self) -> None:
        """Give the lease up (on shutdown) so another replica takes over without waiting."""
        if self.term:
            self.leadership.release(self.name, self.holder, term=self.term)
            # Asked for, not lost: an INFO line, so a clean shutdown warns nobody.
            log.info("reaper lease released", extra={"holder": self.holder, "term": self.term})
            self._forget()
        self._led_until = 0.0

    def _say_yielding(self) -> None:
        """Once: a worker says that it will not lead where an operator or reaper has led."""
        other = self.other
        if self._yielding or self.kind is not LeaderKind.WORKER or other is None:
            return
        if other.kind is not LeaderKind.WORKER:
            self._yielding = True
            log.info(
                "not leading: %s %s has led this database, and a worker never takes the "
                "leader lease from an operator or a leaseq reaper",
                other.kind.value, other.holder,
                extra={"holder": self.holder, "leader": other.holder},
            )  # fmt: skip

    def _step_down(self, why: str) -> None:
        if self.term:
            log.warning("reaper lease lost: %s", why, extra={"holder": self.holder})
        self._forget()

    def _forget(self) -> None:
        self.term = 0
        self._valid_until = 0.0


OnReaped = Callable[[Reaped], None]


@dataclass
class Reaper:
    """Reap passes under the lease and the lock; :meth:`start` runs them in a daemon thread."""

    lease: LeaderLease
    queue: Queue
    workers: Workers
    interval: float
    vacuum_dead_tuples: int = 0
    #: The history duties, run after every pass while leading, whatever the pass did.
    history: HistoryDuty | None = None
    on_reaped: OnReaped = lambda job: None
    on_leading: Callable[[bool], None] = lambda leading: None
    schedules: Schedules | None = None
    #: Called with each schedule tick's outcome, or None when the tick failed.
    on_ticked: Callable[[Tick | None], None] = lambda tick: None
    #: Flow control's duties after every pass: idle keys are deactivated, keys whose jobs
    #: are all due later sleep until shortly before, and every held unit of a limit
    #: belongs to a running attempt with the same token; others are freed and counted
    #: (expected: none).
    flow: FlowControl | None = None
    on_repaired: Callable[[dict[str, int]], None] = lambda repaired: None
    #: Stop for good when the database refuses a privilege, instead of retrying: for a
    #: worker that offers to lead, whose role may lack the operator's privileges.
    stop_when_refused: bool = False
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _failing: bool = field(default=False, init=False)  # in a database outage

    @property
    def leading(self) -> bool:
        return self.lease.held

    def run_once(self, now: datetime | None = None) -> Pass:
        """Renew the lease; if held, reap expired jobs holding the advisory lock."""
        try:
            leading = self.lease.renew(now)
        finally:
            self.on_leading(self.lease.held)
        if not leading:
            return Pass(leading=False, locked=False)
        try:
            return self._reap(now)
        finally:
            # A failed reap pass must not stop the history duties (nor they it: run() never
            # raises).
            if self.history is not None:
                self.history.run(now)

    def _reap(self, now: datetime | None) -> Pass:
        lease = self.lease
        with lease.leadership.reap_pass(
            lease.name, lease.holder, lease.term, ttl=lease.ttl, now=now
        ) as conn:
            if conn is None:
                log.warning("reap pass skipped: another reaper holds the lock, or the term ended")
                return Pass(leading=True, locked=False)
            reaper = f"{lease.holder} term {lease.term}"
            reaped = self.queue.reap(limit=REAP_BATCH, reaper=reaper, conn=conn, now=now)
        for job in reaped:
            self.on_reaped(job)
        self.workers.forget_silent(silent_for=FORGET_WORKERS_AFTER, now=now)
        self._repair_flow()
        self._tick_schedules(now)
        if self.vacuum_dead_tuples:
            self.queue.vacuum(min_dead_tuples=self.vacuum_dead_tuples)
        if reaped:
            log.info(
                "reaped %d jobs",
                len(reaped),
                extra={"holder": self.lease.holder, "term": self.lease.term},
            )
        return Pass(leading=True, locked=True, reaped=tuple(reaped))

    def reclaim(
        self, pod: str, node: str, finished_at: datetime, now: datetime | None = None
    ) -> tuple[Reaped, ...] | None:
        """End at once the leases of the workers that ran in ``pod``'s worker container,
        which the kubelet on ``node`` saw terminate at ``finished_at`` (by its clock): each
        job comes back as a reap brings back an expired one (its attempt counts, as any
        crash's does), fenced as a reap pass is (this holder's term, the pass lock). Workers
        that started later (a restarted container's) keep theirs. None when this replica does
        not lead, or another pass holds the lock (the caller may try again)."""
        if not self.leading:
            return None
        lease = self.lease
        with lease.leadership.reap_pass(
            lease.name, lease.holder, lease.term, ttl=lease.ttl, now=now
        ) as conn:
            if conn is None:
                return None
            owners = self.workers.terminated(pod, node, finished_at, conn)
            reaped = []
            if owners:
                reaper = f"{lease.holder} term {lease.term}"
                reaped = self.queue.reap(
                    limit=REAP_BATCH, reaper=reaper, owners=owners, conn=conn, now=now
                )
        for job in reaped:
            self.on_reaped(job)
        return tuple(reaped)

    def _repair_flow(self) -> None:
        if self.flow is None:
            return
        self._settle_keys(self.flow)
        try:
            repaired = self.flow.repair()
        except LeaseqError as exc:  # a duty's failure must not stop the reaper's others
            log.warning("flow-control slot check failed: %s", exc)
            return
        if repaired:
            log.warning(
                "freed %d unit(s) of per-key limits held by no running attempt (a bug: "
                "please report it)",
                sum(repaired.values()),
                extra={"repaired": repaired},
            )
        self.on_repaired(repaired)

    def _settle_keys(self, flow: FlowControl) -> None:
        """Sweep the front of each queue's turn (:meth:`FlowControl.settle`), again while a
        sweep took every key it looked at out of a queue's turn (a cancel of 10,000 keys'
        jobs is cleared in one pass, in short transactions), at most SETTLE_SWEEPS times."""
        idle = 0
        for _ in range(SETTLE_SWEEPS):
            try:
                # Woken three passes ahead of their next job: a late pass or two still
                # wakes them before it is due.
                settled = flow.settle(ahead=3 * self.interval, batch=SETTLE_BATCH)
            except LeaseqError as exc:  # a duty's failure must not stop the reaper's others
                log.warning("flow-control sweep of keys failed: %s", exc)
                break
            idle += sum(s.idle for s in settled.values())
            if all(s.idle + s.asleep < SETTLE_BATCH for s in settled.values()):
                break
        if idle:
            log.info("%d idle flow key(s) deactivated (their jobs ended without running)", idle)

    def _tick_schedules(self, now: datetime | None) -> None:
        if self.schedules is None:
            return
        try:
            tick = self.schedules.tick(now=now)
        except Exception as exc:  # a duty's failure must not stop the reaper's others
            log.warning("schedule tick failed: %s", exc, exc_info=not isinstance(exc, LeaseqError))
            self.on_ticked(None)
            return
        self.on_ticked(tick)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leaseq-reaper", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread, then release the lease so another replica takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            self.lease.release()
        except LeaseqError as exc:
            log.warning("could not release the reaper lease: %s", exc)
        self.on_leading(False)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            backlog = False
            try:
                backlog = len(self.run_once().reaped) == REAP_BATCH
            except PermissionDenied as exc:
                if self.stop_when_refused:
                    log.error(
                        "leader duties refused, not leading (run this process with the "
                        "operator's database role, or run `leaseq reaper` or the operator "
                        "with it): %s", exc, extra={"holder": self.lease.holder},
                    )  # fmt: skip
                    self.on_leading(False)
                    return
                self._failed(exc)
            except LeaseqError as exc:
                self._failed(exc)
            except Exception:
                log.exception("reaper pass failed unexpectedly")
            else:
                if self._failing:
                    log.info("reaper passes succeed again", extra={"term": self.lease.term})
                self._failing = False
            if not backlog:  # a full batch: more may be waiting, go again at once
                self._stop.wait(self.interval)

    def _failed(self, exc: LeaseqError) -> None:
        # Once per outage, not at every pass while it lasts; once more when it ends.
        if not self._failing:
            log.warning(
                "reaper passes fail, retrying every %gs (keeping term %d): %s",
                self.interval, self.lease.term, exc,
            )  # fmt: skip
        self._failing = True
