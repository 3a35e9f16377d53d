"""The reaper's singleton: a leader lease with a term in PostgreSQL, and the advisory lock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

import leaseq
from leaseq.leader.reaper import LeaderLease, Reaper
from support.polling import wait_for


class Clock:
    """A local monotonic clock the test moves (the lease's validity is measured on it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pooled(pool: ConnectionPool[leaseq.core.db.Conn]) -> leaseq.Queue:
    return leaseq.Queue(pool)


@pytest.fixture
def db_now(conn: leaseq.core.db.Conn) -> datetime:
    now: datetime = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    return now


Pool = ConnectionPool[leaseq.core.db.Conn]


def _lease(pool: Pool, holder: str, **kwargs: Any) -> LeaderLease:
    return LeaderLease(leaseq.Leadership(pool), holder, **kwargs)


def _reaper(pool: Pool, lease: LeaderLease, **kwargs: Any) -> Reaper:
    return Reaper(lease, leaseq.Queue(pool), leaseq.Workers(pool), **kwargs)


def _leading(pool: Pool, holder: str, clock: Clock | None = None) -> Reaper:
    return _reaper(pool, _lease(pool, holder, ttl=15, clock=clock or Clock()), interval=60)


def _expired_jobs(queue: leaseq.Queue, now: datetime, count: int) -> list[int]:
    started = now - timedelta(minutes=5)
    ids = [queue.enqueue("ocr", "extract", now=started).job_id for _ in range(count)]
    queue.claim(["ocr"], "crashed-worker", limit=count, lease_seconds=30, now=started)
    return ids


def test_one_of_two_reapers_leads_and_reaps(
    pooled: leaseq.Queue, db_now: datetime, pool: Pool
) -> None:
    ids = _expired_jobs(pooled, db_now, 3)
    first, second = _leading(pool, "op-a"), _leading(pool, "op-b")
    a = first.run_once(now=db_now)
    b = second.run_once(now=db_now)
    assert (a.leading, a.locked, len(a.reaped)) == (True, True, 3)
    assert (b.leading, b.locked, b.reaped) == (False, False, ())
    assert {job.job_id for job in a.reaped} == set(ids)
    assert {job.previous_owner for job in a.reaped} == {"crashed-worker"}
    assert all(pooled.get(i).status == "pending" for i in ids)


def test_a_held_lock_stops_even_the_leader(
    pooled: leaseq.Queue, conn: leaseq.core.db.Conn, db_now: datetime, pool: Pool
) -> None:
    """Two processes that both believe they lead (a paused leader waking up) never overlap."""
    ids = _expired_jobs(pooled, db_now, 2)
    reaper = _leading(pool, "op-a")
    with conn.transaction():  # another reaper's pass in progress
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('leaseq.reaper', 0))")
        blocked = reaper.run_once(now=db_now)
    assert (blocked.leading, blocked.locked, blocked.reaped) == (True, False, ())
    assert all(pooled.get(i).status == "running" for i in ids)
    assert len(reaper.run_once(now=db_now).reaped) == 2


def test_lease_expires_and_the_old_holder_steps_down(
    pooled: leaseq.Queue, db_now: datetime, pool: Pool
) -> None:
    clock = Clock()
    old = _lease(pool, "op-a", ttl=15, clock=clock)
    new = _lease(pool, "op-b", ttl=15)
    assert old.renew(now=db_now)
    assert old.held
    assert not new.renew(now=db_now + timedelta(seconds=10))
    # op-a stalls past its TTL: locally it no longer counts itself leader ...
    clock.now += 16
    assert not old.held
    # ... and in the database op-b takes over with a new term.
    assert new.renew(now=db_now + timedelta(seconds=16))
    assert new.term == old.term + 1
    # op-a wakes up: its renewal names a term that is gone, so it steps down.
    assert not old.renew(now=db_now + timedelta(seconds=17))
    assert (old.term, old.held) == (0, False)


def test_released_lease_is_taken_at_once(pooled: leaseq.Queue, pool: Pool) -> None:
    first, second = _lease(pool, "op-a", ttl=15), _lease(pool, "op-b", ttl=15)
    assert first.renew()
    assert not second.renew()
    first.release()
    assert not first.held
    assert second.renew()


def test_terms_keep_growing_across_clean_releases(pool: Pool) -> None:
    """One term names one leadership: a lease given up cleanly and taken again, by another
    holder or the same one, starts a larger term, never term 1 again."""
    first, second = _lease(pool, "op-a", ttl=15), _lease(pool, "op-b", ttl=15)
    terms = []
    for lease in (first, second, first, first):
        assert lease.renew()
        terms.append(lease.term)
        lease.release()
    assert terms == sorted(set(terms)), terms
    assert terms[0] >= 1


def test_renewal_failure_keeps_the_term_until_it_lapses(
    pooled: leaseq.Queue, server_url: str, pool: Pool
) -> None:
    """The lease row is still ours after a failed renewal: keep the term (the next renewal
    takes it straight back), but stop counting ourselves leader once a TTL has passed."""
    clock = Clock()
    lease = _lease(pool, "op-a", ttl=15, clock=clock)
    assert lease.renew()
    term = lease.term
    with leaseq.open_pool(server_url + "-does-not-exist", timeout=0.5) as broken:
        lease.leadership = leaseq.Leadership(broken)
        with pytest.raises(leaseq.DatabaseUnavailable):
            lease.renew()
    assert (lease.term, lease.held) == (term, True)
    clock.now += 16
    assert not lease.held


def test_thread_reaps_reports_leadership_and_stops_cleanly(
    pooled: leaseq.Queue, db_now: datetime, pool: Pool
) -> None:
    seen: list[bool] = []
    reaper = _reaper(pool, _lease(pool, "op-a", ttl=2), interval=0.05, on_leading=seen.append)
    [job_id] = _expired_jobs(pooled, db_now, 1)
    reaper.start()
    try:
        wait_for(lambda: pooled.get(job_id).status == "pending", "the reaper thread reaps")
    finally:
        reaper.stop()
    assert not reaper.alive
    assert not reaper.leading
    assert seen[0] is True
    assert seen[-1] is False


def test_the_leader_vacuums_the_jobs_table_after_churn(
    pooled: leaseq.Queue, conn: leaseq.core.db.Conn, pool: Pool
) -> None:
    def vacuums() -> int:
        row = conn.execute(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'leaseq.jobs'::regclass"
        ).fetchone()
        assert row is not None
        return int(row[0])

    lease = _lease(pool, "op-a", ttl=15, clock=Clock())
    reaper = _reaper(pool, lease, interval=60, vacuum_dead_tuples=500)
    before = vacuums()
    reaper.run_once()
    assert vacuums() == before  # nothing dead yet: nothing to do
    conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type) SELECT 'q', 't' FROM generate_series(1, 1000)"
    )
    conn.execute(
        "UPDATE leaseq.jobs SET status = 'succeeded', finished_at = now(), lease_owner = 'w'"
    )
    conn.execute("SELECT pg_stat_force_next_flush()")
    reaper.run_once()
    assert vacuums() == before + 1


def test_the_leader_forgets_workers_that_went_silent(
    pooled: leaseq.Queue, db_now: datetime, pool: Pool
) -> None:
    for worker, seen in (("gone", db_now - timedelta(hours=1)), ("alive", db_now)):
        leaseq.Workers(pool).register(
            worker,
            pod=None,
            node=None,
            queues=["q"],
            concurrency=1,
            state=leaseq.WorkerState.RUNNING,
            in_flight=0,
            now=seen,
        )
    _leading(pool, "op-a").run_once(now=db_now)
    assert [w.worker_id for w in leaseq.Workers(pool).list()] == ["alive"]


def test_a_pass_takes_every_key_with_nothing_to_claim_out_of_the_turn(
    pool: ConnectionPool[leaseq.core.db.Conn], pooled: leaseq.Queue
) -> None:
    """More than one sweep's batch: 250 keys whose jobs are due in an hour all sleep after
    one pass, and a key whose job was cancelled is deactivated."""
    pooled.cancel(pooled.enqueue("ocr", "extract", key="cancelled").job_id)
    pooled.enqueue_many(
        leaseq.JobSpec("ocr", "extract", None, key=f"later-{i}", delay=3600) for i in range(250)
    )
    reaper = _reaper(pool, _lease(pool, "r1", ttl=15), interval=60, flow=leaseq.FlowControl(pool))
    assert reaper.run_once().locked
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT active, next_at IS NOT NULL, count(*) FROM leaseq.flow_keys"
            " GROUP BY 1, 2 ORDER BY 1, 2"
        ).fetchall()
    assert rows == [(False, False, 1), (True, True, 250)]
