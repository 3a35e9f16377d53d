"""Two `leaseq reaper` processes tick a per-second schedule for over 40 slots, and the
leader is SIGKILLed on the way: every slot has exactly one job, and none is missing."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from test_faults_reaper import Start, leader, start_reaper

import leaseq
from support.polling import wait_for

pytestmark = pytest.mark.faults

__all__ = ["start_reaper"]  # the fixture, shared with the reaper's fault tests


def _slots(conn: leaseq.core.db.Conn) -> list[tuple[datetime, str, int | None]]:
    return conn.execute(
        "SELECT slot, outcome::text, job_id FROM leaseq.schedule_slots ORDER BY slot"
    ).fetchall()


def test_two_reapers_fire_every_slot_once_through_a_sigkill(
    conn: leaseq.core.db.Conn, start_reaper: Start
) -> None:
    # Catch-up covers the takeover (a 2 s lease), so the slots the dead leader did not fire
    # are backfilled by the next one: "none missing" holds through the kill.
    leaseq.Schedules(conn).add(
        leaseq.ScheduleSpec("every-second", "* * * * * *", queue="periodic", job_type="tick",
                            overlap=leaseq.Overlap.ALLOW, catchup_seconds=30)
    )  # fmt: skip
    procs = {name: start_reaper(name) for name in ("r1", "r2")}
    wait_for(lambda: len(_slots(conn)) >= 15, "15 slots fired", timeout=90)
    holder, _ = wait_for(lambda: leader(conn), "a reaper leader")
    procs[holder].kill()  # SIGKILL: wherever it is in its pass
    procs[holder].wait(timeout=10)
    start_reaper(f"{holder}-again")
    wait_for(lambda: len(_slots(conn)) >= 45, "45 slots fired", timeout=150)
    rows = _slots(conn)
    first = rows[0][0]
    assert [slot for slot, _, _ in rows] == [first + timedelta(seconds=i) for i in range(len(rows))]
    assert {outcome for _, outcome, _ in rows} == {"enqueued"}
    jobs = conn.execute(
        "SELECT id, idempotency_key FROM leaseq.jobs WHERE queue = 'periodic' ORDER BY id"
    ).fetchall()
    assert sorted(job_id for _, _, job_id in rows) == [job_id for job_id, _ in jobs][: len(rows)]
    keys = [key for _, key in jobs]
    assert len(keys) == len(set(keys))
