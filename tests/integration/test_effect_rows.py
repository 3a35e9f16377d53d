"""What a completion stores: the result in the job's row always, and an effect row in
leaseq.job_results only under an explicit key (the enqueuer's idempotency key, or one passed
to complete), once per key; a stale completion writes neither."""

from __future__ import annotations

from datetime import timedelta

import leaseq
from support.dbtime import db_now


def effect_rows(conn: leaseq.core.db.Conn, *job_ids: int) -> int:
    row = conn.execute(
        "SELECT count(*) FROM leaseq.job_results WHERE job_id = ANY(%s)", [list(job_ids)]
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_only_a_keyed_completion_writes_an_effect_row(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    keyless = queue.enqueue("q", "t").job_id
    keyed = queue.enqueue("q", "t", idempotency_key="invoice-9").job_id
    passed = queue.enqueue("q", "t").job_id
    by_id = {j.id: j for j in queue.claim(["q"], "w1", limit=3)}
    answers = queue.complete_many(
        [by_id[keyless].lease, by_id[keyed].lease],
        [{"n": "keyless"}, {"n": "keyed"}],
    )
    assert answers == [
        leaseq.Completed(keyless, None, False),
        leaseq.Completed(keyed, "invoice-9", True),
    ]
    done = queue.complete(by_id[passed].lease, {"n": "passed"}, effect_key="export-3")
    assert done == leaseq.Completed(passed, "export-3", True)
    # The job's row is the record of its result, key or not.
    assert [queue.get(i).result for i in (keyless, keyed, passed)] == [
        {"n": "keyless"},
        {"n": "keyed"},
        {"n": "passed"},
    ]
    assert effect_rows(conn, keyless) == 0
    assert effect_rows(conn, keyed) == 1
    assert effect_rows(conn, passed) == 1
    assert queue.effect(f"job:{keyless}") is None
    effect = queue.effect("invoice-9")
    assert effect is not None and (effect.job_id, effect.result) == (keyed, {"n": "keyed"})
    exported = queue.effect("export-3")
    assert exported is not None and exported.job_id == passed

    # A second job with the same idempotency key succeeds without a second effect row.
    again = queue.enqueue("q", "t", idempotency_key="invoice-9").job_id
    [job] = queue.claim(["q"], "w1")
    done = queue.complete(job.lease, {"n": "again"})
    assert done == leaseq.Completed(again, "invoice-9", False) and done.effect_dropped
    assert effect_rows(conn, keyed, again) == 1
    # Not silently: the attempt says the effect was not written, and why.
    [attempt] = queue.attempts(again)
    assert attempt.error is not None and "effect not written" in attempt.error
    [first] = queue.attempts(keyed)
    assert first.error is None


def test_a_stale_completion_writes_no_result_and_no_effect(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    now = db_now(conn)
    keyless = queue.enqueue("q", "t", now=now).job_id
    keyed = queue.enqueue("q", "t", idempotency_key="invoice-10", now=now).job_id
    stale = queue.claim(["q"], "w1", limit=2, lease_seconds=1, now=now)
    later = now + timedelta(seconds=5)
    queue.reap(now=later)  # both leases expired
    current = queue.claim(["q"], "w2", limit=2, now=later)
    answers = queue.complete_many(
        [j.lease for j in stale], [{"by": "stale"}] * 2, now=later + timedelta(seconds=1)
    )
    assert all(isinstance(a, leaseq.Fenced) for a in answers)
    assert effect_rows(conn, keyless, keyed) == 0
    for job_id in (keyless, keyed):
        record = queue.get(job_id)
        assert (record.status, record.result, record.lease_owner) == ("running", None, "w2")
    # The current holders complete: one effect row, for the keyed job only.
    queue.complete_many(
        [j.lease for j in current], [{"by": "w2"}] * 2, now=later + timedelta(seconds=2)
    )
    assert effect_rows(conn, keyless) == 0
    assert effect_rows(conn, keyed) == 1
    effect = queue.effect("invoice-10")
    assert effect is not None and (effect.produced_by, effect.result) == ("w2", {"by": "w2"})
