"""The scheduler as a leader duty beside the reap pass: it fires slots, and its failure is
logged and counted without stopping the reap."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from psycopg_pool import ConnectionPool

import leaseq
from leaseq.leader.reaper import LeaderLease, Reaper
from leaseq_operator.metrics import OperatorMetrics

Pool = ConnectionPool[leaseq.core.db.Conn]


@pytest.fixture
def db_now(conn: leaseq.core.db.Conn) -> datetime:
    now: datetime = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    return now


def _reaper(pool: Pool, metrics: OperatorMetrics) -> Reaper:
    return Reaper(
        LeaderLease(leaseq.Leadership(pool), "op-a", ttl=15),
        leaseq.Queue(pool),
        leaseq.Workers(pool),
        interval=60,
        schedules=leaseq.Schedules(pool),
        on_ticked=metrics.count_tick,
    )


def _slots(metrics: OperatorMetrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value("leaseq_schedule_slots_total", {"outcome": outcome})
    assert value is not None
    return value


def test_the_reap_pass_ticks_the_schedules(
    pool: Pool, conn: leaseq.core.db.Conn, db_now: datetime
) -> None:
    metrics = OperatorMetrics()
    leaseq.Schedules(conn).add(
        leaseq.ScheduleSpec("minutely", "* * * * *", queue="periodic", job_type="tick"),
        now=db_now - timedelta(minutes=5),
    )
    metrics.watch_schedules(leaseq.Schedules(pool))
    # Computed from the database at scrape time: late while no scheduler has run.
    late = metrics.registry.get_sample_value("leaseq_schedule_late_seconds")
    assert late is not None and late > 0
    _reaper(pool, metrics).run_once(now=db_now)
    assert _slots(metrics, "enqueued") == 1
    assert _slots(metrics, "missed") == 4
    assert _slots(metrics, "failed") == 0
    assert conn.execute("SELECT count(*) FROM leaseq.jobs WHERE queue = 'periodic'").fetchone() == (
        1,
    )


def test_a_failing_tick_is_counted_and_never_stops_the_reap(
    pool: Pool, conn: leaseq.core.db.Conn, db_now: datetime, caplog: pytest.LogCaptureFixture
) -> None:
    queue = leaseq.Queue(conn)
    started = db_now - timedelta(minutes=5)
    job = queue.enqueue("ocr", "extract", now=started).job_id
    queue.claim(["ocr"], "crashed-worker", lease_seconds=30, now=started)
    # A real failure: the statement's table is missing (a half-applied restore, say).
    conn.execute("ALTER TABLE leaseq.schedules RENAME TO schedules_elsewhere")
    metrics = OperatorMetrics()
    reaper = _reaper(pool, metrics)
    done = reaper.run_once(now=db_now)
    assert [r.job_id for r in done.reaped] == [job]
    assert _slots(metrics, "failed") == 1
    assert "schedule tick failed" in caplog.text
    conn.execute("ALTER TABLE leaseq.schedules_elsewhere RENAME TO schedules")
    reaper.run_once(now=db_now)
    assert _slots(metrics, "failed") == 1
