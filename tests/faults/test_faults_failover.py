"""A lease token is never handed out twice across a PostgreSQL failover.

The story (docs/operations/failover.md): a worker claims a job on the primary; the primary
dies before the claim reaches the standby; the standby is promoted, still showing the job
pending at the previous token; the worker reconnects (a multi-host URL with
``target_session_attrs=read-write``) and claims the job again. Before the failover epoch it got
the lost token again, under the same owner: two executions held one (owner, token), and each
one's heartbeat and completion passed as the other's. Real servers: a PostgreSQL 15 primary and
its streaming standby, replication cut, the primary killed, the standby promoted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from faultkit import HERE, worker_args

import leaseq
from support import ha, pgbouncer
from support.polling import wait_for
from support.workers import Workers

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(ha.missing() is not None, reason=ha.missing() or ""),
]

OWNER = "host-a:4242"


@pytest.fixture
def pair() -> Iterator[ha.StreamingPair]:
    """A fresh primary and standby per test (a failover uses them up), leaseq migrated on the
    primary and replayed by the standby."""
    servers = ha.StreamingPair()
    try:
        servers.primary.sql("CREATE DATABASE leaseq")
        with leaseq.connect(servers.url("leaseq"), action="migrate") as conn:
            leaseq.migrate(conn)
        yield servers
    finally:
        servers.close()


def test_a_claim_lost_in_a_failover_is_never_issued_again(pair: ha.StreamingPair) -> None:
    with leaseq.open_pool(pair.url("leaseq"), max_size=2, timeout=5) as pool:
        queue = leaseq.Queue(pool)
        job_id = queue.enqueue("q", "step").job_id
        pair.wait_replayed()
        pair.hold_back()

        first = queue.claim(["q"], OWNER, lease_seconds=60)[0]
        assert first.id == job_id
        pair.fail_over()

        # The same pool, the same owner: its next call reconnects to the promoted standby.
        second = queue.claim(["q"], OWNER, lease_seconds=60)[0]
        assert second.id == job_id
        assert (second.lease.owner, second.lease.token) != (first.lease.owner, first.lease.token), (
            f"two executions hold job {job_id} as ({OWNER}, {first.lease.token})"
        )
        assert second.lease.token > first.lease.token

        refused = queue.heartbeat(first.lease, lease_seconds=60)
        assert refused.status is leaseq.HeartbeatStatus.LOST
        assert isinstance(queue.complete(first.lease, {"by": "first"}), leaseq.Fenced)
        assert queue.heartbeat(second.lease).status is leaseq.HeartbeatStatus.RENEWED
        assert isinstance(queue.complete(second.lease, {"by": "second"}), leaseq.Completed)
        assert queue.get(job_id).result == {"by": "second"}


def test_a_keyed_claim_after_a_failover_takes_the_unit_under_its_new_token(
    pair: ha.StreamingPair,
) -> None:
    """A key limited to one running job: the unit the lost claim took is free on the promoted
    standby; the claim there takes it under the new token, the lost execution cannot give it
    back or complete, and the unit is free once the new execution completes."""
    with leaseq.open_pool(pair.url("leaseq"), max_size=2, timeout=5) as pool:
        queue = leaseq.Queue(pool)
        leaseq.FlowControl(pool).set_limit("q", "tenant", max_running=1)
        job_id = queue.enqueue("q", "step", key="tenant").job_id
        pair.wait_replayed()
        pair.hold_back()
        first = queue.claim(["q"], OWNER, lease_seconds=60)[0]
        pair.fail_over()

        second = queue.claim(["q"], OWNER, lease_seconds=60)[0]
        assert second.id == first.id == job_id
        assert second.lease.token > first.lease.token
        units = "SELECT job_id, lease_token FROM leaseq.flow_slots WHERE key = 'tenant'"
        with leaseq.connect(pair.url("leaseq"), action="inspect") as conn:
            assert conn.execute(units).fetchall() == [(job_id, second.lease.token)]
            assert isinstance(queue.complete(first.lease), leaseq.Fenced)
            assert conn.execute(units).fetchall() == [(job_id, second.lease.token)]
            assert isinstance(queue.complete(second.lease), leaseq.Completed)
            assert conn.execute(units).fetchall() == [(None, None)]


@pytest.mark.skipif(not pgbouncer.available(), reason="pgbouncer is not installed")
def test_behind_pgbouncer_the_lost_token_is_refused(pair: ha.StreamingPair) -> None:
    """Through a transaction-pooling PgBouncer that is pointed at the promoted standby (a
    service's endpoint moving): the worker sees no reconnection of its own, and the token is
    what refuses the lost execution."""
    bouncer = pgbouncer.PgBouncer(pair.primary.url("leaseq"))
    try:
        with leaseq.open_pool(bouncer.url, max_size=2, timeout=5, prepare=False) as pool:
            queue = leaseq.Queue(pool)
            job_id = queue.enqueue("q", "step").job_id
            pair.wait_replayed()
            pair.hold_back()
            first = queue.claim(["q"], OWNER, lease_seconds=60)[0]
            pair.fail_over()
            bouncer.retarget(pair.standby.url("leaseq"))

            second = queue.claim(["q"], OWNER, lease_seconds=60)[0]
            assert second.id == first.id == job_id
            assert second.lease.token != first.lease.token, (
                f"two executions hold job {job_id} as ({OWNER}, {first.lease.token})"
            )
            assert second.lease.token > first.lease.token
            assert queue.heartbeat(first.lease).status is leaseq.HeartbeatStatus.LOST
            assert isinstance(queue.complete(first.lease, {"by": "first"}), leaseq.Fenced)
            assert isinstance(queue.complete(second.lease, {"by": "second"}), leaseq.Completed)
    finally:
        bouncer.close()


def started(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.start"))


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_worker_that_fails_over_stops_its_lost_execution(
    pair: ha.StreamingPair, tmp_path: Path, isolation: str
) -> None:
    """A real worker on the multi-host URL: the execution that began on the lost primary is
    stopped (its leases voided when the worker's pool reached the promoted standby, its
    heartbeat refused there anyway), and the job's next execution runs under a token of its
    own."""
    url = pair.url("leaseq")
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    with leaseq.open_pool(url, max_size=1, timeout=5) as pool:
        queue = leaseq.Queue(pool)
        job_id = queue.enqueue("q", "stamp", {"dir": str(stamps), "seconds": 60}).job_id
        pair.wait_replayed()
        pair.hold_back()

        workers = Workers(url, tmp_path, pythonpath=[HERE])
        try:
            worker = workers.start(
                "w", *worker_args(concurrency=2, lease=3.0, heartbeat=0.3, poll=0.3),
                "--isolation", isolation,
            )  # fmt: skip
            (lost,) = wait_for(lambda: started(stamps), "the first execution to start")
            pair.fail_over()

            def running_again() -> leaseq.JobRecord | None:
                record = queue.get(job_id)
                return record if record.status is leaseq.JobStatus.RUNNING else None

            again = wait_for(running_again, "the job to be claimed on the promoted standby")
            assert again.lease_token != int(lost), (
                f"two executions hold job {job_id} as ({again.lease_owner}, {lost})"
            )
            assert again.lease_token > int(lost)

            def void() -> float:
                # A lost lease found by a heartbeat, or a refused call of the lost execution
                # (a process slot whose handler ended before the next heartbeat).
                return worker.metric("leaseq_lease_losses_total", queue="q") + worker.metric(
                    "leaseq_fenced_calls_total", queue="q"
                )

            wait_for(void, "the worker to find the lost execution's lease void")
            wait_for(lambda: worker.metric("leaseq_worker_failovers_total") == 1,
                     "the worker to count the failover it reconnected through")  # fmt: skip
            wait_for(lambda: f"{again.lease_token}" in started(stamps),
                     "the next execution to start under its own token")  # fmt: skip
            assert worker.proc.poll() is None
        finally:
            workers.stop_all()
