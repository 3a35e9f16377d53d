"""Ending a terminated worker's leases at once (``Reaper.reclaim``): only its own, fenced as
a reap pass is, under the component roles."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

import leaseq
from leaseq.leader.reaper import LeaderLease, Reaper
from support.roles import Roles, component_roles

POD, NODE = "workers-7f9c-x2", "node-1"
BOOT = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)  # the worker's start, by the node's clock
KILLED = BOOT + timedelta(minutes=5)  # the kubelet's finishedAt, by the same clock


@pytest.fixture
def roles(database_url: str) -> Iterator[Roles]:
    with component_roles(database_url) as made:
        yield made


def _register(conn: leaseq.core.db.Conn, worker: str, boot_at: datetime | None) -> None:
    leaseq.Workers(conn).register(
        worker, pod=POD, node=NODE, queues=["q"], concurrency=2,
        state=leaseq.WorkerState.RUNNING, in_flight=0, boot_at=boot_at,
    )  # fmt: skip


def _reaper(conn: leaseq.core.db.Conn, holder: str = "op-1") -> Reaper:
    lease = LeaderLease(leaseq.Leadership(conn), holder, ttl=15)
    return Reaper(lease, leaseq.Queue(conn), leaseq.Workers(conn), interval=60)


def test_the_operator_role_ends_only_the_terminated_workers_leases(roles: Roles) -> None:
    with leaseq.connect(roles.urls["producer"], action="test") as p:
        ids = [leaseq.Queue(p).enqueue("q", "t").job_id for _ in range(4)]
    with leaseq.connect(roles.urls["worker"], action="test") as w:
        queue = leaseq.Queue(w)
        _register(w, "dead", BOOT)  # ran in the container the kubelet saw terminate
        _register(w, "restarted", KILLED + timedelta(seconds=1))  # its successor
        _register(w, "old-version", None)  # predates boot_at: nothing confirms its end
        dead = [j.id for j in queue.claim(["q"], "dead", limit=2, lease_seconds=300)]
        [restarted] = [j.id for j in queue.claim(["q"], "restarted", lease_seconds=300)]
        [old] = [j.id for j in queue.claim(["q"], "old-version", lease_seconds=300)]
    assert sorted([*dead, restarted, old]) == ids
    with leaseq.connect(roles.urls["operator"], action="test") as o:
        reaper = _reaper(o)
        assert reaper.reclaim(POD, NODE, KILLED) is None  # not leading: nothing done
        reaper.run_once()
        reaped = reaper.reclaim(POD, NODE, KILLED)
        assert reaped is not None
        assert sorted(r.job_id for r in reaped) == sorted(dead)
        assert {r.previous_owner for r in reaped} == {"dead"}
        queue = leaseq.Queue(o)
        assert [queue.get(i).status for i in dead] == ["pending", "pending"]
        assert queue.get(restarted).status == "running"
        assert queue.get(old).status == "running"
        # The same termination again (a repeated pod event) finds nothing more.
        assert reaper.reclaim(POD, NODE, KILLED) == ()
        # Another pod or node of the same name: not these workers.
        assert reaper.reclaim(POD, "node-2", KILLED + timedelta(hours=1)) == ()


def test_a_reclaim_waits_for_no_other_pass_and_a_deposed_leader_does_nothing(
    conn: leaseq.core.db.Conn, database_url: str
) -> None:
    """Fenced as a reap pass: while another pass holds the lock it returns None (try again);
    a holder whose term ended reclaims nothing."""
    queue = leaseq.Queue(conn)
    queue.enqueue("q", "t")
    _register(conn, "dead", BOOT)
    [job] = queue.claim(["q"], "dead", lease_seconds=300)
    with (
        leaseq.connect(database_url, action="test") as other,
        leaseq.connect(database_url, action="test") as third,
    ):
        reaper = _reaper(other)
        reaper.run_once()
        lease = reaper.lease
        # Another pass (on another session) holds the pass lock.
        with leaseq.Leadership(third).reap_pass(
            lease.name, lease.holder, lease.term, ttl=15
        ) as held:
            assert held is not None
            assert reaper.reclaim(POD, NODE, KILLED) is None
        # A takeover while this holder still believes it leads (a paused leader).
        conn.execute(
            "UPDATE leaseq.leader_leases SET holder = 'op-2', term = term + 1 WHERE name = 'reaper'"
        )
        assert reaper.leading
        assert reaper.reclaim(POD, NODE, KILLED) is None
    assert queue.get(job.id).status == "running"
