"""What a keyed job's release does beyond giving its unit back (migration 18): it wakes
claimers only when the unit can start a job nobody could start before, it charges run time
only while keys compete, it never leaves a key with work inactive, and a retried keyed job is
claimable again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import leaseq
from support.wakeups import Listening, listening, notified

Q = "rel"


@pytest.fixture
def listener(database_url: str) -> Iterator[Listening]:
    with listening(database_url) as conn:
        yield conn


def test_a_release_wakes_claimers_only_when_its_unit_starts_a_waiting_job(
    database_url: str, listener: Listening
) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        flow = leaseq.FlowControl(conn)
        flow.set_limit(Q, "one", max_running=1)
        flow.set_limit(Q, "two", max_running=2)
        q = leaseq.Queue(conn)
        key_of = {q.enqueue(Q, "t", {}, key=key).job_id: key
                  for key in ("free", "free", "one", "one", "two", "two")}  # fmt: skip
        running: dict[str, list[leaseq.ClaimedJob]] = {"free": [], "one": [], "two": []}
        for _ in range(3):
            for job in q.claim([Q], "w", limit=10):
                running[key_of[job.id]].append(job)
        assert [len(running[k]) for k in ("free", "one", "two")] == [2, 1, 2]
        notified(listener)

        # An unlimited key: nobody waits for it.
        q.complete(running["free"][0].lease, None)
        assert notified(listener) == []
        # A saturated key (limit 1) with a ready job: its unit starts that job.
        q.complete(running["one"][0].lease, None)
        assert notified(listener) == [Q]
        # That job claimed; its release leaves nothing ready: nobody to wake.
        [last] = q.claim([Q], "w")
        q.complete(last.lease, None)
        assert notified(listener) == []
        # Limit 2 with both running and nothing ready: no wake-up either.
        q.complete(running["two"][0].lease, None)
        assert notified(listener) == []


def test_a_saturated_key_handing_its_job_back_wakes_claimers(
    database_url: str, listener: Listening
) -> None:
    """A worker that releases its job (SIGTERM) gives back the unit and a ready job at once."""
    with leaseq.connect(database_url, action="test") as conn:
        leaseq.FlowControl(conn).set_limit(Q, "one", max_running=1)
        q = leaseq.Queue(conn)
        q.enqueue(Q, "t", {}, key="one")
        [job] = q.claim([Q], "w")
        notified(listener)
        q.release(job.lease)
        assert notified(listener) == [Q]


def _vtimes(conn: leaseq.core.db.Conn) -> dict[str, float]:
    rows = conn.execute("SELECT key, vtime FROM leaseq.flow_keys WHERE queue = %s", [Q]).fetchall()
    return {str(k): float(v) for k, v in rows}


def test_run_time_is_charged_only_while_keys_compete(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        q.enqueue(Q, "t", {}, key="a")
        q.enqueue(Q, "t", {}, key="a")
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        t0 = row[0]
        [job] = q.claim([Q], "w", now=t0, lease_seconds=3600)
        q.complete(job.lease, None, now=t0 + timedelta(seconds=10))
        assert _vtimes(conn) == {"a": 0.0}, "a lone key is charged nothing"
        # b arrives level with a; from now on a's run time counts.
        q.enqueue(Q, "t", {}, key="b")
        assert _vtimes(conn) == {"a": 0.0, "b": 0.0}
        [job] = q.claim([Q], "w", now=t0, lease_seconds=3600)
        q.complete(job.lease, None, now=t0 + timedelta(seconds=4))
        charged = _vtimes(conn)
        assert charged["a"] == pytest.approx(4.0) or charged["b"] == pytest.approx(4.0)


def test_an_enqueue_holding_the_keys_row_is_seen_by_its_last_release(database_url: str) -> None:
    """The release of a key's last running job, racing an enqueue of the same key whose
    transaction holds the key's row: the release waits for it, sees its job, and leaves the
    key active, so the new job is claimed."""
    with leaseq.connect(database_url, action="test") as conn:
        q = leaseq.Queue(conn)
        q.enqueue(Q, "t", {}, key="k")
        [job] = q.claim([Q], "w", lease_seconds=3600)
        enqueuer = psycopg.connect(database_url, autocommit=False)
        try:
            new = leaseq.Queue(enqueuer).enqueue(Q, "t", {}, key="k").job_id
            done: list[object] = []
            completer = threading.Thread(target=lambda: done.append(q.complete(job.lease, None)))
            completer.start()
            with psycopg.connect(database_url, autocommit=True) as watch:
                while watch.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchone() == (0,):
                    assert completer.is_alive(), "the release did not wait for the enqueue"
            enqueuer.commit()
            completer.join(timeout=30)
        finally:
            enqueuer.close()
        assert isinstance(done[0], leaseq.Completed)
        active = conn.execute(
            "SELECT active FROM leaseq.flow_keys WHERE queue = %s AND key = 'k'", [Q]
        ).fetchone()
        assert active == (True,), "the key with a pending job was left inactive"
        assert [j.id for j in q.claim([Q], "w")] == [new]


def test_a_retried_dead_keyed_job_is_claimed_again(database_url: str) -> None:
    with leaseq.connect(database_url, action="test") as conn:
        leaseq.FlowControl(conn).set_limit(Q, "k", max_running=1)
        q = leaseq.Queue(conn)
        job_id = q.enqueue(Q, "t", {}, key="k", max_attempts=1).job_id
        [job] = q.claim([Q], "w")
        assert q.fail(job.lease, "boom").status == leaseq.JobStatus.DEAD
        q.retry_dead(job_id)
        assert [j.id for j in q.claim([Q], "w")] == [job_id]


def test_short_attempts_are_charged_in_expectation_and_rarely_rewrite_the_key(
    database_url: str,
) -> None:
    """400 attempts of 5 ms against a competing key: each is charged 50 ms with probability
    0.1, so the key's virtual time comes to 2 s in expectation (standard deviation 0.3 s) and
    its row is rewritten about 40 times, not 400."""
    with leaseq.connect(database_url, action="test") as conn:
        leaseq.FlowControl(conn).set_limit(Q, "b", max_running=0)  # active, never claimed
        q = leaseq.Queue(conn)
        q.enqueue(Q, "t", {}, key="b")
        q.enqueue_many([leaseq.JobSpec(Q, "t", key="a") for _ in range(401)])
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        t0 = row[0]

        def rewrites() -> int:
            conn.execute("SELECT pg_stat_force_next_flush()")
            got = conn.execute(
                "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'flow_keys'"
            ).fetchone()
            assert got is not None
            return int(got[0])

        before = rewrites()
        for n in range(400):
            [job] = q.claim([Q], "w", now=t0 + timedelta(seconds=n), lease_seconds=3600)
            q.complete(job.lease, None, now=t0 + timedelta(seconds=n + 0.005))
        charged = _vtimes(conn)["a"]
        assert 0.8 < charged < 3.2, charged
        assert rewrites() - before < 120


def _active(conn: leaseq.core.db.Conn) -> dict[str, bool]:
    rows = conn.execute("SELECT key, active FROM leaseq.flow_keys WHERE queue = %s", (Q,))
    return {str(k): bool(a) for k, a in rows.fetchall()}


def test_a_key_whose_jobs_ended_without_running_goes_idle_at_the_sweep(
    database_url: str,
) -> None:
    """Only a key's last running job deactivates it when it ends: a key whose pending jobs
    were cancelled, or whose only job waits for a parent, stayed active, and claims walked it.
    The reaper's sweep deactivates those, and leaves a key with a pending or a running job;
    the next job of an idle key activates it again."""
    with leaseq.connect(database_url, action="test") as conn:
        flow = leaseq.FlowControl(conn)
        flow.set_limit(Q, "limited", max_running=2)
        q = leaseq.Queue(conn)
        for key in ("gone", "limited"):
            for _ in range(3):
                q.cancel(q.enqueue(Q, "t", key=key).job_id)
        q.enqueue(Q, "t", key="ready")
        running = q.enqueue(Q, "t", key="busy").job_id
        (job,) = q.claim([Q], "w", limit=1, job_types=["t"])
        assert job.id == running
        parent = q.enqueue(Q, "parent").job_id
        g = leaseq.Graph("after")
        g.add(Q, "t", key="after", after=[parent])
        q.enqueue_graph(g)
        assert all(_active(conn).values())

        assert flow.settle(ahead=10) == {Q: leaseq.KeysSettled(idle=3, asleep=0, woken=0)}
        assert _active(conn) == {
            "gone": False, "limited": False, "after": False, "ready": True, "busy": True,
        }  # fmt: skip
        assert flow.settle(ahead=10) == {}
        again = q.enqueue(Q, "t", key="gone").job_id
        assert _active(conn)["gone"]
        assert {c.id for c in q.claim([Q], "w", limit=10, job_types=["t"])} >= {again}


def test_the_sweep_skips_a_key_an_uncommitted_enqueue_holds(database_url: str) -> None:
    """An enqueue in flight holds its key's row until it commits: the sweep skips the key
    (it never waits for a key's row: a lock timeout here would say it did), and the job,
    once committed, is claimable."""
    with leaseq.connect(database_url, action="test") as conn:
        conn.execute("SET lock_timeout = '10s'")
        q = leaseq.Queue(conn)
        q.cancel(q.enqueue(Q, "t", key="k").job_id)
        with leaseq.connect(database_url, action="test") as other:
            other.execute("BEGIN")
            job = leaseq.Queue(other).enqueue(Q, "t", key="k").job_id
            assert leaseq.FlowControl(conn).settle(ahead=10) == {}
            other.execute("COMMIT")
        assert _active(conn) == {"k": True}
        assert [c.id for c in q.claim([Q], "w", limit=10)] == [job]


def _asleep(conn: leaseq.core.db.Conn) -> dict[str, bool]:
    rows = conn.execute(
        "SELECT key, next_at IS NOT NULL FROM leaseq.flow_keys WHERE queue = %s", (Q,)
    )
    return {str(k): bool(a) for k, a in rows.fetchall()}


def test_a_key_whose_jobs_are_all_due_later_sleeps_out_of_the_turn(database_url: str) -> None:
    """A key with nothing ready for a while (a job due in 100 s) leaves the turn the claims
    walk until shortly before its job is due: the sweep puts it to sleep, and wakes it once
    the job is within ``ahead``; a key with a job due within twice ``ahead`` stays in turn,
    and an enqueue of a ready job wakes a sleeping key at once."""
    with leaseq.connect(database_url, action="test") as conn:
        flow = leaseq.FlowControl(conn)
        q = leaseq.Queue(conn)
        q.enqueue(Q, "t", key="later", delay=100)
        q.enqueue(Q, "t", key="soon", delay=15)
        q.enqueue(Q, "t", key="now")
        settled = {Q: leaseq.KeysSettled(idle=0, asleep=1, woken=0)}
        assert flow.settle(ahead=10) == settled  # "soon" is due within 20 s
        assert _asleep(conn) == {"later": True, "soon": False, "now": False}
        assert flow.settle(ahead=10) == {}  # asleep: not in the turn any more
        woken = {Q: leaseq.KeysSettled(idle=0, asleep=0, woken=1)}
        assert flow.settle(ahead=120) == woken  # within 120 s of its job
        assert _asleep(conn) == {"later": False, "soon": False, "now": False}
        assert flow.settle(ahead=10) == settled
        ready = q.enqueue(Q, "t", key="later").job_id  # a ready job wakes it
        assert _asleep(conn)["later"] is False
        assert ready in {c.id for c in q.claim([Q], "w", limit=10)}


def test_a_signal_and_a_resume_wake_a_sleeping_key(database_url: str) -> None:
    """A job waiting for a signal until tomorrow, and a ready job of a key paused for an
    hour, sleep; the signal makes its job claimable at once and wakes its key, as the
    resume does its key."""
    with leaseq.connect(database_url, action="test") as conn:
        flow = leaseq.FlowControl(conn)
        q = leaseq.Queue(conn)
        waiting = q.enqueue(Q, "t", key="waits").job_id
        (held,) = q.claim([Q], "w", limit=10)
        until = datetime.now(UTC) + timedelta(days=1)
        assert isinstance(q.wait(held.lease, "approve", until), leaseq.Released)
        paused = q.enqueue(Q, "t", key="paused").job_id
        assert flow.pause(Q, "paused", datetime.now(UTC) + timedelta(hours=1)) is not None
        assert flow.settle(ahead=10) == {Q: leaseq.KeysSettled(idle=0, asleep=2, woken=0)}
        assert q.claim([Q], "w", limit=10) == []

        q.signal(waiting, "approve", {"ok": True})
        assert _asleep(conn) == {"waits": False, "paused": True}
        assert [c.id for c in q.claim([Q], "w", limit=10)] == [waiting]
        assert flow.resume(Q, "paused")
        assert _asleep(conn)["paused"] is False
        assert [c.id for c in q.claim([Q], "w", limit=10)] == [paused]
