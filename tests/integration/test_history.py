"""The history: finished jobs move out of the hot table in batches, exactly once, into
partitions that retention drops whole; the ledger outlives them; one view answers for a job
wherever it is."""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry

import leaseq
from leaseq.cli.main import main
from leaseq.core.errors import DatabaseError
from leaseq.core.history import History
from leaseq.core.leadership import Leadership
from leaseq.core.models import JobPlace
from leaseq.core.workers import Workers
from leaseq.leader.history import PARTITIONS_AHEAD, HistoryDuty, HistoryMetrics
from leaseq.leader.reaper import LeaderLease, Reaper

Conn = leaseq.core.db.Conn
DAY = timedelta(days=1)


def finished(
    conn: Conn,
    rows: int,
    *,
    status: str = "succeeded",
    ago: timedelta = timedelta(hours=2),
    queue: str = "q",
    keys: bool = False,
) -> list[int]:
    """``rows`` jobs that finished ``ago`` (database time), one attempt each, an effect each
    when ``keys``; straight in SQL, as the lifecycle would leave them."""
    ids = [
        r[0]
        for r in conn.execute(
            "INSERT INTO leaseq.jobs (queue, job_type, status, attempt_count, lease_token,"
            " lease_owner, created_at, available_at, started_at, finished_at, last_error,"
            " last_error_code, idempotency_key)"
            " SELECT %(queue)s, 't', %(status)s::text::leaseq.job_status, 1, 1, 'w',"
            "        now() - %(ago)s, now() - %(ago)s, now() - %(ago)s, now() - %(ago)s,"
            "        CASE WHEN %(status)s::text = 'dead' THEN 'ValueError: boom' END,"
            "        CASE WHEN %(status)s::text = 'dead' THEN 'ValueError' END,"
            "        CASE WHEN %(keys)s THEN %(status)s::text || '-key-' || i END"
            "   FROM generate_series(1, %(rows)s) i RETURNING id",
            {"queue": queue, "status": status, "ago": ago, "rows": rows, "keys": keys},
        ).fetchall()
    ]
    conn.execute(
        "INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at,"
        " ended_at, outcome, traceback) SELECT id, 1, 1, 'w', started_at, finished_at,"
        " CASE WHEN status = 'succeeded' THEN 'succeeded' ELSE 'failed' END"
        "::leaseq.attempt_outcome,"
        " CASE WHEN status = 'dead' THEN 'Traceback (most recent call last): boom' END"
        " FROM leaseq.jobs WHERE id = ANY(%s)",
        (ids,),
    )
    if keys:
        conn.execute(
            "INSERT INTO leaseq.job_results (idempotency_key, job_id, produced_by, result, queue,"
            " job_type) SELECT idempotency_key, id, 'w', '{}', queue, job_type FROM leaseq.jobs"
            " WHERE id = ANY(%s)",
            (ids,),
        )
    return ids


def count(conn: Conn, sql: str, params: Any = None) -> int:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


def db_now(conn: Conn) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def duty(conn: Conn, *, hot_retention: float = 3600.0) -> HistoryDuty:
    return HistoryDuty(History(conn), hot_retention, timeout=10.0, budget=60.0)


def test_finished_jobs_move_with_attempts_ledger_and_counts(
    conn: Conn, queue: leaseq.Queue
) -> None:
    old = finished(conn, 30)
    dead = finished(conn, 5, status="dead")
    recent = finished(conn, 4, ago=timedelta(minutes=10))
    live = queue.enqueue("q", "t").job_id
    [running] = queue.claim(["q"], "w1")
    duty(conn).run()
    hot = {r[0] for r in conn.execute("SELECT id FROM leaseq.jobs").fetchall()}
    assert hot == {*recent, live, running.id}  # live and recently finished stay hot
    moved = {r[0] for r in conn.execute("SELECT id FROM leaseq.job_history").fetchall()}
    assert moved == {*old, *dead}
    assert count(conn, "SELECT count(*) FROM leaseq.job_ledger") == 35
    assert count(conn, "SELECT count(*) FROM leaseq.job_attempt_history") == 35
    # The evidence moves too: the failed attempts' tracebacks, for `jobs show` from history.
    assert (
        count(
            conn,
            "SELECT count(*) FROM leaseq.job_attempt_history WHERE traceback LIKE 'Traceback%%'",
        )
        == 5
    )
    [attempt] = History(conn).whereabouts(dead[0])[1]
    assert attempt.traceback == "Traceback (most recent call last): boom"
    assert (
        count(conn, "SELECT count(*) FROM leaseq.job_attempts WHERE job_id = ANY(%s)", (old,)) == 0
    )
    by_state = {(c.queue, c.status): c.jobs for c in History(conn).counts(since=86400)}
    assert by_state == {("q", "succeeded"): 34, ("q", "dead"): 5}
    # Retention is fixed per final state when a job moves: 7 days succeeded, 90 dead.
    kept = dict(
        conn.execute(
            "SELECT status::text, keep_days FROM leaseq.job_ledger GROUP BY 1, 2"
        ).fetchall()
    )
    assert kept == {"succeeded": 7, "dead": 90}


def test_counts_read_the_rollup_not_the_history(conn: Conn) -> None:
    finished(conn, 50)
    duty(conn).run()
    from leaseq.core._store import statements

    query = b"EXPLAIN (FORMAT JSON) " + statements.load()["history_counts"].query
    row = conn.execute(query, {"since": 86400.0, "queue": None, "now": None}).fetchone()
    assert row is not None
    plan = json.dumps(row[0])
    assert "history_counts" in plan
    assert "job_history" not in plan.replace("history_counts", "")


def test_jobs_show_answers_from_hot_history_and_ledger(
    conn: Conn, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    [hot] = finished(conn, 1, ago=timedelta(minutes=1))
    [moved] = finished(conn, 1, status="dead", ago=timedelta(hours=3))
    # Finished 10 days ago, 7 days of retention: already past it, it goes to the ledger only.
    [gone] = finished(conn, 1, ago=10 * DAY)
    duty(conn).run()

    def show(job_id: int) -> str:
        assert main(["jobs", "show", str(job_id), "--database-url", database_url]) == 0
        return capsys.readouterr().out

    assert re.search(r"found in +leaseq\.jobs ", show(hot))
    out = show(moved)
    assert re.search(r"found in +leaseq\.job_history ", out)
    assert "ValueError: boom" in out
    assert "failed" in out  # its attempt came along
    out = show(gone)
    assert re.search(r"found in +leaseq\.job_ledger only", out)
    assert "the ledger keeps no attempts" in out
    assert "payload" not in out
    assert main(["jobs", "show", str(gone), "--json", "--database-url", database_url]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["place"] == "ledger"

    # Its history dropped at the end of its retention, the moved job is still answered for.
    History(conn).expire_step(batch=100, timeout=10, now=db_now(conn) + 92 * DAY)
    assert History(conn).whereabouts(moved)[0].place == JobPlace.HISTORY
    duty(conn).retention(db_now(conn) + 92 * DAY)
    record, attempts = History(conn).whereabouts(moved)
    assert (record.place, record.status, record.last_error_code) == ("ledger", "dead", "ValueError")
    assert list(attempts) == []


def test_retention_drops_per_state_and_queue_and_keeps_what_must_stay(conn: Conn) -> None:
    history = History(conn)
    history.set_retention("succeeded", 2, queue="short")
    ok = finished(conn, 20, keys=True)
    dead = finished(conn, 3, status="dead", keys=True)
    short = finished(conn, 5, queue="short")
    now = db_now(conn)
    d = duty(conn)
    d.run(now)

    def remaining(ids: list[int]) -> int:
        return count(conn, "SELECT count(*) FROM leaseq.job_history WHERE id = ANY(%s)", (ids,))

    def effects(ids: list[int]) -> int:
        return count(conn, "SELECT count(*) FROM leaseq.job_results WHERE job_id = ANY(%s)", (ids,))

    # Nothing is past its retention yet: the jobs finished 2 h ago, so 2 days less 3 h on. Not
    # now + 2 days: between 00:00 and 02:00 they fall in yesterday's partition, which a day's
    # granularity drops once its whole day is past the 2 days (it then is, at now + 2 days).
    assert d.retention(now + 2 * DAY - timedelta(hours=3)) == []
    assert (remaining(ok), remaining(short)) == (20, 5)
    dropped = d.retention(now + 3 * DAY)  # the 2-day rule of queue "short" has ended
    assert dropped and all(name.endswith("_k2") for name in dropped)
    assert (remaining(ok), remaining(short), remaining(dead)) == (20, 0, 3)
    assert effects(ok) == 20  # effects follow their jobs' retention, not before
    d.retention(now + 8 * DAY)  # succeeded: 7 days
    assert (remaining(ok), remaining(dead), effects(ok), effects(dead)) == (0, 3, 0, 3)
    d.retention(now + 91 * DAY)  # dead: 90 days
    assert (remaining(dead), effects(dead)) == (0, 0)
    # The day the jobs finished went with its last leaf; the ledger outlives all of it.
    days = count(
        conn,
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'leaseq.job_history'::regclass"
        " AND inhrelid::regclass::text <= (SELECT 'leaseq.job_history_d'"
        "   || to_char(max(finished_at) AT TIME ZONE 'UTC', 'YYYYMMDD') FROM leaseq.job_ledger)",
    )
    assert days == 0
    assert count(conn, "SELECT count(*) FROM leaseq.job_ledger") == 28
    d.ledger(now + 401 * DAY)
    assert count(conn, "SELECT count(*) FROM leaseq.job_ledger") == 0


def test_retention_rules_are_checked(conn: Conn) -> None:
    history = History(conn)
    with pytest.raises(leaseq.InvalidJob, match="not a final state"):
        history.set_retention("pending", 3)
    with pytest.raises(leaseq.InvalidJob, match="longer than the ledger"):
        history.set_retention("dead", 500)
    with pytest.raises(leaseq.InvalidJob, match="ledger must outlive"):
        history.set_ledger_retention(30)
    with pytest.raises(leaseq.InvalidJob, match="cannot be removed"):
        history.unset_retention("dead", queue="*")


def test_a_timed_out_batch_halves_the_batch_which_grows_back_and_survives_a_new_leader(
    conn: Conn, database_url: str
) -> None:
    finished(conn, 300)
    conn.execute("UPDATE leaseq.history_mover SET batch = 80")
    # The partitions are made first under a generous bound: their DDL is not what is tested,
    # and on a loaded machine it can take longer than the mover's 0.2 s.
    History(conn).ensure_partitions(ahead=PARTITIONS_AHEAD, timeout=30.0)
    d = HistoryDuty(History(conn), 3600.0, timeout=0.2, budget=60.0)
    with psycopg.connect(database_url) as blocker:
        # Another session holds the ledger: the batch waits past its bound and is rolled back.
        blocker.execute("LOCK TABLE leaseq.job_ledger IN EXCLUSIVE MODE")
        d.run()
    assert count(conn, "SELECT count(*) FROM leaseq.job_history") == 0  # all or nothing
    assert count(conn, "SELECT count(*) FROM leaseq.jobs") == 300
    assert History(conn).mover_state().batch == 40
    assert d.metrics.timeouts._value.get() == 1
    # A new leader (a fresh duty) starts at 40 and doubles after each full batch:
    # 40 + 80 + 160 + 20 (of 320).
    again = HistoryDuty(History(conn), 3600.0, timeout=10.0, budget=60.0)
    assert again.move() == 300
    assert count(conn, "SELECT count(*) FROM leaseq.jobs") == 0
    assert History(conn).mover_state().batch == 320
    assert count(conn, "SELECT moved FROM leaseq.history_mover") == 300


def test_concurrent_movers_move_each_job_exactly_once(conn: Conn, database_url: str) -> None:
    ids = finished(conn, 12000)
    History(conn).ensure_partitions(ahead=2, timeout=10)
    totals: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def mover() -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as c:
                history = History(c)
                start.wait()
                moved = 0
                while True:
                    done = history.move(hot_retention=3600, batch=250, timeout=30).moved
                    if not done:
                        break
                    moved += done
                totals.append(moved)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=mover) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(totals) == len(ids)
    assert len([t for t in totals if t]) > 1  # they really ran side by side
    assert count(conn, "SELECT count(*) FROM leaseq.jobs") == 0
    assert count(conn, "SELECT count(DISTINCT id) FROM leaseq.job_history") == len(ids)
    assert count(conn, "SELECT count(*) FROM leaseq.job_history") == len(ids)
    assert count(conn, "SELECT count(*) FROM leaseq.job_attempt_history") == len(ids)
    assert count(conn, "SELECT count(*) FROM leaseq.job_ledger") == len(ids)
    assert count(conn, "SELECT sum(jobs) FROM leaseq.history_counts") == len(ids)


def test_the_mover_skips_a_finished_job_whose_row_another_transaction_holds(
    conn: Conn, database_url: str
) -> None:
    """A finished job locked elsewhere (an operator's retry or prune, a console action) is
    left for the next batch: the mover takes the others at once instead of waiting on it.
    Without SKIP LOCKED the move waits for the lock until its 5 s bound and fails."""
    locked, *others = finished(conn, 3)
    History(conn).ensure_partitions(ahead=2, timeout=10)
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", (locked,))
        moved = History(conn).move(hot_retention=3600, batch=10, timeout=5)
        assert moved.moved == len(others)
        holder.rollback()
    assert count(conn, "SELECT count(*) FROM leaseq.jobs") == 1
    assert History(conn).move(hot_retention=3600, batch=10, timeout=5).moved == 1
    assert count(conn, "SELECT count(*) FROM leaseq.job_history") == 3


class BrokenQueue(leaseq.Queue):
    """A queue whose reap statement fails, as a lost database would make it."""

    def reap(self, *args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("reap failed: the test broke it")


def test_a_failing_duty_stops_neither_the_reap_pass_nor_the_other_duties(
    conn: Conn, pool: Any, queue: leaseq.Queue
) -> None:
    lease = LeaderLease(Leadership(pool), "r1", ttl=30)
    registry = CollectorRegistry()
    history = HistoryDuty(
        History(pool), 3600.0, timeout=10.0, budget=60.0, metrics=HistoryMetrics(registry)
    )
    # The reap pass fails: the history duties still run.
    finished(conn, 10)
    broken = Reaper(lease, BrokenQueue(pool), Workers(pool), 1.0, history=history)
    with pytest.raises(DatabaseError):
        broken.run_once()
    assert count(conn, "SELECT count(*) FROM leaseq.job_history") == 10
    # The mover fails (no retention rule for a dead job): the reap pass still reaps, the other
    # duties still run, and the failure is counted.
    finished(conn, 2, status="dead")
    conn.execute("DELETE FROM leaseq.history_retention WHERE status = 'dead'")
    queue.enqueue("q", "t")
    [job] = queue.claim(["q"], "w1", lease_seconds=1)
    reaper = Reaper(lease, leaseq.Queue(pool), Workers(pool), 1.0, history=history)
    result = reaper.run_once(now=job.lease_expires_at + timedelta(seconds=1))
    assert [r.job_id for r in result.reaped] == [job.id]
    assert count(conn, "SELECT count(*) FROM leaseq.jobs WHERE status = 'dead'") == 2
    value = registry.get_sample_value("leaseq_history_duty_failures_total", {"outcome": "move"})
    assert value == 1
    assert (
        registry.get_sample_value("leaseq_history_duty_failures_total", {"outcome": "retention"})
        == 0
    )


def test_prune_dry_run_and_dead_jobs_refusal(
    conn: Conn, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    finished(conn, 3)
    finished(conn, 2, status="dead")
    db = ["--database-url", database_url]
    assert main(["prune", "--older-than", "1h", "--dry-run", "--include-dead", *db]) == 0
    out = capsys.readouterr().out
    assert "would delete 5 finished job(s)" in out
    assert "dead: 2" in out
    assert "succeeded: 3" in out
    assert count(conn, "SELECT count(*) FROM leaseq.jobs") == 5  # a dry run deletes nothing
    assert main(["prune", "--older-than", "1h", "--dry-run", *db]) == 0
    assert "would delete 3 finished job(s) and their attempts (dead jobs kept" in (
        capsys.readouterr().out
    )
    assert main(["prune", "--older-than", "1h", "--status", "dead", *db]) == 2
    assert "--include-dead" in capsys.readouterr().err
    assert main(["prune", "--older-than", "1h", *db]) == 0
    assert "deleted 3 finished job(s)" in capsys.readouterr().out
    assert count(conn, "SELECT count(*) FROM leaseq.jobs WHERE status = 'dead'") == 2
    with pytest.raises(SystemExit):
        main(["prune", "--older-than", "1m", *db])
    assert "ambiguous" in capsys.readouterr().err
    assert main(["prune", "--older-than", "1h", "--include-dead", "--json", *db]) == 0
    assert json.loads(capsys.readouterr().out) == {"deleted": 2}


def test_retention_command_shows_and_changes_the_rules(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", database_url]
    assert main(["retention", *db]) == 0
    out = capsys.readouterr().out
    assert "dead" in out and "90" in out and "400 days" in out
    assert main(["retention", "--queue", "ocr", "--dead", "30d", "--json", *db]) == 0
    rules = {(r["queue"], r["status"]): r["keep_days"] for r in json.loads(capsys.readouterr().out)}
    assert rules[("ocr", "dead")] == 30
    assert rules[("*", "succeeded")] == 7
    with pytest.raises(SystemExit):
        main(["retention", "--dead", "12h", *db])
    assert "whole number of days" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("hot", "history"), [("jobs", "job_history"), ("job_attempts", "job_attempt_history")]
)
def test_history_tables_keep_every_column_of_the_hot_tables(
    conn: Conn, hot: str, history: str
) -> None:
    """A column added to a hot table but not to its history would be dropped by the mover;
    only a live lease's digest is not history's (it proves nothing once the job finished)."""
    missing = conn.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = 'leaseq' AND table_name = %s"
        " EXCEPT SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = 'leaseq' AND table_name = %s",
        (hot, history),
    ).fetchall()
    assert [c for (c,) in missing if (hot, c) != ("jobs", "lease_digest")] == []
