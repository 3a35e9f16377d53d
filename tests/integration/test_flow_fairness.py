"""Fair shares across keys on a real PostgreSQL. Time is simulated through the statements'
``now`` (claims at T, completions at T + the job's run time), so run seconds are exact and
the test is deterministic: the database charges each key the seconds its attempts ran,
divided by its weight, and the keyed claim serves the least-charged key with work."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

import leaseq

Q = "fair"
LEASE = 86400.0


def _db_now(conn: leaseq.core.db.Conn) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def simulate(
    conn: leaseq.core.db.Conn,
    *,
    workers: int,
    seconds: float,
    run_time: Callable[[str], float],
) -> Counter[str]:
    """Run ``workers`` slots for ``seconds`` of simulated time; each claimed job runs
    ``run_time(key)``. Returns the run seconds each key got."""
    q = leaseq.Queue(conn)
    key_of = dict(conn.execute("SELECT id, key FROM leaseq.jobs WHERE queue = %s", (Q,)).fetchall())
    start = now = _db_now(conn) + timedelta(seconds=1)
    running: list[tuple[datetime, int, leaseq.Lease, str, float]] = []
    used: Counter[str] = Counter()
    free = workers
    while now < start + timedelta(seconds=seconds):
        while free:
            got = q.claim([Q], "w", lease_seconds=LEASE, now=now)
            if not got:
                break
            key = str(key_of[got[0].id])
            took = run_time(key)
            heapq.heappush(
                running, (now + timedelta(seconds=took), got[0].id, got[0].lease, key, took)
            )
            free -= 1
        if not running:
            break
        now, _, lease, key, took = heapq.heappop(running)
        assert isinstance(q.complete(lease, None, now=now), leaseq.Completed)
        used[key] += took
        free += 1
    return used


def test_weights_three_to_one_share_run_time_three_to_one(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        flow = leaseq.FlowControl(conn)
        flow.set_limit(Q, "heavy", weight=3)
        flow.set_limit(Q, "light", weight=1)
        leaseq.Queue(conn).enqueue_many(
            [leaseq.JobSpec(Q, "t", key=k) for _ in range(1500) for k in ("heavy", "light")]
        )
        # Uneven run times: the share is of seconds run, not of jobs.
        used = simulate(
            conn, workers=4, seconds=300, run_time=lambda k: 1.0 if k == "heavy" else 2.5
        )
    ratio = used["heavy"] / used["light"]
    print(f"run seconds: {dict(used)}; heavy:light = {ratio:.3f} (weights 3:1)")
    assert abs(ratio - 3.0) <= 0.3


def test_a_flooded_key_does_not_delay_a_new_key_beyond_two_rounds(database_url: str) -> None:
    """The article's test 8: 10,000 jobs from one key, then 10 from another."""
    workers = 4
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        q.enqueue_many([leaseq.JobSpec(Q, "t", {"n": n}, key="A") for n in range(10_000)])
        # A has run a while before B shows up (its charge is not zero).
        now = _db_now(conn) + timedelta(seconds=1)
        for _ in range(3):
            held = [
                j for _ in range(workers) for j in q.claim([Q], "w", lease_seconds=LEASE, now=now)
            ]
            now += timedelta(seconds=1)
            for job in held:
                q.complete(job.lease, None, now=now)
        b_ids = {
            r.job_id for r in q.enqueue_many([leaseq.JobSpec(Q, "t", key="B") for _ in range(10)])
        }
        first_b_round = None
        for round_no in (1, 2, 3):
            held = [
                j for _ in range(workers) for j in q.claim([Q], "w", lease_seconds=LEASE, now=now)
            ]
            assert len(held) == workers, "a claim round keeps every worker busy"
            if first_b_round is None and any(j.id in b_ids for j in held):
                first_b_round = round_no
            now += timedelta(seconds=1)
            for job in held:
                q.complete(job.lease, None, now=now)
    print(f"B's first job started in claim round {first_b_round}")
    assert first_b_round is not None and first_b_round <= 2


def test_a_lone_key_gets_all_capacity_and_priority_orders_within_a_key(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        ids = [q.enqueue(Q, "t", {"p": p}, key="solo", priority=p).job_id for p in (50, 10, 30, 20)]
        got = [j for _ in range(4) for j in q.claim([Q], f"w{_}", lease_seconds=LEASE)]
        assert [j.priority for j in got] == [10, 20, 30, 50]
        assert {j.id for j in got} == set(ids), "every worker got work: nothing is held back"


def test_a_key_back_from_idle_gets_no_saved_up_burst(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        q.enqueue_many([leaseq.JobSpec(Q, "t", key="busy") for _ in range(600)])
        q.enqueue(Q, "t", key="idle")
        used = simulate(conn, workers=2, seconds=100, run_time=lambda k: 1.0)
        # "idle" ran its one job and went idle; "busy" ran on and was charged ~100 s.
        assert used["idle"] == 1.0
        q.enqueue_many([leaseq.JobSpec(Q, "t", key="idle") for _ in range(200)])
        vt = dict(
            conn.execute(
                "SELECT key, vtime FROM leaseq.flow_keys WHERE queue = %s", (Q,)
            ).fetchall()
        )
        assert vt["idle"] >= vt["busy"] - 1e-9, "it returns level with the least-charged active key"
        used = simulate(conn, workers=2, seconds=100, run_time=lambda k: 1.0)
    share = used["idle"] / (used["idle"] + used["busy"])
    print(f"after returning: {dict(used)}")
    assert 0.4 <= share <= 0.6, "an even share from then on, not the 100 s it was idle"
