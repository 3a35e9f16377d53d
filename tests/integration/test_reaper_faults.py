"""The reaper under faults: a failed renewal keeps the term, a frozen pass loses its lock,
a leader that woke up after a takeover cannot act, and every reaped attempt names its reaper."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

import leaseq
from leaseq.leader.reaper import LeaderLease, Reaper
from support.polling import wait_for


@pytest.fixture
def pool(database_url: str) -> Iterator[leaseq.Pool]:
    with leaseq.open_pool(database_url, max_size=6, timeout=5) as p:
        yield p


def _reaper(pool: leaseq.Pool, holder: str, ttl: float, interval: float = 60) -> Reaper:
    lease = LeaderLease(leaseq.Leadership(pool), holder, ttl=ttl)
    return Reaper(lease, leaseq.Queue(pool), leaseq.Workers(pool), interval=interval)


def _expired_job(queue: leaseq.Queue, now: datetime) -> int:
    started = now - timedelta(minutes=5)
    job_id = queue.enqueue("q", "t", now=started).job_id
    queue.claim(["q"], "crashed", lease_seconds=30, now=started)
    return job_id


def test_a_failed_renewal_keeps_the_term(pool: leaseq.Pool, server_url: str) -> None:
    """One renewal error (a dropped connection, a failover) must not stop reaping for a TTL:
    the holder keeps its term and renews its own lease as soon as the database answers."""
    lease = LeaderLease(leaseq.Leadership(pool), "op-a", ttl=60)
    assert lease.renew()
    term = lease.term
    good = lease.leadership
    with leaseq.open_pool(server_url + "-does-not-exist", timeout=0.5) as broken:
        lease.leadership = leaseq.Leadership(broken)
        with pytest.raises(leaseq.DatabaseUnavailable):
            lease.renew()
    lease.leadership = good
    assert lease.renew()
    assert lease.term == term


def test_the_reaper_keeps_reaping_right_after_a_renewal_error(
    pool: leaseq.Pool, queue: leaseq.Queue, conn: leaseq.core.db.Conn, server_url: str
) -> None:
    """Prints how soon after a renewal error the next pass reaps (before: a whole TTL)."""
    reaper = _reaper(pool, "op-a", ttl=30, interval=0.1)
    reaper.start()
    try:
        wait_for(lambda: reaper.leading, "the reaper to lead")
        good = reaper.lease.leadership
        with leaseq.open_pool(server_url + "-does-not-exist", timeout=0.5) as broken:
            reaper.lease.leadership = leaseq.Leadership(broken)
            time.sleep(0.3)  # passes fail while the database is "gone"
            reaper.lease.leadership = good
        failed_at = time.monotonic()
        now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        job = _expired_job(queue, now)
        wait_for(lambda: queue.get(job).status == "pending", "a reap right after the error", 10)
    finally:
        reaper.stop()
    reaped_after = time.monotonic() - failed_at
    print(f"an expired job was reaped {reaped_after:.2f}s after the database answered again "
          "(reap interval 0.1s, lease TTL 30s)")  # fmt: skip


class Freeze(logging.Handler):
    """Blocks the thread that logs a reaped job (inside the reap pass's transaction) until
    released: a reaper frozen mid-pass, holding the lock."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = threading.Event()
        self.thaw = threading.Event()

    def handle(self, record: logging.LogRecord) -> bool:
        # Not emit(): logging holds the handler's lock around emit, which would freeze
        # every other thread that logs, too.
        if record.getMessage().startswith("reaped job") and not self.frozen.is_set():
            self.frozen.set()
            self.thaw.wait(60)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        """Unused: :meth:`handle` does the work."""


def test_a_frozen_pass_loses_its_lock(
    pool: leaseq.Pool, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    _expired_job(queue, now)
    frozen, other = _reaper(pool, "op-a", ttl=3.0), _reaper(pool, "op-b", ttl=3.0)
    freeze = Freeze()
    logger = logging.getLogger("leaseq")
    logger.addHandler(freeze)
    errors: list[BaseException] = []

    def frozen_pass() -> None:
        try:
            frozen.run_once()
        except leaseq.LeaseqError as exc:
            errors.append(exc)

    thread = threading.Thread(target=frozen_pass, daemon=True)
    try:
        thread.start()
        wait_for(freeze.frozen.is_set, "the first reaper to freeze mid-pass")
        _expired_job(queue, now)
        # op-a's lease lapses after its TTL; op-b takes it and must get the pass lock too.
        wait_for(lambda: other.run_once().locked, "another reaper to get the lock", 30)
    finally:
        freeze.thaw.set()
        thread.join(10)
        logger.removeHandler(freeze)
    assert errors, "the frozen pass must not commit after it lost its session"


def test_a_leader_that_woke_after_a_takeover_cannot_pass(conn: leaseq.core.db.Conn) -> None:
    leadership = leaseq.Leadership(conn)
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    old = leadership.acquire("reaper", "op-a", term=0, ttl=5, now=now)
    assert old is not None
    new = leadership.acquire("reaper", "op-b", term=0, ttl=5, now=now + timedelta(seconds=6))
    assert new is not None and new.term == old.term + 1
    with leadership.reap_pass("reaper", "op-a", old.term, ttl=5) as stale:
        assert stale is None
    with leadership.reap_pass("reaper", "op-b", new.term, ttl=5) as current:
        assert current is not None


def test_the_same_holder_with_an_old_term_cannot_pass(conn: leaseq.core.db.Conn) -> None:
    """A holder whose lease lapsed and that took it again has a new term: a pass begun under
    its old term (a thread that woke from a pause) must not act, though the holder matches."""
    leadership = leaseq.Leadership(conn)
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    old = leadership.acquire("reaper", "op-a", term=0, ttl=5, now=now)
    assert old is not None
    again = leadership.acquire("reaper", "op-a", term=0, ttl=60, now=now + timedelta(seconds=6))
    assert again is not None and again.term == old.term + 1
    with leadership.reap_pass("reaper", "op-a", old.term, ttl=5) as stale:
        assert stale is None
    with leadership.reap_pass("reaper", "op-a", again.term, ttl=5) as current:
        assert current is not None


def test_reaped_attempts_name_their_reaper(
    pool: leaseq.Pool, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    job = _expired_job(queue, now)
    reaper = _reaper(pool, "op-a", ttl=15)
    assert len(reaper.run_once().reaped) == 1
    [attempt] = queue.attempts(job)
    assert (
        attempt.error
        == f"lease expired without completion (reaped by op-a term {reaper.lease.term})"
    )


def test_an_outage_is_logged_once_and_its_end_once(
    pool: leaseq.Pool, server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every pass fails while the database is gone: one WARNING for the outage (not one or
    two per pass), one line when passes succeed again (issue 17)."""
    caplog.set_level(logging.INFO, logger="leaseq.leader.reaper")
    reaper = _reaper(pool, "op-a", ttl=30, interval=0.05)
    passes: list[bool] = []
    reaper.on_leading = passes.append  # called once per pass, failed or not
    reaper.start()

    def records(level: int, text: str) -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.name == "leaseq.leader.reaper" and r.levelno == level and text in r.message
        ]

    try:
        wait_for(lambda: reaper.leading, "the reaper to lead")
        good = reaper.lease.leadership
        with leaseq.open_pool(server_url + "-does-not-exist", timeout=0.5) as broken:
            reaper.lease.leadership = leaseq.Leadership(broken)
            failing_from = len(passes)
            wait_for(lambda: len(passes) >= failing_from + 4, "four failed passes")
            reaper.lease.leadership = good
        wait_for(lambda: records(logging.INFO, "succeed again"), "the end of the outage")
        warnings = records(logging.WARNING, "")  # before stop() steps down
    finally:
        reaper.stop()
    assert len(warnings) == 1, [r.message for r in warnings]
    assert "reaper passes fail" in warnings[0].message
    assert len(records(logging.INFO, "succeed again")) == 1
