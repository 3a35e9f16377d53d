"""What holds the leader lease (issue 65): a worker never takes it from a database where an
operator or a ``leaseq reaper`` has led, and who holds it can be read.

A worker started with ``--lead true`` (the CLI default) where an operator runs used to take
the lease while it was free (an operator pod restarting released it) and keep it; the
operator's replicas then never led, and no WorkerPool was scaled.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

import leaseq
from leaseq import LeaderKind
from leaseq.leader.reaper import LeaderLease

OPERATOR, REAPER, WORKER = LeaderKind.OPERATOR, LeaderKind.REAPER, LeaderKind.WORKER


def _now(conn: leaseq.core.db.Conn) -> datetime:
    now: datetime = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    return now


@pytest.mark.parametrize("kind", [OPERATOR, REAPER])
def test_a_worker_never_takes_the_lease_after_an_operator_released_it(
    conn: leaseq.core.db.Conn, kind: LeaderKind
) -> None:
    leadership = leaseq.Leadership(conn)
    held = leadership.acquire("reaper", "op-a", term=0, ttl=15, kind=kind)
    assert held is not None
    assert leadership.release("reaper", "op-a", term=held.term)
    assert leadership.acquire("reaper", "w-1", term=0, ttl=15, kind=WORKER) is None
    record = leadership.holder("reaper")
    assert record is not None
    assert (record.holder, record.kind, record.term, record.live) == ("op-a", kind, 1, False)
    # Another operator replica takes it at once, in a new term.
    again = leadership.acquire("reaper", "op-b", term=0, ttl=15, kind=OPERATOR)
    assert again is not None and again.term == held.term + 1


def test_a_worker_never_takes_an_operators_lapsed_lease(conn: leaseq.core.db.Conn) -> None:
    leadership = leaseq.Leadership(conn)
    now = _now(conn)
    assert leadership.acquire("reaper", "op-a", term=0, ttl=5, kind=OPERATOR, now=now)
    later = now + timedelta(minutes=10)
    assert leadership.acquire("reaper", "w-1", term=0, ttl=5, kind=WORKER, now=later) is None
    taken = leadership.acquire("reaper", "op-b", term=0, ttl=5, kind=OPERATOR, now=later)
    assert taken is not None


def test_workers_still_elect_one_of_them_where_no_operator_led(
    conn: leaseq.core.db.Conn,
) -> None:
    """A worker-only deployment: a worker's released lease stays on record, lapsed, and the
    next worker takes it at once, in the next term."""
    leadership = leaseq.Leadership(conn)
    first = leadership.acquire("reaper", "w-1", term=0, ttl=15, kind=WORKER)
    assert first is not None
    assert leadership.acquire("reaper", "w-2", term=0, ttl=15, kind=WORKER) is None
    record = leadership.holder("reaper")
    assert record is not None and (record.holder, record.kind, record.live) == ("w-1", WORKER, True)
    assert leadership.release("reaper", "w-1", term=first.term)
    record = leadership.holder("reaper")
    assert record is not None and (record.holder, record.kind, record.live) == (
        "w-1",
        WORKER,
        False,
    )
    second = leadership.acquire("reaper", "w-2", term=0, ttl=15, kind=WORKER)
    assert second is not None and second.term == first.term + 1


def test_an_operator_takes_a_workers_lapsed_lease_and_keeps_workers_out(
    conn: leaseq.core.db.Conn,
) -> None:
    leadership = leaseq.Leadership(conn)
    now = _now(conn)
    worker = leadership.acquire("reaper", "w-1", term=0, ttl=5, kind=WORKER, now=now)
    assert worker is not None
    # While the worker's lease is live the operator cannot lead, and can say who does.
    assert leadership.acquire("reaper", "op-a", term=0, ttl=5, kind=OPERATOR, now=now) is None
    record = leadership.holder("reaper", now=now)
    assert record is not None and (record.holder, record.kind, record.live) == ("w-1", WORKER, True)
    later = now + timedelta(seconds=6)
    assert leadership.acquire("reaper", "op-a", term=0, ttl=5, kind=OPERATOR, now=later)
    # The worker's own renewal (its term) is refused from now on, lapsed lease or not.
    much_later = later + timedelta(minutes=10)
    assert (
        leadership.acquire("reaper", "w-1", term=worker.term, ttl=5, kind=WORKER, now=much_later)
        is None
    )


def test_the_lease_reports_who_refused_a_renewal(pool: leaseq.Pool) -> None:
    """LeaderLease keeps who held the lease at its last refused renewal: what the operator
    says on its WorkerPools."""
    operator = LeaderLease(leaseq.Leadership(pool), "op-a", ttl=15, kind=OPERATOR)
    worker = LeaderLease(leaseq.Leadership(pool), "w-1", ttl=15, kind=WORKER)
    assert worker.renew()
    assert worker.other is None
    assert not operator.renew()
    assert operator.other is not None
    assert (operator.other.holder, operator.other.kind) == ("w-1", WORKER)
    worker.release()
    assert operator.renew()
    assert operator.other is None
    assert not worker.renew()
    assert worker.other is not None and worker.other.kind is OPERATOR
