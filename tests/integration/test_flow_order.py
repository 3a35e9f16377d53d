"""Strict order per aggregate on a real PostgreSQL: only the lowest unfinished sequence number
of an ordering_key is claimable, across retries; a dead head blocks its aggregate, visibly,
until it is retried or skipped."""

from __future__ import annotations

import random
import threading
import time

import psycopg

import leaseq

Q = "oq"
RETRY = leaseq.RetryPolicy(base_seconds=0.001, cap_seconds=0.01)


def test_each_aggregates_executions_run_in_sequence_order(database_url: str) -> None:
    aggregates, per, claimers = 1000, 50, 8
    rng = random.Random(17)
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        # Enqueued interleaved (round by round, aggregates shuffled), so enqueue order within
        # an aggregate is not id order across the table.
        for n in range(per):
            order = list(range(aggregates))
            rng.shuffle(order)
            q.enqueue_many(
                [
                    leaseq.JobSpec(Q, "t", {"n": n}, ordering_key=f"agg-{a}", max_attempts=100)
                    for a in order
                ]
            )
    total = aggregates * per
    stop = threading.Event()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        r = random.Random(n)
        try:
            with leaseq.connect(database_url, action="test") as c:
                cq = leaseq.Queue(c, retry=RETRY)
                while not stop.is_set():
                    got = cq.claim([Q], f"w{n}", limit=20)
                    if not got:
                        time.sleep(0.005)
                        continue
                    ok = []
                    for job in got:
                        if r.random() < 0.1:
                            cq.fail(job.lease, "flaky")
                        else:
                            ok.append(job)
                    if ok:
                        cq.complete_many([j.lease for j in ok], [None] * len(ok))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(claimers)]
    for t in threads:
        t.start()
    try:
        with psycopg.connect(database_url, autocommit=True) as watch:
            deadline = time.monotonic() + 400
            while not stop.is_set() and time.monotonic() < deadline:
                row = watch.execute(
                    "SELECT count(*) FROM leaseq.jobs WHERE queue = %s AND status = 'succeeded'",
                    (Q,),
                ).fetchone()
                if row == (total,):
                    break
                time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    if errors:
        raise errors[0]
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM leaseq.jobs WHERE queue = %s AND status = 'succeeded'", (Q,)
        ).fetchone() == (total,)
        retried = conn.execute(
            "SELECT count(*) FROM leaseq.job_attempts WHERE outcome = 'failed'"
        ).fetchone()
        assert retried and int(retried[0]) > 0  # type: ignore[call-overload]
        # Every attempt (failed or succeeded), in the order it ended, has a sequence number no
        # lower than the one before it in its aggregate: nothing ran ahead of its turn, and
        # successes are in enqueue order. (ended_at is each ending transaction's start, which
        # follows the commit that made the job claimable.)
        out_of_order = conn.execute(
            """
            SELECT ordering_key, prev_seq, seq FROM (
                SELECT j.ordering_key, j.ordering_seq AS seq,
                       lag(j.ordering_seq) OVER (PARTITION BY j.ordering_key
                                                 ORDER BY a.ended_at, a.lease_token) AS prev_seq
                  FROM leaseq.job_attempts a JOIN leaseq.jobs j ON j.id = a.job_id
                 WHERE j.queue = %s) s
             WHERE seq < prev_seq LIMIT 5
            """,
            (Q,),
        ).fetchall()
        assert out_of_order == []
        seqs = conn.execute(
            "SELECT ordering_key, array_agg(j.ordering_seq ORDER BY j.id) FROM leaseq.jobs j"
            " WHERE j.queue = %s GROUP BY 1 LIMIT 3",
            (Q,),
        ).fetchall()
        assert all(list(s) == list(range(1, per + 1)) for _, s in seqs)  # type: ignore[call-overload]
        print(f"{total} jobs in {aggregates} aggregates; {retried[0]} failed attempts retried")


def test_only_the_head_is_claimable_and_retries_keep_its_place(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn, retry=leaseq.RetryPolicy(base_seconds=60, cap_seconds=60))
        a = [
            q.enqueue(Q, "t", {"n": n}, ordering_key="o", priority=100 - n).job_id for n in range(3)
        ]
        other = q.enqueue(Q, "t", {}, ordering_key="p").job_id
        got = q.claim([Q], "w", limit=10)
        assert sorted(j.id for j in got) == sorted([a[0], other]), "one head per aggregate"
        head = next(j for j in got if j.id == a[0])
        later = conn.execute("SELECT now() + interval '1 hour'").fetchone()
        assert later is not None
        q.fail(head.lease, "again")
        assert q.claim([Q], "w") == [], "the head in backoff blocks its aggregate"
        [again] = q.claim([Q], "w", now=later[0])  # type: ignore[arg-type]
        assert again.id == a[0]


def test_dead_head_blocks_visibly_until_retried_or_skipped(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        flow = leaseq.FlowControl(conn)
        ids = [q.enqueue(Q, "t", {"n": n}, ordering_key="o").job_id for n in range(3)]
        [head] = q.claim([Q], "w")
        q.fail(head.lease, "poison", retryable=False)
        assert q.claim([Q], "w") == [], "a dead head blocks the aggregate"
        [blocked] = flow.blocked([Q])
        assert (blocked.ordering_key, blocked.head, blocked.waiting) == ("o", ids[0], 2)
        q.retry_dead(ids[0])
        assert flow.blocked([Q]) == []
        [again] = q.claim([Q], "w")
        assert again.id == ids[0]
        q.fail(again.lease, "poison", retryable=False)
        assert flow.unblock(Q, "o") == ids[1], "skipping the dead head frees the next"
        [nxt] = q.claim([Q], "w")
        assert nxt.id == ids[1]
        q.complete(nxt.lease, {})
        [last] = q.claim([Q], "w")
        assert last.id == ids[2]
        q.cancel(ids[2])
        q.enqueue(Q, "t", {}, ordering_key="o")
        assert len(q.claim([Q], "w")) == 1, "an aggregate with nothing unfinished starts at once"
