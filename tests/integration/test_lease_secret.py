"""A lease is a capability: the token every login can read is not enough to act under it.

These tests check leaseq's own worker API and the door's functions as the owner's login
would call them: each passes the real owner and token of a job another worker holds, with a
secret of its own, and every call must be refused, write nothing, and leave the holder's
lease working. Breaking the check in any one statement fails the test that calls it. The
same attacks by a second login of the worker role, directly on the tables and through the
door, are tests/integration/test_attacks.py's (test_7_*).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

import leaseq
from leaseq.core import capability
from leaseq.runtime.processes import without_secret
from support.dbtime import claim_one, db_now


def forged(lease: leaseq.Lease) -> leaseq.Lease:
    """``lease`` with everything a reader of leaseq.jobs knows, and a secret of its own."""
    return dataclasses.replace(lease, secret=capability.claim_secret())


def snapshot(database_url: str, job_id: int) -> tuple[Any, ...]:
    """Everything a worker call could have changed about the job."""
    with psycopg.connect(database_url) as c:
        row = c.execute(
            "SELECT j.status::text, j.lease_token, j.lease_expires_at, j.heartbeat_at,"
            " j.progress, j.checkpoint, j.result, j.available_at, j.attempt_count,"
            " (SELECT count(*) FROM leaseq.job_attempts a WHERE a.job_id = j.id),"
            " (SELECT count(*) FROM leaseq.job_steps s WHERE s.job_id = j.id),"
            " (SELECT count(*) FROM leaseq.job_stream s WHERE s.job_id = j.id),"
            " (SELECT count(*) FROM leaseq.job_results r WHERE r.job_id = j.id)"
            " FROM leaseq.jobs j WHERE j.id = %s",
            [job_id],
        ).fetchone()
    assert row is not None
    return tuple(row)


FENCED = (leaseq.Fenced,)

#: Each worker call under a lease, and whether its answer says it was refused.
CALLS: dict[str, Callable[[leaseq.Queue, leaseq.Lease], bool]] = {
    "heartbeat": lambda q, lease: q.heartbeat(lease).status is leaseq.HeartbeatStatus.LOST,
    "heartbeat_many": lambda q, lease: (
        q.heartbeat_many([lease])[0].status is leaseq.HeartbeatStatus.LOST
    ),
    "checkpoint": lambda q, lease: q.checkpoint(lease, {"forged": True}) is False,
    "complete": lambda q, lease: isinstance(
        q.complete(lease, {"forged": True}, effect_key="forged"), FENCED
    ),
    "fail": lambda q, lease: isinstance(q.fail(lease, "forged", retryable=False), FENCED),
    "release": lambda q, lease: isinstance(q.release(lease, reason="forged"), FENCED),
    "back_off": lambda q, lease: isinstance(q.back_off(lease, 60, reason="forged"), FENCED),
    "sleep": lambda q, lease: isinstance(
        q.sleep(lease, lease.started_at + timedelta(hours=1)), FENCED
    ),
    "wait": lambda q, lease: isinstance(
        q.wait(lease, "approval", lease.started_at + timedelta(hours=1)), FENCED
    ),
    "step_intend": lambda q, lease: q.step_intend(lease, "charge", seen_token=None) is False,
    "step_record": lambda q, lease: q.step_record(lease, "charge", {"forged": True}) is False,
    "step_withdraw": lambda q, lease: q.step_withdraw(lease, "charge") is False,
    "emit": lambda q, lease: q.emit(lease, {"forged": True}) is None,
    "signal_read": lambda q, lease: q.signal_read(lease, "approval") is None,
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_the_real_token_without_the_secret_is_refused(
    queue: leaseq.Queue, database_url: str, call: str
) -> None:
    queue.enqueue("q", "t", idempotency_key="forged")
    held = claim_one(queue, "worker-b")
    before = snapshot(database_url, held.id)
    attacker = forged(held.lease)
    assert (attacker.owner, attacker.token) == (held.lease.owner, held.lease.token)

    if call == "step_record":
        # A step the holder intended: the forger tries to write its outcome.
        assert queue.step_intend(held.lease, "charge", seen_token=None)
        before = snapshot(database_url, held.id)
    assert CALLS[call](queue, attacker), f"{call} with a forged secret was not refused"
    assert snapshot(database_url, held.id) == before, f"{call} changed the job"

    # The holder's lease still works, and its completion is the one recorded.
    assert queue.heartbeat(held.lease).status is leaseq.HeartbeatStatus.RENEWED
    done = queue.complete(held.lease, {"real": True})
    assert isinstance(done, leaseq.Completed)
    assert queue.get(held.id).result == {"real": True}


def test_a_claim_keeps_only_a_digest_of_its_secret_per_call(
    queue: leaseq.Queue, database_url: str
) -> None:
    for _ in range(3):
        queue.enqueue("q", "t")
    jobs = queue.claim(["q"], "w", limit=3)
    [secret] = {job.lease.secret for job in jobs}  # one per claim call
    assert len(secret) == 32 and queue.claim(["q"], "w") == []
    queue.enqueue("q", "t")
    [later] = queue.claim(["q"], "w")
    assert later.lease.secret != secret  # and each call its own
    with psycopg.connect(database_url) as c:
        rows = dict(c.execute("SELECT id, lease_digest FROM leaseq.jobs").fetchall())
        whole = str(c.execute("SELECT array_agg(j::text) FROM leaseq.jobs j").fetchone())
    for job in [*jobs, later]:
        assert rows[job.id] == hashlib.sha256(job.lease.secret).digest()
        assert rows[job.id] == capability.digest(job.lease.secret)
        assert job.lease.secret.hex() not in whole
    assert len(set(rows.values())) == 2  # a digest per claim call
    assert "secret" not in repr(jobs[0].lease) and secret.hex() not in repr(jobs)
    # The digest goes with the lease: a completed job keeps none.
    assert isinstance(queue.complete(jobs[0].lease), leaseq.Completed)
    with psycopg.connect(database_url) as c:
        digest = c.execute("SELECT lease_digest FROM leaseq.jobs WHERE id = %s", [jobs[0].id])
        assert digest.fetchone() == (None,)


@pytest.mark.parametrize("call", ["complete_many", "heartbeat_many"])
def test_a_batch_checks_each_lease_by_its_own_secret(queue: leaseq.Queue, call: str) -> None:
    """A batch holds leases of two claims, a run of one claim's, and forged secrets first,
    right after that run and before the other claim's: the database hashes a run of equal
    secrets once (leaseq.lease_digests), and no lease takes a neighbour's digest."""
    for _ in range(5):
        queue.enqueue("q", "t")
    a = [job.lease for job in queue.claim(["q"], "wa", limit=3)]
    b = [job.lease for job in queue.claim(["q"], "wb", limit=2)]
    leases = [forged(b[1]), a[0], a[2], forged(a[1]), b[0]]
    if call == "complete_many":
        answers = queue.complete_many(leases)
        held = [isinstance(x, leaseq.Completed) for x in answers]
    else:
        beats = queue.heartbeat_many(leases)
        held = [x.status is leaseq.HeartbeatStatus.RENEWED for x in beats]
    assert held == [False, True, True, False, True]


def test_a_keyed_claim_mints_a_secret_too(queue: leaseq.Queue) -> None:
    queue.enqueue("q", "t", key="tenant-a")
    held = claim_one(queue, "worker-b")
    assert isinstance(queue.complete(forged(held.lease)), leaseq.Fenced)
    assert isinstance(queue.complete(held.lease), leaseq.Completed)


def test_a_lost_claim_is_recovered_only_with_its_secret(
    queue: leaseq.Queue, database_url: str
) -> None:
    queue.enqueue("q", "t")
    held = claim_one(queue, "worker-b")
    with psycopg.connect(database_url) as c:
        row = c.execute("SELECT claim_id FROM leaseq.jobs WHERE id = %s", [held.id]).fetchone()
    assert row is not None
    claim_id = row[0]
    store = queue._store
    with leaseq.connect(database_url, action="test") as conn:
        stolen = store.job_claim_recover(
            conn, owner="worker-b", claims={claim_id: capability.claim_secret()}
        )
    assert stolen == []
    assert isinstance(queue.complete(held.lease), leaseq.Completed)


def test_a_process_child_gets_no_secret(queue: leaseq.Queue) -> None:
    queue.enqueue("q", "t")
    held = claim_one(queue)
    sent = without_secret(held)
    assert sent.lease.secret == b""
    assert dataclasses.replace(sent, lease=held.lease) == held
    assert isinstance(queue.complete(sent.lease), leaseq.Fenced)
    assert isinstance(queue.complete(held.lease), leaseq.Completed)


def test_a_failover_reissue_does_not_take_the_old_secret(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    # A reclaim of the same job (the reaper gave it back) at a later token: the former
    # holder's secret is not the new lease's, whatever the token.
    now = db_now(conn)
    queue.enqueue("q", "t", now=now)
    first = claim_one(queue, "worker-a", lease_seconds=5, now=now)
    later = now + timedelta(seconds=10)
    queue.reap(now=later)
    second = claim_one(queue, "worker-a", lease_seconds=60, now=later)
    stale = dataclasses.replace(first.lease, token=second.lease.token)
    assert isinstance(queue.complete(stale, now=later), leaseq.Fenced)
    assert isinstance(queue.complete(second.lease, now=later), leaseq.Completed)


BIG = "x" * 1_100_000


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ("SELECT * FROM leaseq.lease_step_record(%(id)s, %(owner)s, %(token)s, %(secret)s,"
         " 'charge', %(big)s, NULL, NULL)", "step result"),
        ("SELECT * FROM leaseq.lease_emit(%(id)s, %(owner)s, %(token)s, %(secret)s,"
         " %(item)s, 10, NULL)", "stream item"),
        ("SELECT * FROM leaseq.lease_checkpoint(%(id)s, %(owner)s, %(token)s, %(secret)s,"
         " %(big)s, NULL)", "checkpoint"),
        ("SELECT * FROM leaseq.lease_heartbeat_many(ARRAY[%(id)s::bigint], ARRAY[%(owner)s],"
         " ARRAY[%(token)s::bigint], ARRAY[%(secret)s::bytea], ARRAY[%(item)s::jsonb], 30,"
         " NULL)", "progress"),
        ("SELECT * FROM leaseq.lease_complete(ARRAY[%(id)s::bigint], ARRAY[%(owner)s],"
         " ARRAY[%(token)s::bigint], ARRAY[%(secret)s::bytea], ARRAY[%(big)s::jsonb], NULL,"
         " NULL, NULL, NULL)", "result"),
        ("SELECT * FROM leaseq.lease_step_intend(%(id)s, %(owner)s, %(token)s, %(secret)s,"
         " repeat('n', 201), NULL, NULL)", "step"),
    ],
)  # fmt: skip
def test_the_door_holds_the_apis_bounds_for_any_caller(
    queue: leaseq.Queue, database_url: str, call: str, field: str
) -> None:
    """A holder that skips leaseq's API (its own connection, its real secret) is refused in
    the API's words, and nothing is written."""
    queue.enqueue("q", "t")
    held = claim_one(queue)
    assert queue.step_intend(held.lease, "charge", seen_token=None)
    before = snapshot(database_url, held.id)
    params = {
        "id": held.id,
        "owner": held.lease.owner,
        "token": held.lease.token,
        "secret": held.lease.secret,
        "big": Jsonb(BIG),
        "item": Jsonb("y" * 70_000),
    }
    with leaseq.connect(database_url, action="test") as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
            conn.execute(call, params)
        assert raised.value.diag.column_name == field
        assert "nothing was written" in str(raised.value)
    assert snapshot(database_url, held.id) == before
    assert isinstance(queue.complete(held.lease), leaseq.Completed)


def test_a_job_records_at_most_ten_thousand_steps(queue: leaseq.Queue, database_url: str) -> None:
    queue.enqueue("q", "t")
    held = claim_one(queue)
    with psycopg.connect(database_url) as c:
        c.execute(
            "INSERT INTO leaseq.job_steps (job_id, name, attempt, lease_token, intended_at,"
            " finished_at, result) SELECT %s, 's' || n, 1, %s, now(), now(), 'null'"
            " FROM generate_series(1, 10000) n",
            [held.id, held.lease.token],
        )
    assert queue.step_intend(held.lease, "s1", seen_token=held.lease.token) is False  # recorded
    with pytest.raises(leaseq.InvalidJob, match="10000 steps"):
        queue.step_intend(held.lease, "one-more", seen_token=None)
