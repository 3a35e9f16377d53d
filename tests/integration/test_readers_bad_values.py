"""Every reader answers whatever value a column holds: rows with ``-infinity``, ``infinity``
and a year past 9999 in their times, a 1 MiB payload, and a flood of 200 queues (written
directly as the owner: support.badrows). One bad row never blanks a listing or a metric for
the other queues."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import psycopg
import pytest
from prometheus_client import generate_latest

import leaseq
from leaseq.aio import AsyncQueue
from leaseq.cli.main import main
from leaseq_operator.metrics import OperatorMetrics
from support.badrows import BAD, EXTREMES, GOOD, MIB, Planted, flood, plant


@pytest.fixture
def planted(conn: leaseq.core.db.Conn) -> Planted:
    return plant(conn)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    return code, captured.out


def test_status_answers_and_reports_every_queue(
    database_url: str, planted: Planted, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", database_url]
    _, out = run(capsys, "status", "--json", *db)
    shown = json.loads(out)
    queues = {q["queue"]: q for q in shown["queues"]}
    assert queues[GOOD]["ready"] == 1
    # Due at -infinity, at a time past 9999 is "scheduled"; the running job is running.
    assert (queues[BAD]["ready"], queues[BAD]["running"], queues[BAD]["dead"]) == (2, 1, 1)
    for age_field in ("oldest_ready_age", "max_heartbeat_age"):
        assert queues[BAD][age_field] is None or queues[BAD][age_field] < 1e12
    [worker] = shown["workers"]
    assert worker["worker_id"] == "w-bad"
    assert shown["waiting_for_signals"] == {BAD: 3}
    _, out = run(capsys, "status", *db)
    assert GOOD in out and BAD in out and "w-bad" in out
    assert f"waiting for a signal (holding no worker): {BAD} 3" in out


def test_jobs_list_and_show_answer_for_every_bad_row(
    database_url: str, planted: Planted, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", database_url]
    _, out = run(capsys, "jobs", "list", "--json", *db)
    listed = {j["id"]: j for j in json.loads(out)}
    assert planted.good in listed and planted.big in listed
    assert listed[planted.dead]["finished_at"] == "infinity"
    _, out = run(capsys, "jobs", "list", "--queue", BAD, *db)
    assert "infinity" in out and len(out) < MIB  # the table shows no payload
    ids = [*planted.pending.values(), planted.running, planted.dead, planted.big]
    for job_id in ids:
        _, text = run(capsys, "jobs", "show", str(job_id), *db)
        assert f"id{' ' * 16}{job_id}" in text or str(job_id) in text
        _, out = run(capsys, "jobs", "show", str(job_id), "--json", *db)
        assert json.loads(out)["job"]["id"] == job_id
    _, text = run(capsys, "jobs", "show", str(planted.pending["-infinity"]), *db)
    assert "-infinity" in text
    # What it waits for is shown, escaped; since when too, whatever the time.
    assert "waiting for" in text and "approve\\x1b[31m\\u202e" in text and "\x1b" not in text
    lines = text.splitlines()
    assert any(line.startswith("waiting since") and line.endswith("-infinity") for line in lines)
    _, text = run(capsys, "jobs", "show", str(planted.dead), *db)
    assert "infinity" in text  # finished past 9999: more than a datetime holds


def test_other_cli_listings_answer(
    database_url: str, planted: Planted, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--database-url", database_url]
    _, out = run(capsys, "limits", "keys", *db)
    assert "tenant-a" in out and "infinity" in out
    _, out = run(capsys, "limits", "keys", "--json", *db)
    [key] = [k for k in json.loads(out)["keys"] if k["key"] == "tenant-a"]
    assert key["paused_until"] == "infinity"
    _, out = run(capsys, "pipelines", "list", *db)
    assert "bad-pipe" in out
    run(capsys, "pipelines", "list", "--json", *db)
    run(capsys, "pipelines", "show", str(planted.pipeline), *db)
    run(capsys, "pipelines", "show", str(planted.pipeline), "--json", *db)
    _, out = run(capsys, "schedules", "list", *db)
    assert "bad-schedule" in out
    _, out = run(capsys, "schedules", "list", "--json", *db)
    [schedule] = json.loads(out)
    assert schedule["last_slot"] == "-infinity"


def test_queue_metrics_stay_for_every_queue(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, planted: Planted
) -> None:
    metrics = OperatorMetrics()
    metrics.watch_queues(queue, leaseq.Workers(conn))
    metrics.watch_flow(leaseq.FlowControl(conn))
    metrics.watch_schedules(leaseq.Schedules(conn))
    text = generate_latest(metrics.registry).decode()
    assert "leaseq_operator_database_up 1.0" in text, text

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("leaseq_queue_jobs", queue=GOOD, state="ready") == 1
    assert value("leaseq_queue_jobs", queue=BAD, state="ready") == 2
    assert value("leaseq_queue_jobs", queue=BAD, state="running") == 1
    # An age from an infinite time is not reported: the ages stay finite numbers.
    for name in ("leaseq_queue_oldest_ready_age_seconds", "leaseq_queue_max_heartbeat_age_seconds"):
        got = value(name, queue=BAD)
        assert got is not None and got < 1e12, (name, got)
    assert value("leaseq_queue_claimable_jobs", queue=GOOD) == 1
    # Its three jobs wait for a signal since -infinity, infinity and a year past 9999: all
    # counted, and none adds an age (no number of seconds, or none yet).
    assert value("leaseq_queue_signal_waiting_jobs", queue=BAD) == 3
    assert value("leaseq_queue_oldest_signal_wait_age_seconds", queue=BAD) == 0
    assert value("leaseq_queue_signal_waiting_jobs", queue=GOOD) == 0
    assert value("leaseq_schedule_late_seconds") == 0


def test_the_scaling_read_skips_a_run_that_started_at_minus_infinity(
    queue: leaseq.Queue, planted: Planted
) -> None:
    work = {w.job_type: w for w in queue.work([BAD], window=3600)}
    assert work["extreme"].ready >= 1
    assert work["extreme"].mean_seconds is None  # the one sample had no number of seconds


def test_reading_a_job_and_its_attempts_answers(queue: leaseq.Queue, planted: Planted) -> None:
    late = queue.get(planted.pending["20000-01-01 00:00:00+00"])
    assert late.available_at == datetime.max.replace(tzinfo=UTC)
    early = queue.get(planted.pending["-infinity"])
    assert early.available_at == datetime.min.replace(tzinfo=UTC)
    running = queue.get(planted.running)
    assert running.lease_expires_at == datetime.max.replace(tzinfo=UTC)
    [attempt] = queue.attempts(planted.dead)
    assert attempt.ended_at == datetime.max.replace(tzinfo=UTC)
    records = queue.jobs(queue=BAD, limit=100)
    assert {r.id for r in records} >= {planted.dead, planted.running, planted.big}


def test_the_asyncio_producer_reads_rows_with_bad_times(
    database_url: str, planted: Planted
) -> None:
    async def read() -> list[leaseq.JobRecord]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            aq = AsyncQueue(c)
            return [await aq.get(planted.dead), await aq.get(planted.pending["-infinity"])]

    dead, early = asyncio.run(read())
    assert dead.finished_at == datetime.max.replace(tzinfo=UTC)
    assert early.available_at == datetime.min.replace(tzinfo=UTC)


def test_a_worker_claims_and_settles_rows_with_bad_times(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, planted: Planted
) -> None:
    """A claim of the job due at -infinity and of a rate-limited key whose bucket was last
    filled at -infinity (full), next to one filled at infinity (gains nothing), and settling
    a job that becomes due past 9999 (as a back-off of 10^12 seconds written before the
    bound did)."""
    flow = leaseq.FlowControl(conn)
    rated = {}
    for key, filled in (("rated-early", "-infinity"), ("rated-late", "infinity")):
        flow.set_limit(BAD, key, per_second=1.0)
        rated[key] = queue.enqueue(BAD, "extreme", key=key).job_id
        conn.execute(
            "UPDATE leaseq.flow_buckets SET tokens = 0, tokens_at = %s WHERE queue = %s"
            " AND key = %s",
            (filled, BAD, key),
        )
    got = queue.claim([BAD], "w1", limit=10)
    claimed = {j.id for j in got}
    assert planted.pending["-infinity"] in claimed
    assert rated["rated-early"] in claimed and rated["rated-late"] not in claimed
    for job in got:
        conn.execute(
            "UPDATE leaseq.jobs SET created_at = '-infinity', heartbeat_at = 'infinity'"
            " WHERE id = %s",
            (job.id,),
        )
    first, *rest = got
    queue.back_off(first.lease, 1e12)
    for job in rest:
        queue.fail(job.lease, "boom", retryable=True)
    queue.reap()
    assert queue.get(first.id).status == "pending"


def test_a_flood_of_queues_answers(
    database_url: str, conn: leaseq.core.db.Conn, planted: Planted,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    flood(conn, 200)
    db = ["--database-url", database_url]
    _, out = run(capsys, "status", "--json", *db)
    assert len(json.loads(out)["queues"]) >= 200
    _, out = run(capsys, "status", *db)
    assert "flood-200" in out and GOOD in out
    metrics = OperatorMetrics()
    metrics.watch_queues(leaseq.Queue(conn), leaseq.Workers(conn))
    assert "leaseq_operator_database_up 1.0" in generate_latest(metrics.registry).decode()


@pytest.mark.parametrize("value", EXTREMES)
def test_each_extreme_alone_keeps_status_answering(
    database_url: str, conn: leaseq.core.db.Conn, value: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    job_id = leaseq.Queue(conn).enqueue(BAD, "extreme").job_id
    conn.execute("UPDATE leaseq.jobs SET available_at = %s WHERE id = %s", (value, job_id))
    db = ["--database-url", database_url]
    run(capsys, "status", *db)
    _, out = run(capsys, "jobs", "show", str(job_id), *db)
    assert "infinity" in out


def test_a_huge_max_runtime_keeps_heartbeats_and_the_reaper_working(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """A running job whose max runtime is 100 million years (past the last timestamp when
    added to its start) next to an ordinary one: one worker's heartbeat of both renews both,
    and the reaper returns both once their leases expire."""
    for n in range(2):
        queue.enqueue(BAD, "extreme", {"n": n})
    huge, ordinary = queue.claim([BAD], "w1", limit=2)
    conn.execute(
        "UPDATE leaseq.jobs SET timeout = interval '100000000 years' WHERE id = %s",
        (huge.id,),
    )
    beats = queue.heartbeat_many([huge.lease, ordinary.lease])
    renewed = leaseq.HeartbeatStatus.RENEWED
    assert [b.status for b in beats] == [renewed, renewed], beats
    assert queue.heartbeat(huge.lease).status is renewed
    conn.execute(
        "UPDATE leaseq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = ANY(%s)",
        ([huge.id, ordinary.id],),
    )
    assert {r.job_id for r in queue.reap()} == {huge.id, ordinary.id}
