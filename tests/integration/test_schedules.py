"""Schedules on a real PostgreSQL with a controlled clock: one job per slot under concurrent
schedulers, daylight saving, catch-up, pause/resume, edits seen by the next tick, overlap,
dedup that survives pruning and re-adding, and schedules the code no longer declares."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta

import pytest

import leaseq
from leaseq import Overlap, ScheduleSpec, ScheduleState, SlotOutcome

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def spec(name: str = "every-minute", cron: str = "* * * * *", **fields: object) -> ScheduleSpec:
    """A schedule of job type ``tick`` on queue ``periodic``; overlap allowed unless a test
    says otherwise (nothing runs the jobs here, so skipping would hide every later slot)."""
    fields.setdefault("overlap", Overlap.ALLOW)
    return ScheduleSpec(name, cron, queue=str(fields.pop("queue", "periodic")),
                        job_type="tick", **fields)  # type: ignore[arg-type]  # fmt: skip


def jobs(conn: leaseq.core.db.Conn) -> list[tuple[int, str]]:
    """(id, queue) of every job, oldest first."""
    return conn.execute("SELECT id, queue FROM leaseq.jobs ORDER BY id").fetchall()


def slot_rows(conn: leaseq.core.db.Conn, name: str) -> list[tuple[datetime, str, int | None]]:
    return conn.execute(
        "SELECT slot, outcome::text, job_id FROM leaseq.schedule_slots WHERE name = %s"
        " ORDER BY slot",
        (name,),
    ).fetchall()


@pytest.fixture
def schedules(conn: leaseq.core.db.Conn) -> leaseq.Schedules:
    return leaseq.Schedules(conn)


def test_concurrent_schedulers_make_exactly_one_job_per_slot(
    database_url: str, conn: leaseq.core.db.Conn
) -> None:
    """Six schedulers on their own connections tick at the same instants over 100 slots of a
    per-second schedule; each slot gets one job, none is missing."""
    leaseq.Schedules(conn).add(spec("per-second", "* * * * * *"), now=T0 - timedelta(seconds=0.5))
    schedulers, slots = 6, 100
    barrier = threading.Barrier(schedulers)
    fired: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with leaseq.connect(database_url, action="test") as c:
                mine = leaseq.Schedules(c)
                for i in range(slots):
                    barrier.wait()
                    fired.extend(s.job_id for s in mine.tick(now=T0 + timedelta(seconds=i)).fired)  # type: ignore[misc]
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run) for _ in range(schedulers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    expected = [T0 + timedelta(seconds=i) for i in range(slots)]
    assert [row[0] for row in slot_rows(conn, "per-second")] == expected
    assert len(jobs(conn)) == slots
    assert sorted(fired) == sorted(row[0] for row in jobs(conn))
    keys = conn.execute("SELECT count(DISTINCT idempotency_key) FROM leaseq.jobs").fetchone()
    assert keys == (slots,)


def _tick_through(
    schedules: leaseq.Schedules, start: datetime, end: datetime, step: timedelta
) -> None:
    at = start
    while at <= end:
        schedules.tick(now=at)
        at += step


def test_spring_forward_gap_fires_once_just_after_the_gap(
    schedules: leaseq.Schedules, conn: leaseq.core.db.Conn
) -> None:
    # Europe/Berlin, 29 March 2026: 02:00 CET -> 03:00 CEST at 01:00 UTC; 02:30 never happens.
    start = datetime(2026, 3, 27, 12, tzinfo=UTC)
    schedules.add(spec("nightly", "30 2 * * *", timezone="Europe/Berlin"), now=start)
    _tick_through(schedules, start, start + timedelta(days=3), timedelta(minutes=20))
    assert [row[0] for row in slot_rows(conn, "nightly")] == [
        datetime(2026, 3, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # 03:00 CEST, the end of the gap
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),  # 02:30 CEST
    ]
    assert len(jobs(conn)) == 3


def test_fall_back_hour_fires_each_wall_clock_slot_once(
    schedules: leaseq.Schedules, conn: leaseq.core.db.Conn
) -> None:
    # America/New_York, 1 November 2026: 02:00 EDT -> 01:00 EST at 06:00 UTC; 01:xx twice.
    start = datetime(2026, 11, 1, 3, tzinfo=UTC)
    schedules.add(spec("half-hourly", "*/30 * * * *", timezone="America/New_York"), now=start)
    _tick_through(schedules, start, start + timedelta(hours=5), timedelta(minutes=5))
    assert [row[0].astimezone(leaseq.core.cron.zone("America/New_York")).strftime("%H:%M %Z")
            for row in slot_rows(conn, "half-hourly")] == [
        "23:30 EDT", "00:00 EDT", "00:30 EDT", "01:00 EDT", "01:30 EDT",  # first 01:xx
        "02:00 EST", "02:30 EST", "03:00 EST",  # no second 01:00 or 01:30
    ]  # fmt: skip


def test_after_downtime_only_the_latest_missed_slot_fires(
    schedules: leaseq.Schedules, conn: leaseq.core.db.Conn
) -> None:
    schedules.add(spec(), now=T0 - timedelta(seconds=1))
    assert len(schedules.tick(now=T0).fired) == 1
    later = T0 + timedelta(minutes=10, seconds=5)
    assert schedules.get("every-minute", now=later).late_seconds == 5.0  # 12:10 not fired
    tick = schedules.tick(now=later)
    assert [s.slot for s in tick.fired] == [T0 + timedelta(minutes=10)]
    assert tick.missed == 9
    record = schedules.get("every-minute", now=T0 + timedelta(minutes=10, seconds=5))
    assert record.missed_slots == 9
    assert record.last_slot == T0 + timedelta(minutes=10)
    assert record.lag_seconds == 5.0
    assert record.next_slot == T0 + timedelta(minutes=11)
    assert record.late_seconds == 0.0
    assert len(jobs(conn)) == 2


def test_a_schedule_finer_than_the_pass_without_catch_up_is_refused(
    schedules: leaseq.Schedules,
) -> None:
    """Slots closer than the leader's pass (5 s) with no catch-up window: a pass would fire
    only the latest and skip the rest (``*/2`` made 4 jobs in 28 s); refused with the reason,
    by add and by a code declaration alike."""
    fine = spec("fine", "*/2 * * * * *", catchup_seconds=0)
    says = r"slots 2 s apart.*pass \(every 5 s\).*catchup_seconds \(--catchup\) of at least 5"
    with pytest.raises(leaseq.InvalidJob, match=says):
        schedules.add(fine)
    with pytest.raises(leaseq.InvalidJob, match=says):
        schedules.declare("app.jobs:registry", [fine])
    with pytest.raises(leaseq.ConfigError, match=says):
        leaseq.Registry().schedule("fine", "*/2 * * * * *", queue="periodic", job_type="tick",
                                   catchup_seconds=0)  # fmt: skip
    assert schedules.list() == []
    schedules.add(spec("coarse", "*/5 * * * * *", catchup_seconds=0))  # one slot per pass


def test_by_default_a_fine_schedule_and_a_leader_takeover_skip_no_slot(
    schedules: leaseq.Schedules, conn: leaseq.core.db.Conn
) -> None:
    """Passes every 5 s over a ``*/2`` schedule, then a takeover's 20 s without a pass: with
    the default catch-up every slot fires (late by at most a pass), none is missed."""
    schedules.add(spec("fine", "*/2 * * * * *"), now=T0 - timedelta(seconds=0.5))
    passes = [T0 + timedelta(seconds=s) for s in (0, 5, 10, 15, 20, 25, 45, 50)]
    ticks = [schedules.tick(now=at) for at in passes]
    assert sum(t.missed for t in ticks) == 0
    fired = [row[0] for row in slot_rows(conn, "fine")]
    assert fired == [T0 + timedelta(seconds=s) for s in range(0, 51, 2)]
    assert len(jobs(conn)) == 26


def test_a_catch_up_window_backfills_oldest_first(schedules: leaseq.Schedules) -> None:
    schedules.add(spec(catchup_seconds=180), now=T0 - timedelta(seconds=1))
    tick = schedules.tick(now=T0 + timedelta(minutes=10))
    assert [s.slot for s in tick.fired] == [T0 + timedelta(minutes=m) for m in (7, 8, 9, 10)]
    assert tick.missed == 7  # 12:00 .. 12:06


def test_pause_and_resume(schedules: leaseq.Schedules, conn: leaseq.core.db.Conn) -> None:
    schedules.add(spec(), now=T0 - timedelta(seconds=1))
    schedules.tick(now=T0)
    schedules.pause("every-minute", now=T0 + timedelta(seconds=10))
    paused = schedules.get("every-minute", now=T0 + timedelta(minutes=5))
    assert (paused.state, paused.late_seconds) == (ScheduleState.PAUSED, None)
    assert schedules.tick(now=T0 + timedelta(minutes=5)).fired == ()
    schedules.resume("every-minute", now=T0 + timedelta(minutes=5, seconds=30))
    # The slots that fell while paused never fire; the next one does.
    assert schedules.tick(now=T0 + timedelta(minutes=5, seconds=40)).fired == ()
    tick = schedules.tick(now=T0 + timedelta(minutes=6))
    assert [s.slot for s in tick.fired] == [T0 + timedelta(minutes=6)]
    assert len(jobs(conn)) == 2
    with pytest.raises(leaseq.ScheduleNotFound, match="no schedule named 'nope'"):
        schedules.pause("nope")


def test_an_edit_is_seen_by_the_next_tick(
    schedules: leaseq.Schedules, conn: leaseq.core.db.Conn
) -> None:
    schedules.add(spec("report", "0 * * * *"), now=T0 - timedelta(seconds=1))
    assert len(schedules.tick(now=T0).fired) == 1
    assert (
        schedules.add(spec("report", "*/5 * * * *", queue="reports"), now=T0 + timedelta(minutes=1))
        is False
    )
    tick = schedules.tick(now=T0 + timedelta(minutes=5))
    assert [s.slot for s in tick.fired] == [T0 + timedelta(minutes=5)]
    assert [q for _, q in jobs(conn)] == ["periodic", "reports"]


def test_a_tick_that_read_a_schedule_before_an_edit_does_not_fire_it(
    schedules: leaseq.Schedules, conn: leaseq.core.db.Conn
) -> None:
    schedules.add(spec(), now=T0 - timedelta(seconds=1))
    store = leaseq.core._store.schedules.ScheduleStore()
    (read,) = store.schedule_due(conn, now=T0)
    schedules.pause("every-minute", now=T0)
    assert store.schedule_fire(conn, name="every-minute", slot=T0, version=read["updated_at"],
                               missed=0, now=T0) is None  # fmt: skip
    assert jobs(conn) == []


@pytest.mark.parametrize(
    "edit",
    [
        {"cron": "*/2 * * * *"},
        {"payload": {"report": "weekly"}},
        {"queue": "reports"},
    ],
    ids=["cron", "payload", "queue"],
)
def test_a_tick_that_read_a_schedule_before_an_edit_of_its_fields_does_not_fire_it(
    schedules: leaseq.Schedules, conn: leaseq.core.db.Conn, edit: dict[str, object]
) -> None:
    """The version guard alone: the schedule stays enabled and unpaused (which the fire
    statement refuses on their own), only a field the tick's slot came from changed."""
    schedules.add(spec(), now=T0 - timedelta(seconds=1))
    store = leaseq.core._store.schedules.ScheduleStore()
    (read,) = store.schedule_due(conn, now=T0)
    schedules.add(spec(**edit), now=T0)
    assert store.schedule_fire(conn, name="every-minute", slot=T0, version=read["updated_at"],
                               missed=0, now=T0) is None  # fmt: skip
    assert jobs(conn) == []
    assert slot_rows(conn, "every-minute") == []


def test_overlap_skip_records_the_slot_and_stacks_no_copies(
    schedules: leaseq.Schedules, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    # No catch-up: the tick an hour later fires one slot (the latest), not the minute before.
    schedules.add(spec(overlap=Overlap.SKIP, catchup_seconds=0), now=T0 - timedelta(seconds=1))
    (first,) = schedules.tick(now=T0).fired
    (claimed,) = queue.claim(["periodic"], "w1", now=T0 + timedelta(seconds=50))
    (skipped,) = schedules.tick(now=T0 + timedelta(minutes=1)).fired  # first still running
    assert skipped.outcome is SlotOutcome.SKIPPED and skipped.job_id is None
    queue.fail(claimed.lease, "boom", retryable=True, now=T0 + timedelta(minutes=1, seconds=5))
    # Retrying (pending again): still no second copy.
    assert schedules.tick(now=T0 + timedelta(minutes=2)).fired[0].outcome is SlotOutcome.SKIPPED
    (again,) = queue.claim(["periodic"], "w1", now=T0 + timedelta(hours=1))
    queue.complete(again.lease, {"ok": True}, now=T0 + timedelta(hours=1))
    (third,) = schedules.tick(now=T0 + timedelta(hours=1, minutes=1)).fired
    assert third.outcome is SlotOutcome.ENQUEUED and third.job_id != first.job_id
    assert [o for _, o, _ in slot_rows(conn, "every-minute")] == [
        "enqueued",
        "skipped",
        "skipped",
        "enqueued",
    ]


def test_overlap_allow_enqueues_while_the_previous_job_is_unfinished(
    schedules: leaseq.Schedules, conn: leaseq.core.db.Conn
) -> None:
    schedules.add(spec(overlap=Overlap.ALLOW), now=T0 - timedelta(seconds=1))
    schedules.tick(now=T0)
    schedules.tick(now=T0 + timedelta(minutes=1))
    assert len(jobs(conn)) == 2


def test_dedup_survives_pruning_every_finished_job(
    schedules: leaseq.Schedules, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    schedules.add(spec(), now=T0 - timedelta(seconds=1))
    schedules.tick(now=T0)
    (claimed,) = queue.claim(["periodic"], "w1", now=T0)
    queue.complete(claimed.lease, None, now=T0)
    assert queue.prune(older_than=0, now=T0 + timedelta(days=1)) == 1
    assert jobs(conn) == []
    # A scheduler that read the schedule before that slot was fired (a replayed tick):
    conn.execute("UPDATE leaseq.schedules SET last_slot = NULL")
    assert schedules.tick(now=T0 + timedelta(seconds=30)).fired == ()
    assert jobs(conn) == []


def test_remove_then_add_does_not_fire_a_slot_twice(
    schedules: leaseq.Schedules, conn: leaseq.core.db.Conn
) -> None:
    schedules.add(spec(), now=T0 - timedelta(seconds=1))
    schedules.tick(now=T0)
    schedules.remove("every-minute")
    with pytest.raises(leaseq.ScheduleNotFound):
        schedules.remove("every-minute")
    assert schedules.add(spec(), now=T0 + timedelta(seconds=20)) is True
    assert schedules.tick(now=T0 + timedelta(seconds=30)).fired == ()
    # Even re-added with its creation before the slot, the slot row keeps it at one job.
    conn.execute("UPDATE leaseq.schedules SET fire_after = %s", (T0 - timedelta(seconds=5),))
    assert schedules.tick(now=T0 + timedelta(seconds=40)).fired == ()
    assert len(jobs(conn)) == 1


def test_a_schedule_the_code_no_longer_declares_is_disabled_not_deleted(
    schedules: leaseq.Schedules, conn: leaseq.core.db.Conn
) -> None:
    app = "myapp.jobs:registry"
    assert schedules.declare(app, [spec("a"), spec("b")], now=T0 - timedelta(seconds=1)) == []
    assert schedules.declare(app, [spec("a")], now=T0 - timedelta(seconds=1)) == ["b"]
    b = schedules.get("b")
    assert b.state is ScheduleState.DISABLED
    assert b.disabled_reason == f"no longer declared by {app}"
    assert b.declared_by is leaseq.ScheduleOrigin.CODE
    assert [s.schedule for s in schedules.tick(now=T0).fired] == ["a"]
    # Another app's declarations leave it alone; declaring it again enables it.
    assert schedules.declare("other:registry", [], now=T0) == []
    schedules.declare(app, [spec("a"), spec("b")], now=T0 + timedelta(seconds=30))
    assert schedules.get("b").state is ScheduleState.ACTIVE
    assert [s.schedule for s in schedules.tick(now=T0 + timedelta(minutes=1)).fired] == ["a", "b"]


def test_code_and_run_time_schedules_do_not_overwrite_each_other(
    schedules: leaseq.Schedules,
) -> None:
    schedules.declare("myapp:registry", [spec("nightly", "0 3 * * *")])
    with pytest.raises(leaseq.InvalidJob, match="'nightly' is declared in code"):
        schedules.add(spec("nightly", "0 4 * * *"))
    schedules.add(spec("adhoc"))
    schedules.declare("myapp:registry", [spec("adhoc", "0 5 * * *")])
    assert schedules.get("adhoc").cron == "* * * * *"


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"cron": "0 25 * * *"}, "invalid cron: '0 25 * * *' is not a cron expression"),
        ({"timezone": "Europe/Atlantis"}, "invalid timezone: 'Europe/Atlantis' is not an IANA"),
        ({"queue": "no spaces"}, "invalid queue"),
    ],
)
def test_bad_input_is_named_and_nothing_is_written(
    schedules: leaseq.Schedules, fields: dict[str, str], says: str
) -> None:
    cron = fields.pop("cron", "* * * * *")
    with pytest.raises(leaseq.InvalidJob, match=re.escape(says)):
        schedules.add(spec("bad", cron, **fields))
    assert schedules.list() == []
