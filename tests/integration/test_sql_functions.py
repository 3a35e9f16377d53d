"""leaseq.enqueue(...) and leaseq.job_status(id), the SQL face for other languages (issue 22):
the same validation as the Python API, the same wake-up, and EXECUTE for the producer role
only. psql and a real worker process: tests/process/test_psql_producer.py."""

from __future__ import annotations

import math
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

import leaseq
from leaseq.core.errors import translate
from support.roles import Roles, login_roles

ENQUEUE = "SELECT id, created FROM leaseq.enqueue({})"


def sql_enqueue(conn: psycopg.Connection[Any], **args: Any) -> tuple[int, bool]:
    """Call leaseq.enqueue with named arguments, as another language's driver would."""
    names = ", ".join(f"{k} => %({k})s" for k in args)
    if "payload" in args:
        args["payload"] = psycopg.types.json.Jsonb(args["payload"])
    try:
        row = conn.execute(ENQUEUE.format(names), args).fetchone()
    except psycopg.Error as exc:
        conn.rollback()
        raise translate(exc, action="enqueue") from exc
    conn.commit()
    assert row is not None
    return int(row[0]), bool(row[1])


BAD = [
    {"queue": ""},
    {"queue": "q" * 129},
    {"queue": "a b"},
    {"job_type": " "},
    {"job_type": "t" * 129},
    {"payload": {"s": "x" * 1_048_576}},
    {"priority": 40000},
    {"delay": -1},
    {"max_attempts": 0},
    {"timeout": 0},
    {"timeout": -1},
    {"idempotency_key": ""},
    {"idempotency_key": "k" * 513},
    {"dedup_key": "k" * 513},
    {"dedup_key": ""},
    {"job_type": None},
    {"delay": math.nan},
    {"delay": math.inf},
    {"timeout": math.nan},
    {"timeout": math.inf},
    {"timeout": -math.inf},
]


@pytest.mark.parametrize("bad", BAD, ids=lambda b: "{}={!r:.12}".format(*next(iter(b.items()))))
def test_sql_and_python_reject_the_same_input_the_same_way(
    database_url: str, queue: leaseq.Queue, bad: dict[str, Any]
) -> None:
    args: dict[str, Any] = {"queue": "q", "job_type": "t", **bad}
    with pytest.raises(leaseq.InvalidJob) as python:
        queue.enqueue(args.pop("queue"), args.pop("job_type"), **args)
    with psycopg.connect(database_url) as c, pytest.raises(leaseq.InvalidJob) as sql:
        sql_enqueue(c, **{"queue": "q", "job_type": "t", **bad})
    assert (sql.value.field, sql.value.problem) == (python.value.field, python.value.problem)
    assert str(sql.value) == str(python.value)
    assert queue.stats() == [] or all(s.ready == 0 for s in queue.stats())


def test_enqueue_wakes_workers_and_job_status_reads_the_outcome(
    database_url: str, queue: leaseq.Queue
) -> None:
    with (
        psycopg.connect(database_url, autocommit=True) as listening,
        psycopg.connect(database_url) as c,
    ):
        listening.execute("LISTEN leaseq_jobs")
        job_id, created = sql_enqueue(
            c, queue="q", job_type="t", payload={"n": 1}, priority=3, dedup_key="d", wait=True
        )
        assert created
        notices = list(listening.notifies(timeout=30, stop_after=1))
        assert [n.payload for n in notices] == ["q"]
        assert sql_enqueue(c, queue="q", job_type="t", dedup_key="d") == (job_id, False)
        record = queue.get(job_id)
        assert (record.payload, record.priority, record.status) == ({"n": 1}, 3, "pending")
        (job,) = queue.claim(["q"], "w1")
        queue.complete(job.lease, {"text": "hi"})
        row = c.execute("SELECT * FROM leaseq.job_status(%s)", (job_id,)).fetchone()
        assert row == ("succeeded", {"text": "hi"}, None, None, 1)
        assert c.execute("SELECT * FROM leaseq.job_status(-1)").fetchall() == []


def test_only_the_producer_role_may_call_them(database_url: str) -> None:
    with login_roles(database_url) as roles:
        grant(database_url, roles)
        for component in ("worker", "operator"):
            with psycopg.connect(roles.urls[component]) as c:
                with pytest.raises(pg_errors.InsufficientPrivilege):
                    c.execute("SELECT leaseq.enqueue('q', 't')")
                c.rollback()
                with pytest.raises(pg_errors.InsufficientPrivilege):
                    c.execute("SELECT leaseq.job_status(1)")
        with psycopg.connect(roles.urls["producer"]) as c:
            job_id, _ = sql_enqueue(c, queue="q", job_type="t")
            assert c.execute("SELECT status FROM leaseq.job_status(%s)", (job_id,)).fetchone() == (
                "pending",
            )


def grant(database_url: str, roles: Roles) -> None:
    names = roles.names
    with leaseq.connect(database_url, action="migrate") as conn:
        leaseq.migrate(
            conn, leaseq.ComponentRoles(names["worker"], names["operator"], names["producer"])
        )


def test_enqueue_stores_the_callers_trace_context(database_url: str, queue: leaseq.Queue) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with psycopg.connect(database_url) as c:
        traced, _ = sql_enqueue(c, queue="q", job_type="t", traceparent=traceparent)
        both, _ = sql_enqueue(c, queue="q", job_type="t", traceparent=traceparent, tracestate="k=v")
        untraced, _ = sql_enqueue(c, queue="q", job_type="t")
    contexts = {job.id: job.trace_context for job in queue.claim(["q"], "w1", limit=3)}
    assert contexts == {
        traced: {"traceparent": traceparent},
        both: {"traceparent": traceparent, "tracestate": "k=v"},
        untraced: None,
    }


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ({"traceparent": "00-x"}, "must be a W3C traceparent"),
        ({"tracestate": "k=v"}, "needs a traceparent"),
        (
            {
                "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "tracestate": "k=v," * 200,
            },
            "the limit is 512",
        ),
    ],
)
def test_enqueue_refuses_a_bad_trace_context_naming_it(
    database_url: str, bad: dict[str, str], problem: str
) -> None:
    with psycopg.connect(database_url) as c, pytest.raises(leaseq.InvalidJob) as caught:
        sql_enqueue(c, queue="q", job_type="t", **bad)
    assert caught.value.field in bad
    assert problem in caught.value.problem
