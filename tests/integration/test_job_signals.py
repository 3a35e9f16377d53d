"""Signals (ctx.wait_for, Queue.signal, leaseq.signal) against a real PostgreSQL: a signal
sent before the wait is kept and returned, a wait hands the job back holding nothing and
shows what it waits for, a signal makes the job claimable at once, the deadline is recorded
once, and no signal is lost to a race with the hand-back, in either order."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.aio import AsyncQueue
from leaseq.cli.main import main
from leaseq.core._store import statements
from leaseq.runtime.context import JobContext
from leaseq_operator.metrics import OperatorMetrics
from support.dbtime import claim_one, db_now
from support.steps import context, take_over

#: Every wait for a condition here is bounded: a lost wake-up fails instead of hanging.
BOUND = 30.0


def poll(condition: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def waits(ctx: JobContext, name: str, timeout: float = 600) -> leaseq.Waiting:
    with pytest.raises(leaseq.Waiting) as raised:
        ctx.wait_for(name, timeout=timeout)
    return raised.value


def test_a_signal_sent_before_the_wait_is_returned_at_once_and_recorded(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    sent = queue.signal(job_id, "approve", {"by": "ana"})
    assert sent == leaseq.Signalled(job_id, "approve", stored=True, waiting=False)
    # One signal per name: the first is kept.
    assert not queue.signal(job_id, "approve", {"by": "bob"}).stored

    first = context(queue, claim_one(queue))
    assert first.wait_for("approve", timeout=60) == {"by": "ana"}
    # A later attempt gets the recorded payload (not a second read).
    with conn.transaction():
        conn.execute("UPDATE leaseq.job_signals SET payload = '\"changed\"' WHERE job_id = %s",
                     [job_id])  # fmt: skip
    second = context(queue, take_over(queue, conn, "w2"))
    assert second.wait_for("approve", timeout=60) == {"by": "ana"}
    assert [s.name for s in queue.steps(job_id)] == ["leaseq.wait-1.signal"]


def test_a_wait_hands_the_job_back_holding_nothing_and_a_signal_wakes_it(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    job = claim_one(queue)
    raised = waits(context(queue, job), "approve", timeout=3600)
    assert raised.name == "approve"
    assert isinstance(queue.wait(job.lease, raised.name, raised.until), leaseq.Released)

    row = queue.get(job_id)
    assert (row.status, row.attempt_count, row.lease_expires_at) == ("pending", 0, None)
    assert row.waiting_for == "approve" and row.waiting_since is not None
    assert row.available_at == raised.until  # the deadline: not claimable before it
    assert queue.claim(["q"], "w2") == []
    on = queue.waiting_on(job_id)
    assert on is not None and (on.waiting_for, on.deadline) == ("approve", raised.until)
    [waits_q] = queue.signal_waits()
    assert (waits_q.queue, waits_q.waiting) == ("q", 1)
    assert waits_q.oldest_age is not None and waits_q.oldest_age >= 0
    [attempt] = queue.attempts(job_id)
    assert attempt.outcome == "released" and "waiting for signal 'approve'" in (attempt.error or "")

    assert queue.signal(job_id, "other").waiting is False
    assert queue.claim(["q"], "w2") == []  # another name does not wake it
    assert queue.signal(job_id, "approve", [1, 2]).waiting is True
    again = claim_one(queue, "w2")
    assert queue.get(job_id).waiting_for is None  # the claim clears it
    assert context(queue, again).wait_for("approve", timeout=3600) == [1, 2]
    assert [s.name for s in queue.signals(job_id)] == ["other", "approve"]


def test_the_deadline_is_recorded_once_and_a_late_attempt_times_out(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    first = claim_one(queue)
    deadline = waits(context(queue, first), "approve", timeout=3600).until
    # A retry before the deadline waits for the same deadline, not a new hour.
    second = take_over(queue, conn, "w2")
    assert waits(context(queue, second), "approve", timeout=3600).until == deadline
    queue.wait(second.lease, "approve", deadline)
    # Time passes: the recorded deadline and the job's are behind the database's time.
    with conn.transaction():
        conn.execute(
            "UPDATE leaseq.job_steps SET result = to_jsonb(%s::text)"
            " WHERE job_id = %s AND name = 'leaseq.wait-1'",
            ((db_now(conn) - timedelta(seconds=1)).isoformat(), job_id),
        )
        conn.execute("UPDATE leaseq.jobs SET available_at = now() WHERE id = %s", [job_id])
    third = claim_one(queue, "w3")
    with pytest.raises(leaseq.WaitTimedOut, match="'approve'"):
        context(queue, third).wait_for("approve", timeout=3600)


def test_signalling_checks_its_arguments_and_the_job(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    with pytest.raises(leaseq.InvalidJob, match="invalid name"):
        queue.signal(job_id, "")
    with pytest.raises(leaseq.InvalidJob, match="invalid name: is 201 characters"):
        queue.signal(job_id, "x" * 201)
    with pytest.raises(leaseq.InvalidJob, match=r"invalid payload: is \d+ bytes"):
        queue.signal(job_id, "big", "x" * 70_000)
    with pytest.raises(leaseq.JobStateError, match="job 999999 does not exist"):
        queue.signal(999_999, "approve")
    queue.cancel(job_id)
    with pytest.raises(leaseq.JobStateError, match="has finished \\(cancelled\\)"):
        queue.signal(job_id, "approve")
    # The SQL function says the same, naming the argument.
    too_big = "SELECT * FROM leaseq.signal(1, 'a', to_jsonb(repeat('x', 70000)))"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid payload: is 70002"):
        conn.execute(too_big)
    conn.rollback()
    queue.enqueue("q", "t")
    ctx = context(queue, claim_one(queue))
    with pytest.raises(leaseq.InvalidJob, match="invalid timeout: must be a finite number"):
        ctx.wait_for("approve", timeout=float("inf"))
    with pytest.raises(leaseq.InvalidJob, match="invalid timeout: must be at most"):
        ctx.wait_for("approve", timeout=3651 * 86_400)


def test_the_asyncio_queue_signals_as_the_queue_does(
    queue: leaseq.Queue, database_url: str
) -> None:
    job_id = queue.enqueue("q", "t").job_id

    async def send() -> leaseq.Signalled:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            return await AsyncQueue(c).signal(job_id, "approve", {"ok": True})

    assert asyncio.run(send()) == leaseq.Signalled(job_id, "approve", True, False)
    assert [s.name for s in queue.signals(job_id)] == ["approve"]


# -- the race: a signal and the hand-back serialise on the job's row --------------------------


def blocked_on_a_lock(conn: leaseq.core.db.Conn, pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
    ).fetchone()
    return row is not None and row[0] == "Lock"


def test_a_signal_sent_while_the_hand_back_holds_the_row_wakes_the_job(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, database_url: str
) -> None:
    """The hand-back (leaseq.lease_wait: the row locked, then the signal looked for) is
    held open before its commit; the signal waits for its lock, then finds the job waiting
    for it and wakes it."""
    job_id = queue.enqueue("q", "t").job_id
    job = claim_one(queue)
    until = waits(context(queue, job), "approve", timeout=3600).until
    named = statements.load()
    params = {
        "id": job_id, "owner": job.lease.owner, "token": job.lease.token, "now": None,
        "secret": job.lease.secret,
        "started_at": job.lease.started_at, "name": "approve", "until": until,
    }  # fmt: skip
    with (
        psycopg.connect(database_url) as hand_back,
        leaseq.connect(database_url, action="test") as sender,
    ):
        [row] = hand_back.execute(named["job_wait"].query, params).fetchall()
        sent: list[leaseq.Signalled] = []
        thread = threading.Thread(target=lambda: sent.append(leaseq.Queue(sender).signal(
            job_id, "approve", "yes")))  # fmt: skip
        thread.start()
        poll(lambda: blocked_on_a_lock(conn, sender.info.backend_pid), "the signal to block")
        hand_back.commit()
        thread.join(BOUND)
    assert sent == [leaseq.Signalled(job_id, "approve", stored=True, waiting=True)]
    assert row[3] is False  # the hand-back did not see the signal: the signal woke the job
    assert claim_one(queue, "w2").id == job_id


def test_a_hand_back_while_a_signal_holds_the_row_sees_the_signal(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, database_url: str
) -> None:
    """The signal locks first and is held open there; the hand-back waits for it, then
    finds the signal and leaves the job claimable now."""
    job_id = queue.enqueue("q", "t").job_id
    job = claim_one(queue)
    until = waits(context(queue, job), "approve", timeout=3600).until
    with (
        psycopg.connect(database_url) as sender,
        leaseq.connect(database_url, action="test") as worker,
    ):
        [row] = sender.execute("SELECT * FROM leaseq.signal(%s, 'approve', '\"yes\"')",
                               [job_id]).fetchall()  # fmt: skip
        assert row == (True, False)  # stored; the job runs, so it was not waiting yet
        done: list[object] = []
        thread = threading.Thread(
            target=lambda: done.append(leaseq.Queue(worker).wait(job.lease, "approve", until))
        )
        thread.start()
        poll(lambda: blocked_on_a_lock(conn, worker.info.backend_pid), "the hand-back to block")
        sender.commit()
        thread.join(BOUND)
    assert done and isinstance(done[0], leaseq.Released)
    [attempt] = queue.attempts(job_id)
    assert "arrived while handing back" in (attempt.error or "")
    again = claim_one(queue, "w2")
    assert context(queue, again).wait_for("approve", timeout=3600) == "yes"


def test_the_cli_sends_a_signal_and_says_what_it_did(
    queue: leaseq.Queue, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    job = claim_one(queue)
    raised = waits(context(queue, job), "approve")
    queue.wait(job.lease, raised.name, raised.until)
    db = ["--database-url", database_url]
    assert main(["jobs", "show", str(job_id), *db]) == 0
    shown = capsys.readouterr().out
    assert "waiting for" in shown and "signal 'approve'" in shown and "wait deadline" in shown

    assert main(["signal", str(job_id), "approve", "--payload", '{"ok": true}', *db]) == 0
    assert "which waited for it: it runs next" in capsys.readouterr().out
    assert main(["signal", str(job_id), "approve", "--json", *db]) == 1
    assert json.loads(capsys.readouterr().out)["stored"] is False
    assert main(["signal", "999999", "approve", *db]) != 0
    assert "job 999999 does not exist" in capsys.readouterr().err
    again = claim_one(queue, "w2")
    assert context(queue, again).wait_for("approve", timeout=60) == {"ok": True}


def test_the_operator_counts_signal_waits_per_queue_and_the_oldest_wait_s_age(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """leaseq_queue_signal_waiting_jobs counts the jobs waiting for a signal (also counted
    as scheduled); leaseq_queue_oldest_signal_wait_age_seconds grows with the oldest wait,
    for alerts on a wait nobody answers; both are 0 for a queue where none waits."""
    metrics = OperatorMetrics()
    metrics.watch_queues(queue, leaseq.Workers(conn))

    def value(name: str, q: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"queue": q})

    ids = [queue.enqueue("approvals", "t").job_id for _ in range(2)]
    queue.enqueue("mail", "t")
    for _ in ids:
        [job] = queue.claim(["approvals"], "w1")
        raised = waits(context(queue, job), "approve", timeout=3600)
        queue.wait(job.lease, raised.name, raised.until)
    # Waiting since an hour ago, as if nobody answered.
    conn.execute(
        "UPDATE leaseq.jobs SET waiting_since = now() - interval '1 hour' WHERE id = %s",
        (ids[0],),
    )
    assert value("leaseq_queue_signal_waiting_jobs", "approvals") == 2
    scheduled = metrics.registry.get_sample_value(
        "leaseq_queue_jobs", {"queue": "approvals", "state": "scheduled"}
    )
    assert scheduled == 2
    age = value("leaseq_queue_oldest_signal_wait_age_seconds", "approvals")
    assert age is not None and 3600 <= age < 3600 + BOUND * 10
    assert value("leaseq_queue_signal_waiting_jobs", "mail") == 0
    assert value("leaseq_queue_oldest_signal_wait_age_seconds", "mail") == 0

    queue.signal(ids[0], "approve")  # claimable now: it waits no more once claimed
    assert len(queue.claim(["approvals"], "w1")) == 1
    assert value("leaseq_queue_signal_waiting_jobs", "approvals") == 1
    age = value("leaseq_queue_oldest_signal_wait_age_seconds", "approvals")
    assert age is not None and age < 3600


@pytest.mark.slow
def test_the_signal_wait_metrics_read_only_their_index_at_two_million_jobs(
    database_url: str,
) -> None:
    """queue_signal_waits (the operator's scrape, `leaseq status`) at 2,000,000 jobs, 1,000
    of them waiting for a signal in 10 queues: no sequential scan of jobs, and a few dozen
    buffers (the partial index, not the table)."""
    statement = statements.load()["queue_signal_waits"]
    with psycopg.connect(database_url, autocommit=True) as c:
        c.execute(
            "INSERT INTO leaseq.jobs (queue, job_type, payload, status, available_at,"
            " finished_at) SELECT 'q' || (g % 10), 't', '{}', s, now(),"
            " CASE WHEN s = 'succeeded' THEN now() END FROM generate_series(1, 2000000) g,"
            " LATERAL (SELECT (CASE WHEN g % 3 = 0 THEN 'pending' ELSE 'succeeded'"
            " END)::leaseq.job_status AS s) x"
        )
        c.execute(
            "UPDATE leaseq.jobs SET waiting_for = 'approve', waiting_since = now(),"
            " available_at = now() + interval '1 day'"
            " WHERE id IN (SELECT id FROM leaseq.jobs WHERE status = 'pending' LIMIT 1000)"
        )
        c.execute("VACUUM ANALYZE leaseq.jobs")
        row = c.execute(
            b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement.query,
            {"queues": None, "now": None},
        ).fetchone()
    assert row is not None
    plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]

    scanned = {
        n.get("Index Name") or n["Node Type"] for n in nodes(plan) if "Scan" in n["Node Type"]
    }
    assert scanned <= {"jobs_signal_wait_idx", "Result Scan", "CTE Scan"}, scanned
    buffers = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
    print(f"queue_signal_waits at 2,000,000 jobs: {buffers} buffers, {scanned}")
    assert buffers < 200, buffers


def test_after_a_caught_wait_the_attempt_s_ctx_calls_raise_the_wait_again(
    queue: leaseq.Queue,
) -> None:
    """A handler that caught the wait and goes on reaches the database no more: its next step,
    stream item, checkpoint or sleep raises the same wait, so no effect runs before the
    signal it asked for."""
    job_id = queue.enqueue("q", "t").job_id
    ctx = context(queue, claim_one(queue))
    asked = waits(ctx, "approve")
    calls: list[str] = []
    for call in (
        lambda: ctx.step("charge", lambda: calls.append("charged")),
        lambda: ctx.emit({"page": 1}),
        lambda: ctx.checkpoint({"page": 1}),
        lambda: ctx.sleep(60),
        lambda: ctx.wait_for("other", timeout=60),
    ):
        with pytest.raises(leaseq.Waiting) as again:
            call()
        assert again.value is asked
    assert calls == []
    assert [s.name for s in queue.steps(job_id)] == ["leaseq.wait-1"]
    assert ctx.suspension is asked


def test_the_cli_refuses_a_signal_the_waiting_job_does_not_wait_for(
    queue: leaseq.Queue, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt name to a job waiting for another signal is refused, saying what the job
    waits for, and nothing is stored; --ahead sends it for a later wait."""
    job_id = queue.enqueue("q", "t").job_id
    job = claim_one(queue)
    raised = waits(context(queue, job), "approve")
    queue.wait(job.lease, raised.name, raised.until)
    db = ["--database-url", database_url]

    assert main(["signal", str(job_id), "aprove", *db]) == 1
    err = capsys.readouterr().err
    assert "job" in err and "waits for signal 'approve', not 'aprove': nothing sent" in err
    assert queue.signals(job_id) == []
    assert queue.get(job_id).waiting_for == "approve"

    assert main(["signal", str(job_id), "publish", "--ahead", *db]) == 0
    assert "not waiting for it yet" in capsys.readouterr().out
    assert [s.name for s in queue.signals(job_id)] == ["publish"]
    assert queue.get(job_id).waiting_for == "approve"


def test_a_job_holds_a_bounded_number_and_size_of_signals_whoever_sends_them(
    database_url: str, queue: leaseq.Queue
) -> None:
    """Issue 59: the database took 127 MB of signals on one job. Past 1,000 signals or 4 MiB
    of their payloads, the signal is refused with what the bound is and nothing is stored,
    through the API and by a raw insert alike."""
    from leaseq.core import validation

    many = queue.enqueue("q", "t").job_id
    with psycopg.connect(database_url) as owner:
        owner.execute(
            "INSERT INTO leaseq.job_signals (job_id, name, payload)"
            " SELECT %s, 's' || g, 'null' FROM generate_series(1, %s) g",
            (many, validation.MAX_SIGNALS_PER_JOB - 1),
        )
    assert queue.signal(many, "last").stored
    with pytest.raises(leaseq.InvalidJob, match="at most 1000 signals"):
        queue.signal(many, "one-more")
    with (
        psycopg.connect(database_url) as owner,
        pytest.raises(psycopg.errors.InvalidParameterValue),
    ):
        owner.execute(
            "INSERT INTO leaseq.job_signals (job_id, name, payload) VALUES (%s, 'raw', 'null')",
            (many,),
        )
    big = queue.enqueue("q", "t").job_id
    payload = "x" * (validation.MAX_SIGNAL_BYTES - 2)  # 65,536 bytes as JSON
    per_job = validation.MAX_SIGNAL_BYTES_PER_JOB // validation.MAX_SIGNAL_BYTES
    for i in range(per_job):
        assert queue.signal(big, f"page-{i}", payload).stored
    with pytest.raises(leaseq.InvalidJob, match="4194304 bytes"):
        queue.signal(big, "one-more", "y")
    with psycopg.connect(database_url) as owner:
        counts = owner.execute(
            "SELECT job_id, count(*) FROM leaseq.job_signals GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert counts == [(many, validation.MAX_SIGNALS_PER_JOB), (big, per_job)]
