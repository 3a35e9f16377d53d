"""Schedules (``leaseq.Schedules``): periodic jobs, exactly one job per (schedule, slot).

::

    schedules = leaseq.Schedules(pool)
    schedules.add(leaseq.ScheduleSpec("nightly-reindex", "0 3 * * *", queue="batch",
                                      job_type="reindex", timezone="Europe/Berlin"))
    schedules.tick()       # what the leader's scheduler duty runs every pass

Guarantees:

* **One job per slot, whatever the number of schedulers.** A slot is fired by one statement
  (``schedule_fire``) that inserts its ``(name, slot)`` row into ``leaseq.schedule_slots``
  with ``ON CONFLICT DO NOTHING`` and, only if that insert happened, the job, in the same
  transaction. Two schedulers ticking at once, a leader change mid-tick or a replayed tick
  record the slot once. The slot rows are not in ``leaseq.jobs``: pruning finished jobs does
  not let a slot fire again, nor does removing and re-adding a schedule.
* **Read every tick.** Schedules are read from the database by every tick, so an edit, a
  pause or a removal is seen by the next tick, with no restart. A slot is only fired if the
  schedule's row is unchanged since the tick read it (``updated_at``).
* **Database time.** "Now" is the database's (``now=`` only in tests).
* **Catch-up.** A tick fires only slots after the last slot handled (and after the schedule's
  creation, resume, re-enable or change of cron or zone). By default only the latest of them
  fires; the others are counted as missed. ``catchup_seconds`` backfills every slot that recent.
* **Overlap.** With :attr:`Overlap.SKIP` (the default) a slot whose previous job is still
  pending or running is recorded as ``skipped`` and enqueues nothing: a failing job retrying
  never stacks copies, and the next slot after it finishes enqueues normally.

Daylight saving: see :mod:`leaseq.core.cron`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from leaseq.core import cron, tracing, validation
from leaseq.core._store.schedules import ScheduleStore
from leaseq.core.db import Db, borrow, transaction
from leaseq.core.errors import InvalidJob
from leaseq.core.models import JobStatus
from leaseq.core.schedule_models import (
    Coming,
    FiredSlot,
    NextSlot,
    Overlap,
    ScheduleNotFound,
    ScheduleOrigin,
    ScheduleRecord,
    ScheduleSpec,
    SlotOutcome,
    Tick,
)

log = logging.getLogger("leaseq.schedules")


def check_spec(spec: ScheduleSpec) -> ScheduleSpec:
    """``spec`` with its fields checked (and the overlap an enum); InvalidJob names the
    first bad field (a bad cron or time zone is quoted)."""
    validation.name("name", spec.name)
    cron.check_cron(spec.cron)
    cron.zone(spec.timezone)
    validation.queue_name(spec.queue)
    validation.name("job_type", spec.job_type)
    validation.json_value("payload", spec.payload)
    validation.priority(spec.priority)
    validation.attempts("max_attempts", spec.max_attempts)
    validation.non_negative("catchup_seconds", spec.catchup_seconds)
    gap = cron.shortest_gap(spec.cron)
    if gap < cron.PASS_SECONDS and spec.catchup_seconds < cron.PASS_SECONDS:
        raise InvalidJob(
            "catchup_seconds",
            f"{spec.cron!r} has slots {gap} s apart, closer than the leader's pass (every "
            f"{cron.PASS_SECONDS} s): a pass would fire only the latest slot and skip the "
            f"others. Give it catchup_seconds (--catchup) of at least {cron.PASS_SECONDS} s "
            f"(the default, {cron.DEFAULT_CATCHUP_SECONDS:g} s, fires every slot since the "
            "last pass), or a cron with slots further apart",
        )
    try:
        overlap = Overlap(spec.overlap)
    except ValueError as exc:
        raise InvalidJob("overlap", f"{spec.overlap!r} is not one of skip, allow") from exc
    return replace(spec, overlap=overlap)


class Schedules:
    """Schedules over one connection or a pool; each call is one statement or one short
    transaction (:meth:`declare`), and a tick fires each slot in its own statement."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._store = ScheduleStore()

    def add(self, spec: ScheduleSpec, *, now: datetime | None = None) -> bool:
        """Create a run-time schedule, or update the run-time schedule of that name (seen by
        the next tick); True when created. Its first slot is the first one after now.
        InvalidJob for a bad field, or a name a worker's code declares."""
        spec = check_spec(spec)
        with borrow(self._db, "add schedule") as c:
            row = self._store.schedule_put(
                c, spec, declared_by=ScheduleOrigin.RUNTIME, declared_in=None, now=now
            )
        if row is None:
            raise InvalidJob("name", f"schedule {spec.name!r} is declared in code; change it there")
        return bool(row["created"])

    def declare(
        self, app: str, specs: Sequence[ScheduleSpec], *, now: datetime | None = None
    ) -> list[str]:
        """Upsert the schedules the app ``app`` (``package.module:registry``) declares in code,
        and disable (never delete) the enabled ones it declared before and no longer does;
        one transaction. Returns the names disabled. A name taken by a run-time schedule is
        left alone and logged. Paused stays paused."""
        checked = [check_spec(spec) for spec in specs]
        with transaction(self._db, "declare schedules") as c:
            for spec in checked:
                row = self._store.schedule_put(
                    c, spec, declared_by=ScheduleOrigin.CODE, declared_in=app, now=now
                )
                if row is None:
                    log.warning(
                        "schedule %r is declared in %s but a run-time schedule has that name;"
                        " keeping the run-time one",
                        spec.name,
                        app,
                    )
            disabled = self._store.schedule_disable_undeclared(
                c, app=app, names=[s.name for s in checked], now=now
            )
        for name in disabled:
            log.warning("schedule %r disabled: no longer declared by %s", name, app)
        return disabled

    def pause(self, name: str, *, now: datetime | None = None) -> None:
        """Stop firing ``name`` from the next tick on; ScheduleNotFound if there is none."""
        self._set_paused(name, True, now)

    def resume(self, name: str, *, now: datetime | None = None) -> None:
        """Fire ``name`` again from its next slot (slots that fell while paused never fire)."""
        self._set_paused(name, False, now)

    def _set_paused(self, name: str, paused: bool, now: datetime | None) -> None:
        with borrow(self._db, "pause schedule") as c:
            if not self._store.schedule_set_paused(c, name=name, paused=paused, now=now):
                raise ScheduleNotFound(name)

    def remove(self, name: str) -> None:
        """Delete ``name`` (its slot records stay: adding it again never re-fires a slot);
        ScheduleNotFound if there is none. A schedule declared in code comes back when a
        worker declaring it starts: remove it from the code."""
        with borrow(self._db, "remove schedule") as c:
            if not self._store.schedule_delete(c, name=name):
                raise ScheduleNotFound(name)

    def list(self, name: str | None = None, *, now: datetime | None = None) -> list[ScheduleRecord]:
        """Every schedule (or ``name``, ScheduleNotFound if absent) with its next slot."""
        with borrow(self._db, "list schedules") as c:
            rows = self._store.schedule_list(c, name=name, now=now)
        if name is not None and not rows:
            raise ScheduleNotFound(name)
        return [_record(row) for row in rows]

    def get(self, name: str, *, now: datetime | None = None) -> ScheduleRecord:
        return self.list(name, now=now)[0]

    def coming(
        self, queues: Sequence[str], *, horizon: float, now: datetime | None = None
    ) -> Coming:
        """What ``queues`` will have after now, in one statement: the pending jobs due within
        ``horizon`` seconds (delayed jobs, retries in backoff), and the next slot of every
        enabled, unpaused schedule that enqueues into them (a slot that fell but was not fired
        yet is due now). A schedule whose zone or cron this system cannot read has no next
        slot here (its tick reports it)."""
        validation.non_negative("horizon", horizon)
        with borrow(self._db, "read what is due") as c:
            rows = self._store.pool_due(c, queues=queues, horizon=horizon, now=now)
        slots: list[NextSlot] = []
        for row in rows:
            if row.name is None or row.cron is None or row.timezone is None:
                continue  # the row of a pool without schedules
            try:
                tz = cron.zone(row.timezone)
                last = next(cron.slots_back(row.cron, tz, row.now))
                unfired = row.handled is None or last > row.handled
                at = row.now if unfired else cron.next_slot(row.cron, tz, row.now)
            except ValueError:
                continue
            slots.append(NextSlot(row.name, str(row.job_type), at))
        return Coming(rows[0].now, rows[0].delayed, tuple(slots))

    def tick(self, *, now: datetime | None = None) -> Tick:
        """Fire every due slot of every active schedule (see the module's guarantees). A
        schedule that fails is logged and reported in ``Tick.failed``; the others still fire.
        A database outage raises (translated) for the caller's duty loop to count."""
        with borrow(self._db, "read schedules") as c:
            rows = self._store.schedule_due(c, now=now)
        fired: list[FiredSlot] = []
        failed: dict[str, str] = {}
        missed_total = 0
        for row in rows:
            name = str(row["name"])
            after = max(row["fire_after"], row["last_slot"] or row["fire_after"])
            try:
                slots, missed = cron.due(
                    row["cron"],
                    cron.zone(row["timezone"]),
                    now=row["now"],
                    after=after,
                    catchup_seconds=row["catchup_seconds"],
                )
                for i, slot in enumerate(slots):
                    with (
                        tracing.schedule_span(name, slot) as span,
                        borrow(self._db, "fire schedule") as c,
                    ):
                        done = self._store.schedule_fire(
                            c,
                            name=name,
                            slot=slot,
                            version=row["updated_at"],
                            missed=missed if i == 0 else 0,
                            trace_context=tracing.current_carrier(),
                            now=now,
                        )
                        if done is not None and done["job_id"] is not None:
                            tracing.enqueued(span, [int(done["job_id"])])
                    if done is None:
                        break  # another scheduler fired it, or the schedule changed: next tick
                    fired.append(_fired(name, done))
                    if i == 0:
                        missed_total += missed
            # A zone the system's tzdata no longer has, or a stored cron this croniter refuses
            # (InvalidJob is a ValueError): that schedule waits, the others fire.
            except ValueError as exc:
                failed[name] = str(exc)
                log.error("schedule %r cannot fire: %s", name, exc)
        for record in fired:
            log.info(
                "schedule %s slot %s %s",
                record.schedule,
                record.slot.isoformat(),
                record.outcome,
                extra={"schedule": record.schedule, "job_id": record.job_id},
            )
        return Tick(tuple(fired), missed_total, failed)


def _fired(name: str, row: Any) -> FiredSlot:
    return FiredSlot(name, row["slot"], SlotOutcome(row["outcome"]), row["job_id"])


def _record(row: Any) -> ScheduleRecord:
    next_slot: datetime | None = None
    late: float | None = None
    try:
        tz = cron.zone(row["timezone"])
        next_slot = cron.next_slot(row["cron"], tz, row["now"])
        if row["enabled"] and not row["paused"]:
            due = next(cron.slots_back(row["cron"], tz, row["now"]))
            handled = max(row["fire_after"], row["last_slot"] or row["fire_after"])
            late = (row["now"] - due).total_seconds() if due > handled else 0.0
    except InvalidJob:
        pass  # a zone the system no longer knows: shown without next slot or lateness
    status = row["last_job_status"]
    return ScheduleRecord(
        name=row["name"],
        cron=row["cron"],
        timezone=row["timezone"],
        queue=row["queue"],
        job_type=row["job_type"],
        payload=row["payload"],
        priority=row["priority"],
        max_attempts=row["max_attempts"],
        overlap=Overlap(row["overlap"]),
        catchup_seconds=row["catchup_seconds"],
        paused=row["paused"],
        enabled=row["enabled"],
        declared_by=ScheduleOrigin(row["declared_by"]),
        declared_in=row["declared_in"],
        disabled_reason=row["disabled_reason"],
        fire_after=row["fire_after"],
        last_slot=row["last_slot"],
        last_job_id=row["last_job_id"],
        last_job_status=JobStatus(status) if status is not None else None,
        missed_slots=row["missed_slots"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        next_slot=next_slot,
        lag_seconds=row["lag_seconds"],
        late_seconds=late,
    )
