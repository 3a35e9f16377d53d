"""Rate limits per key on a real PostgreSQL: a token bucket taken in the claim, exact across
concurrent claimers; and a handler told to back off pauses its key and hands its job back
without spending an attempt."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import leaseq

Q = "rq"


def _db_now(conn: leaseq.core.db.Conn) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_rate_limit_is_exact_across_concurrent_claimers(database_url: str) -> None:
    """Simulated time (the statements' now): at each step, 8 claimers on their own
    connections claim at once, as much as they can; the starts of the key must be exactly
    what the bucket allows: the burst at first, then per_second a second, never more."""
    per_second, burst, claimers, steps = 4.0, 3.0, 8, 12
    with leaseq.connect(database_url, action="test") as conn:
        leaseq.FlowControl(conn).set_limit(Q, "api", per_second=per_second, burst=burst)
        leaseq.Queue(conn).enqueue_many([leaseq.JobSpec(Q, "t", key="api") for _ in range(500)])
        leaseq.Queue(conn).enqueue_many([leaseq.JobSpec(Q, "t", key="free") for _ in range(50)])
        t0 = _db_now(conn) + timedelta(seconds=5)
    started: list[list[int]] = [[] for _ in range(steps)]
    free_started = [0] * steps
    lock = threading.Lock()
    barrier = threading.Barrier(claimers)
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            with leaseq.connect(database_url, action="test") as c:
                q = leaseq.Queue(c)
                for step in range(steps):
                    now = t0 + timedelta(seconds=0.5 * step)
                    barrier.wait(timeout=30)
                    while got := q.claim([Q], f"w{n}", limit=2, lease_seconds=3600, now=now):
                        with lock:
                            for j in got:
                                if j.id <= 500:
                                    started[step].append(j.id)
                                else:
                                    free_started[step] += 1
                    barrier.wait(timeout=30)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    counts = [len(s) for s in started]
    # Allowed by a bucket of `burst` filling at per_second: 3 at t=0, then 2 per half second.
    total = 0
    for step, n in enumerate(counts):
        total += n
        allowed = burst + per_second * 0.5 * step
        assert total <= allowed + 1e-9, (step, counts)
        assert total == int(allowed), f"starts fall short of the bucket: {counts}"
    print(f"starts per half second: {counts}; the unlimited key: {sum(free_started)}")
    assert sum(free_started) == 50, "a rate-limited key never holds back another key"


def test_back_off_pauses_the_key_and_costs_no_attempt(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        a = q.enqueue(Q, "t", {}, key="api").job_id
        b = q.enqueue(Q, "t", {}, key="api").job_id
        other = q.enqueue(Q, "t", {}, key="other").job_id
        now = _db_now(conn)
        [job] = [j for j in q.claim([Q], "w", limit=1, now=now) if j.id in (a, b)] or [
            j for j in q.claim([Q], "w", limit=3, now=now) if j.id in (a, b)
        ]
        out = q.back_off(job.lease, 30, reason="429 Too Many Requests", now=now)
        assert isinstance(out, leaseq.Released)
        got = q.get(job.id)
        assert (got.status, got.attempt_count, got.last_error_code) == ("pending", 0, "BACK_OFF")
        ids = {j.id for j in q.claim([Q], "w", limit=10, now=now + timedelta(seconds=10))}
        assert not ids & {a, b}, "the key is paused: none of its jobs starts"
        assert ids <= {other}
        later = {j.id for j in q.claim([Q], "w", limit=10, now=now + timedelta(seconds=31))}
        assert later == {a, b} - ids
        [attempt] = [x for x in q.attempts(job.id) if x.lease_token == job.lease.token]
        assert attempt.outcome == "released"
