"""Per-key concurrency limits on a real PostgreSQL: the property test (16 concurrent claimers
on their own connections, limits 1, 3 and 40, with lost claims, a reaper, stale workers
completing after their job was reaped, retries, releases, and a limit lowered mid-run), the
deterministic race test, and the transitions that give a unit back."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.runtime.claims import ClaimPlanner
from support.flowcheck import intervals, max_running

Q = "fq"
CLAIMERS = 16
LEASE = 1.5
RETRY = leaseq.RetryPolicy(base_seconds=0.01, cap_seconds=0.05)


def _slots(conn: leaseq.core.db.Conn, key: str) -> list[tuple[object, ...]]:
    return conn.execute(
        "SELECT slot, retired, job_id, lease_token FROM leaseq.flow_slots"
        " WHERE queue = %s AND key = %s ORDER BY slot",
        (Q, key),
    ).fetchall()


def _held(conn: leaseq.core.db.Conn, key: str) -> int:
    return sum(1 for s in _slots(conn, key) if s[2] is not None)


def test_limit_holds_under_concurrent_claims_and_faults(database_url: str) -> None:
    rng = random.Random(20)
    jobs = {"k1": 40, "k3": 120, "k40": 400}
    with leaseq.connect(database_url, action="test") as conn:
        flow = leaseq.FlowControl(conn)
        flow.set_limit(Q, "k1", max_running=1)
        flow.set_limit(Q, "k3", max_running=3)
        flow.set_limit(Q, "k*", max_running=40)  # k40 by pattern
        specs = [
            leaseq.JobSpec(Q, "t", {"n": n}, key=key, max_attempts=50)
            for key, count in jobs.items()
            for n in range(count)
        ] + [leaseq.JobSpec(Q, "t", {"n": n}, max_attempts=50) for n in range(80)]
        rng.shuffle(specs)
        leaseq.Queue(conn).enqueue_many(specs)
    total = len(specs)
    stop = threading.Event()
    errors: list[BaseException] = []
    stale: list[threading.Thread] = []
    fenced: list[leaseq.Fenced] = []
    settled = threading.Semaphore(0)
    lowered_at: list[datetime] = []
    # When the reaper took each attempt (its row's end before a stale worker rewrites it).
    reaped_at: dict[tuple[int, int], datetime] = {}
    reaped_cond = threading.Condition()

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # surfaced by the test, never swallowed
                errors.append(exc)
                stop.set()

        return run

    def late_complete(lease: leaseq.Lease) -> None:
        # A stale worker: calls in after the reaper took its job back.
        with reaped_cond:
            reaped_cond.wait_for(
                lambda: (lease.job_id, lease.token) in reaped_at or stop.is_set(), timeout=60
            )
        with leaseq.connect(database_url, action="test") as c:
            q = leaseq.Queue(c, retry=RETRY)
            out = q.complete(lease, {"stale": True})
            assert isinstance(out, leaseq.Fenced), out
            fenced.append(out)

    def claimer(n: int) -> None:
        r = random.Random(n)
        with leaseq.connect(database_url, action="test") as c:
            q = leaseq.Queue(c, retry=RETRY)
            while not stop.is_set():
                got = q.claim([Q], f"w{n}", limit=r.choice([1, 1, 2, 4]), lease_seconds=LEASE)
                if not got:
                    time.sleep(0.002)
                    continue
                for job in got:
                    time.sleep(r.uniform(0, 0.003))
                    x = r.random()
                    if x < 0.03:
                        continue  # the claim's answer never arrived: the lease expires
                    if x < 0.05:
                        t = threading.Thread(target=guarded(lambda j=job: late_complete(j.lease)))
                        stale.append(t)
                        t.start()
                        continue
                    if x < 0.15:
                        assert isinstance(q.fail(job.lease, "boom"), leaseq.Failed)
                        continue
                    if x < 0.20:
                        assert isinstance(q.release(job.lease), leaseq.Released)
                        continue
                    assert isinstance(q.complete(job.lease, {"ok": 1}), leaseq.Completed)
                    settled.release()

    def reaper() -> None:
        with leaseq.connect(database_url, action="test") as c:
            q = leaseq.Queue(c, retry=RETRY)
            while not stop.wait(0.05):
                for r in q.reap():
                    row = c.execute(
                        "SELECT ended_at FROM leaseq.job_attempts"
                        " WHERE job_id = %s AND lease_token = %s",
                        (r.job_id, r.token),
                    ).fetchone()
                    assert row is not None
                    with reaped_cond:
                        reaped_at[(r.job_id, r.token)] = row[0]  # type: ignore[assignment]
                        reaped_cond.notify_all()

    def lower_limit() -> None:
        for _ in range(total // 3):
            if not settled.acquire(timeout=60):
                raise AssertionError("claimers stopped settling jobs")
        with leaseq.connect(database_url, action="test") as c:
            leaseq.FlowControl(c).set_limit(Q, "k*", max_running=2)
            row = c.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            lowered_at.append(row[0])  # type: ignore[arg-type]

    threads = [threading.Thread(target=guarded(lambda n=n: claimer(n))) for n in range(CLAIMERS)]
    threads += [
        threading.Thread(target=guarded(reaper)),
        threading.Thread(target=guarded(lower_limit)),
    ]
    for t in threads:
        t.start()
    try:
        with psycopg.connect(database_url, autocommit=True) as watch:
            deadline = time.monotonic() + 240
            while not stop.is_set() and time.monotonic() < deadline:
                row = watch.execute(
                    "SELECT count(*) FROM leaseq.jobs WHERE queue = %s AND status = 'succeeded'",
                    (Q,),
                ).fetchone()
                if row and row[0] == total:
                    break
                time.sleep(0.1)
    finally:
        stop.set()
        for t in threads + stale:
            t.join(timeout=60)
    if errors:
        raise errors[0]
    with psycopg.connect(database_url, autocommit=True) as conn:
        done = conn.execute(
            "SELECT count(*) FROM leaseq.jobs WHERE queue = %s AND status = 'succeeded'", (Q,)
        ).fetchone()
        assert done == (total,)
        spans = intervals(conn, Q, reaped_at)
        seen = {key: max_running(spans[key]) for key in jobs}
        print(f"most running at once per key: {seen}; stale completions fenced: {len(fenced)}")
        assert seen["k1"] <= 1
        assert seen["k3"] <= 3
        assert seen["k40"] <= 40
        assert seen["k3"] == 3, "the limit of 3 was reached (the test exercised it)"
        assert lowered_at, "the limit was lowered mid-run"
        after = max_running(spans["k40"], after=lowered_at[0])
        print(f"k40 after its limit was lowered to 2: at most {after} running at a start")
        assert after <= 2
        assert fenced, "stale workers called in"
        reaped = conn.execute(
            "SELECT count(*) FROM leaseq.job_attempts a JOIN leaseq.jobs j ON j.id = a.job_id"
            " WHERE j.queue = %s AND a.outcome IN ('lease_expired', 'fenced')",
            (Q,),
        ).fetchone()
        assert reaped and int(reaped[0]) > 0, "leases expired and were reaped"  # type: ignore[call-overload]
        held = conn.execute(
            "SELECT count(*) FROM leaseq.flow_slots WHERE job_id IS NOT NULL"
        ).fetchone()
        assert held == (0,), "every unit was given back"
    with leaseq.connect(database_url, action="test") as conn:
        assert leaseq.FlowControl(conn).repair() == {}, "the reaper's check found nothing to repair"


def test_open_claim_holding_the_only_unit_hides_the_key(database_url: str) -> None:
    """Deterministic race: while one claimer's transaction holds a key's only unit, a second
    claimer gets no job of that key (but does get other work); after it rolls back, it does."""
    with leaseq.connect(database_url, action="test") as conn:
        leaseq.FlowControl(conn).set_limit(Q, "solo", max_running=1)
        q = leaseq.Queue(conn)
        a = q.enqueue(Q, "t", {}, key="solo").job_id
        b = q.enqueue(Q, "t", {}, key="solo").job_id
        other = q.enqueue(Q, "t", {}, key="other").job_id
        plain = q.enqueue(Q, "t", {}).job_id
    first = psycopg.connect(database_url, autocommit=False)
    try:
        mine = leaseq.Queue(first).claim([Q], "first", limit=1)
        solo = [j for j in mine if j.id in (a, b)]
        if not solo:  # it took another key's job first: take the solo one in the same txn
            solo = [j for j in leaseq.Queue(first).claim([Q], "first", limit=4) if j.id in (a, b)]
        assert len(solo) == 1
        with leaseq.connect(database_url, action="test") as second:
            got = leaseq.Queue(second).claim([Q], "second", limit=10)
            ids = {j.id for j in got}
            assert not ids & {a, b}, "the second claimer got a job of the key whose unit is held"
            assert ids <= {other, plain}
        first.rollback()
        with leaseq.connect(database_url, action="test") as second:
            got = leaseq.Queue(second).claim([Q], "second", limit=10)
            assert len({j.id for j in got} & {a, b}) == 1, "one solo job once the unit is free"
    finally:
        first.close()


@pytest.mark.parametrize(
    "ending", ["complete", "fail_retry", "fail_dead", "fail_held", "release", "reap", "cancel"]
)
def test_every_way_out_of_running_gives_the_unit_back(database_url: str, ending: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        leaseq.FlowControl(conn).set_limit(Q, "k", max_running=1)
        q = leaseq.Queue(conn, retry=RETRY)
        job_id = q.enqueue(Q, "t", {}, key="k", max_attempts=3).job_id
        [job] = q.claim([Q], "w", lease_seconds=30)
        assert _held(conn, "k") == 1
        assert q.claim([Q], "w2") == [], "saturated"
        if ending == "complete":
            q.complete(job.lease, {})
        elif ending == "fail_retry":
            assert q.fail(job.lease, "x").status == leaseq.JobStatus.PENDING  # type: ignore[union-attr]
        elif ending == "fail_dead":
            assert q.fail(job.lease, "x", retryable=False).status == leaseq.JobStatus.DEAD  # type: ignore[union-attr]
        elif ending == "fail_held":
            # Stopped at an uncertain step: held for an operator, its unit given back.
            held = q.fail(job.lease, "x", retryable=False, error_code="StepUncertain")
            assert held.status == leaseq.JobStatus.HELD  # type: ignore[union-attr]
        elif ending == "release":
            q.release(job.lease)
        elif ending == "reap":
            later = conn.execute("SELECT now() + interval '1 hour'").fetchone()
            assert later is not None
            assert len(q.reap(now=later[0])) == 1  # type: ignore[arg-type]
        else:
            q.cancel(job_id)
        assert _held(conn, "k") == 0, "a job out of running (or in backoff) holds no unit"
        # A stale call after that frees nothing and takes nothing.
        if ending in ("reap", "cancel"):
            assert isinstance(q.complete(job.lease, {}), leaseq.Fenced)
        assert leaseq.FlowControl(conn).repair() == {}


def test_stale_worker_cannot_free_the_unit_of_the_next_attempt(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        leaseq.FlowControl(conn).set_limit(Q, "k", max_running=1)
        q = leaseq.Queue(conn)
        q.enqueue(Q, "t", {}, key="k")
        q.enqueue(Q, "t", {}, key="k")
        [old] = q.claim([Q], "old", lease_seconds=30)
        later = conn.execute("SELECT now() + interval '1 hour'").fetchone()
        assert later is not None
        q.reap(now=later[0])  # type: ignore[arg-type]
        [new] = q.claim([Q], "new", lease_seconds=30)
        assert _held(conn, "k") == 1
        assert isinstance(q.complete(old.lease, {}), leaseq.Fenced)
        assert isinstance(q.fail(old.lease, "late"), leaseq.Fenced)
        assert isinstance(q.release(old.lease), leaseq.Fenced)
        assert _slots(conn, "k")[0][2:] == (new.id, new.lease.token), "still the new holder's"
        assert q.claim([Q], "third") == [], "the unit is still held"


def test_lowered_limit_drains_and_raised_limit_opens(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        flow = leaseq.FlowControl(conn)
        flow.set_limit(Q, "k", max_running=3)
        q = leaseq.Queue(conn)
        for _ in range(6):
            q.enqueue(Q, "t", {}, key="k")
        running = [j for _ in range(5) for j in q.claim([Q], "w")]
        assert len(running) == 3
        assert flow.set_limit(Q, "k", max_running=1) == 1
        q.complete(running[0].lease, {})
        q.complete(running[1].lease, {})
        assert q.claim([Q], "w") == [], "one still runs: the new limit of 1 is reached"
        q.complete(running[2].lease, {})
        [next_job] = q.claim([Q], "w")
        assert q.claim([Q], "w") == []
        flow.set_limit(Q, "k", max_running=2)
        assert len(q.claim([Q], "w")) == 1
        assert q.claim([Q], "w") == []
        # Unlimited -> limited while jobs run: the running ones count.
        flow.remove_limit(Q, "k")
        assert len(q.claim([Q], "w", limit=1)) == 1  # the last one, no limit now
        flow.set_limit(Q, "k", max_running=1)
        assert _held(conn, "k") == 3, "each running job holds a unit (two past the limit)"
        assert [lim.key_pattern for lim in flow.limits(Q)] == ["k"]
        assert next_job.id not in {j.id for j in running}


def test_keyless_claim_reads_no_flow_table(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        planner = ClaimPlanner()  # a worker's
        for _ in range(5):
            q.enqueue(Q, "t", {})
        before = conn.execute(
            "SELECT coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0) FROM pg_stat_user_tables"
            " WHERE relname LIKE 'flow\\_%%'"
        ).fetchone()
        for _ in range(5):
            assert len(q.claim([Q], "w", plan=planner)) == 1
        conn.execute("SELECT pg_stat_force_next_flush()")
        after = conn.execute(
            "SELECT coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0) FROM pg_stat_user_tables"
            " WHERE relname LIKE 'flow\\_%%'"
        ).fetchone()
        # Every 16th round probes the keyed claim (it may find keyed work); 5 rounds do not.
        assert before == after


def _keyless_claim_scans(conn: leaseq.core.db.Conn) -> object:
    conn.execute("SELECT pg_stat_force_next_flush()")
    return conn.execute(
        "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'jobs_claim_idx'"
    ).fetchone()


def test_a_keyed_only_queue_runs_only_the_keyed_claim(database_url: str) -> None:
    """Once a worker's keyless claim has found nothing, it is tried first only every 16th
    round: a queue of keyed jobs pays one statement a claim."""
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        planner = ClaimPlanner()  # a worker's
        for n in range(6):
            q.enqueue(Q, "t", {}, key=f"k{n}")
        assert len(q.claim([Q], "w", plan=planner)) == 1
        before = _keyless_claim_scans(conn)
        for _ in range(5):
            assert len(q.claim([Q], "w", plan=planner)) == 1
        assert _keyless_claim_scans(conn) == before


def test_a_batch_never_takes_more_jobs_of_a_key_than_its_free_units(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        leaseq.FlowControl(conn).set_limit(Q, "a-limited", max_running=3)
        q = leaseq.Queue(conn)
        q.enqueue_many([leaseq.JobSpec(Q, "t", key="a-limited") for _ in range(10)])
        q.enqueue_many([leaseq.JobSpec(Q, "t", key="z-free") for _ in range(10)])
        got = q.claim([Q], "w", limit=10)
        keys = dict(conn.execute("SELECT id, key FROM leaseq.jobs").fetchall())
        taken = [keys[j.id] for j in got]
        assert taken.count("a-limited") == 3, taken
        # The limited key is served first (same virtual time, first by name): 3, then the
        # rest of the batch from the next key.
        assert len(got) == 10
        again = q.claim([Q], "w", limit=10)
        assert [keys[j.id] for j in again].count("a-limited") == 0


OPEN, SLOTS, FULL = "job_claim_keyed_open", "job_claim_keyed_slots", "job_claim_keyed"


def _claims_by(q: leaseq.Queue, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keyed claim statements ``q`` runs, in order, as they run."""
    ran: list[str] = []
    # Private: which statement a claim takes is what is tested.
    store = q._store

    def recorded(name: str) -> Callable[..., Any]:
        run = getattr(store, name)

        def statement(*args: Any) -> Any:
            ran.append(name)
            return run(*args)

        return statement

    for name in (OPEN, SLOTS, FULL):
        monkeypatch.setattr(store, name, recorded(name))
    return ran


def test_keyed_claims_take_the_cheapest_statement_that_keeps_the_limits(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys of a queue with no limit are claimed by job_claim_keyed_open; a limit set at run
    time from elsewhere holds from the worker's next claim on, its running jobs counted, and
    the worker goes on by job_claim_keyed_slots; a rate set at run time holds from the next
    claim on too, by job_claim_keyed."""
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        ran = _claims_by(q, monkeypatch)
        planner = ClaimPlanner()  # a worker's
        q.enqueue_many([leaseq.JobSpec(Q, "t", key="k") for _ in range(10)])
        running = [j for _ in range(2) for j in q.claim([Q], "w", plan=planner)]
        assert len(running) == 2
        assert ran == [OPEN, OPEN]
        with leaseq.connect(database_url, action="test") as other:
            leaseq.FlowControl(other).set_limit(Q, "k", max_running=1)
        ran.clear()
        assert q.claim([Q], "w", plan=planner) == [], "two run, the new limit is 1"
        assert ran == [OPEN, SLOTS], "open found the limit, and no rate"
        q.complete(running[0].lease, {})
        assert q.claim([Q], "w", plan=planner) == [], "one still runs"
        q.complete(running[1].lease, {})
        [third] = q.claim([Q], "w", plan=planner)
        assert q.claim([Q], "w", plan=planner) == []
        assert ran == [OPEN, SLOTS, SLOTS, SLOTS, SLOTS]
        q.complete(third.lease, {})
        with leaseq.connect(database_url, action="test") as other:
            leaseq.FlowControl(other).set_limit(Q, "k", max_running=1, per_second=0.001)
        ran.clear()
        # A full bucket (burst 1 by default): one start, then none for 1,000 s.
        [fourth] = q.claim([Q], "w", plan=planner)
        assert ran == [SLOTS, FULL], "the slots claim found the rate"
        q.complete(fourth.lease, {})
        for _ in range(3):
            assert q.claim([Q], "w", plan=planner) == [], "the rate holds"
        assert ran == [SLOTS, FULL, FULL, FULL, FULL]


@pytest.mark.parametrize("rate", [None, 1000.0])
def test_a_removed_limit_sends_claims_back_to_the_open_statement(
    database_url: str, monkeypatch: pytest.MonkeyPatch, rate: float | None
) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        flow = leaseq.FlowControl(conn)
        flow.set_limit(Q, "k", max_running=1, per_second=rate, burst=rate)
        q = leaseq.Queue(conn)
        ran = _claims_by(q, monkeypatch)
        planner = ClaimPlanner()  # a worker's
        q.enqueue_many([leaseq.JobSpec(Q, "t", key="k") for _ in range(80)])
        assert len(q.claim([Q], "w", limit=4, plan=planner)) == 1  # claim round 1: "limited"
        kept = SLOTS if rate is None else FULL
        assert ran == [OPEN, kept]
        flow.remove_limit(Q, "k")
        ran.clear()
        for _ in range(62):  # rounds 2 to 63: by the statement the limits called for
            assert len(q.claim([Q], "w", limit=1, plan=planner)) == 1
        assert ran == [kept] * 62
        # One round in 64 asks the open claim again; from then on it serves the queue.
        assert len(q.claim([Q], "w", limit=2, plan=planner)) == 2
        assert len(q.claim([Q], "w", limit=2, plan=planner)) == 2
        assert ran[62:] == [OPEN, OPEN]


def test_a_claim_given_no_plan_runs_the_same_statements_every_time(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queue.claim keeps nothing between calls: without a worker's planner each call that
    finds no keyless job takes keyed ones by job_claim_keyed, whatever earlier calls found,
    and the limit holds."""
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        ran = _claims_by(q, monkeypatch)
        q.enqueue_many([leaseq.JobSpec(Q, "t", key="k") for _ in range(5)])
        assert len(q.claim([Q], "w", limit=2)) == 2
        leaseq.FlowControl(conn).set_limit(Q, "k", max_running=3)
        assert len(q.claim([Q], "w", limit=2)) == 1, "three run: the limit holds"
        assert q.claim([Q], "w") == []
        assert ran == [FULL, FULL, FULL]
