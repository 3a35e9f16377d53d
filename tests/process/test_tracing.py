"""OpenTelemetry end to end: a producer process enqueues inside a span of its own, a real
``leaseq worker`` runs the jobs, and both export over OTLP/HTTP (the real exporter) to a
receiver this test runs on loopback. The first attempt continues the producer's trace (the
producer's span, the enqueue, the attempt, its steps, in that parent/child order); a retry is
a trace of its own linked to the enqueue; a job enqueued from SQL with a traceparent
continues it; the worker's JSON log lines name the trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

import leaseq
from support import otlp
from support.jobs import finished
from support.polling import wait_for
from support.workers import WorkerProcess

HERE = Path(__file__).parent
SQL_TRACE, SQL_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
SQL_TRACEPARENT = f"00-{SQL_TRACE}-{SQL_SPAN}-01"
Spawn = Callable[..., WorkerProcess]


@pytest.fixture
def receiver() -> Iterator[otlp.Receiver]:
    with otlp.receiver() as r:
        yield r


def _otel_env(receiver: otlp.Receiver, service: str) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": service,
        # Export within 0.1 s of a span's end, not the default 5 s.
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def _produce(database_url: str, receiver: otlp.Receiver, *job_types: str) -> list[int]:
    """Run the producer process (tracing_producer.py); the ids of the jobs it enqueued."""
    done = subprocess.run(
        [sys.executable, str(HERE / "tracing_producer.py"), *job_types],
        env={
            **os.environ,
            **_otel_env(receiver, "producer"),
            "LEASEQ_DATABASE_URL": database_url,
            "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH", "")])),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [int(line) for line in done.stdout.split()]


def _one(spans: list[otlp.Span], name: str, job_id: int | None = None) -> otlp.Span:
    found = _all(spans, name, job_id)
    assert len(found) == 1, (name, job_id, spans)
    return found[0]


def _all(spans: list[otlp.Span], name: str, job_id: int | None = None) -> list[otlp.Span]:
    """The spans named ``name`` (of job ``job_id``, when given)."""
    return [
        s
        for s in spans
        if s.name == name
        and (job_id is None or s.attributes.get("messaging.message.id") == str(job_id))
    ]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_job_continues_its_producers_trace_and_a_retry_links_to_it(
    queue: leaseq.Queue,
    database_url: str,
    spawn_worker: Spawn,
    receiver: otlp.Receiver,
    isolation: str,
) -> None:
    worker = spawn_worker(
        "w",
        app="tracing_app:registry",
        isolation=isolation,
        env={**_otel_env(receiver, "worker"), "LEASEQ_LOG_FORMAT": "json"},
    )
    steps_job, flaky_job, sleepy_job, waiter_job, *batch_jobs = _produce(
        database_url, receiver, "two_steps", "flaky", "sleepy", "waiter", *["batched"] * 3
    )
    # A producer in another language passes its own trace context to leaseq.enqueue().
    with psycopg.connect(database_url, autocommit=True) as c:
        row = c.execute(
            "SELECT id FROM leaseq.enqueue('q', 'noop', traceparent => %s, tracestate => 'k=v')",
            (SQL_TRACEPARENT,),
        ).fetchone()
    assert row is not None
    sql_job = int(row[0])
    assert finished(queue, sql_job).status == "succeeded"
    assert finished(queue, steps_job).status == "succeeded"
    assert finished(queue, flaky_job).status == "succeeded"
    assert finished(queue, sleepy_job).status == "succeeded"
    wait_for(lambda: queue.waiting_on(waiter_job), "the waiter to wait for its signal")
    queue.signal(waiter_job, "go", "now")
    assert finished(queue, waiter_job).status == "succeeded"
    for job_id in batch_jobs:
        assert finished(queue, job_id).status == "succeeded"

    def exported() -> list[otlp.Span]:
        spans = receiver.spans
        # two_steps, noop: one run each; flaky, sleepy, waiter: two each.
        assert len(_all(spans, "process q")) == 9, spans
        assert len(_all(spans, "step save")) == 1, spans
        return spans

    spans = wait_for(exported, "the producer's and the worker's spans", timeout=30)

    # One trace: request -> send q (the enqueue) -> process q (attempt 1) -> its steps.
    request = _one(spans, "request")
    assert request.service == "producer"
    send = _one(spans, "send q", steps_job)
    assert (send.trace_id, send.parent_id, send.kind) == (
        request.trace_id,
        request.span_id,
        "SPAN_KIND_PRODUCER",
    )
    assert send.attributes["messaging.system"] == "leaseq"
    assert send.attributes["messaging.destination.name"] == "q"
    attempt = _one(spans, "process q", steps_job)
    assert (attempt.service, attempt.kind) == ("worker", "SPAN_KIND_CONSUMER")
    assert (attempt.trace_id, attempt.parent_id) == (request.trace_id, send.span_id)
    assert attempt.attributes["leaseq.job.type"] == "two_steps"
    assert attempt.attributes["leaseq.job.attempt"] == 1
    assert attempt.attributes["leaseq.worker.id"] == "w"
    assert attempt.links == []
    for name in ("step fetch", "step save"):
        step = _one(spans, name)
        assert (step.trace_id, step.parent_id) == (request.trace_id, attempt.span_id)

    # The flaky job: its first attempt in the producer's trace, failed; its retry a new
    # trace, linked to the enqueue's span.
    flaky_send = _one(spans, "send q", flaky_job)
    assert flaky_send.parent_id == request.span_id
    first, retry = sorted(
        _all(spans, "process q", flaky_job), key=lambda s: s.attributes["leaseq.job.attempt"]
    )
    assert (first.trace_id, first.parent_id) == (request.trace_id, flaky_send.span_id)
    assert first.error and "exception" in first.events
    assert first.attributes["error.type"] == "RuntimeError"
    assert retry.trace_id != request.trace_id and retry.parent_id == ""
    assert retry.links == [(flaky_send.trace_id, flaky_send.span_id)]
    assert not retry.error

    # A resume after a sleep, and after a signal: new traces, linked to the enqueue. The
    # first run's span says why it ended (and what it streamed).
    for job_id, ending, events in [
        (sleepy_job, "slept", ["leaseq.stream.item", "leaseq.sleep"]),
        (waiter_job, "waiting", ["leaseq.wait"]),
    ]:
        job_send = _one(spans, "send q", job_id)
        first, resumed = sorted(
            _all(spans, "process q", job_id), key=lambda s: s.attributes["leaseq.lease.token"]
        )
        assert (first.trace_id, first.parent_id) == (request.trace_id, job_send.span_id)
        assert first.attributes["leaseq.attempt.ending"] == ending
        assert first.events == events and not first.error
        assert resumed.trace_id != request.trace_id and resumed.parent_id == ""
        assert resumed.links == [(job_send.trace_id, job_send.span_id)]
        assert resumed.attributes["leaseq.attempt.ending"] == "returned"

    # One call of the batch handler for its three jobs: a root linked to each enqueue.
    (batch,) = [s for s in _all(spans, "process q") if s.attributes["leaseq.job.type"] == "batched"]
    assert batch.attributes["messaging.batch.message_count"] == 3 and batch.parent_id == ""
    assert sorted(batch.links) == sorted(
        (s.trace_id, s.span_id) for job_id in batch_jobs for s in [_one(spans, "send q", job_id)]
    )

    from_sql = _one(spans, "process q", sql_job)
    assert (from_sql.trace_id, from_sql.parent_id) == (SQL_TRACE, SQL_SPAN)

    # The handler's log line names its trace and the step's span.
    log = worker.log.read_text().splitlines()
    lines = [json.loads(line) for line in log if line.startswith("{")]
    saving = next(line for line in lines if line["msg"] == "saving 3 pages")
    save = _one(spans, "step save")
    assert (saving["trace_id"], saving["span_id"]) == (save.trace_id, save.span_id)


def test_the_console_exporter_prints_the_workers_spans(
    queue: leaseq.Queue, spawn_worker: Spawn
) -> None:
    worker = spawn_worker(
        "w",
        app="tracing_app:registry",
        env={"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "100"},
    )
    job_id = queue.enqueue("q", "two_steps", {}).job_id
    assert finished(queue, job_id).status == "succeeded"
    wait_for(
        lambda: all(
            f'"name": "{name}"' in worker.log.read_text()
            for name in ("process q", "step fetch", "step save")
        ),
        "the worker to print its spans",
    )
