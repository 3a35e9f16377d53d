"""The trace context a job carries (leaseq.jobs.trace_context), written at enqueue from the
active span by every producer path, with the API alone (no SDK: the no-op tracer carries the
incoming span's context through), returned by the claim, copied into a handler's fan-out; a
caller's own context wins, and the database bounds what a producer may store there."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from psycopg_pool import AsyncConnectionPool

import leaseq
from leaseq.aio import AsyncQueue
from leaseq.core import tracing
from leaseq.core.graph import Graph

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
#: What an enqueue inside that span stores (W3C traceparent: version, trace, span, sampled).
IN_SPAN = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
THEIRS = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "vendor=x",
}


@contextmanager
def in_span() -> Iterator[None]:
    """A span arriving from elsewhere (say an HTTP request's) current while the block runs."""
    context = SpanContext(TRACE_ID, SPAN_ID, is_remote=True, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context)):
        yield


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """leaseq's spans recorded by an SDK of this test's own (the process's global tracer
    provider is left alone: it can be set once)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("leaseq"))
    return exporter


def stored(database_url: str, job_id: int) -> Any:
    with psycopg.connect(database_url) as c:
        row = c.execute("SELECT trace_context FROM leaseq.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]


def test_every_synchronous_enqueue_stores_the_active_spans_context(
    queue: leaseq.Queue, database_url: str
) -> None:
    outside = queue.enqueue("q", "t").job_id
    with in_span():
        one = queue.enqueue("q", "t").job_id
        many = [e.job_id for e in queue.enqueue_many([leaseq.JobSpec("q", "t")] * 2)]
        after = queue.enqueue("q", "t", after=[one]).job_id
        graph = Graph("g")
        graph.add("q", "t", name="a")
        made = queue.enqueue_graph(graph)
    assert stored(database_url, outside) is None
    for job_id in [one, *many, after, made.job_ids["a"]]:
        assert stored(database_url, job_id) == IN_SPAN, job_id


def test_the_asyncio_producer_stores_the_active_spans_context(database_url: str) -> None:
    async def main() -> list[int]:
        async with AsyncConnectionPool(
            database_url, min_size=1, max_size=2, kwargs={"autocommit": True}
        ) as apool:
            queue = AsyncQueue(apool)
            with in_span():
                one = (await queue.enqueue("q", "t")).job_id
                graph = Graph("g")
                graph.add("q", "t", name="a")
                made = await queue.enqueue_graph(graph)
            return [one, made.job_ids["a"]]

    for job_id in asyncio.run(main()):
        assert stored(database_url, job_id) == IN_SPAN


def test_a_callers_context_wins_and_the_claim_returns_it(
    queue: leaseq.Queue, database_url: str
) -> None:
    with in_span():
        job_id = queue.enqueue("q", "t", trace_context=THEIRS).job_id
        after = queue.enqueue("q", "t", after=[job_id], trace_context=THEIRS).job_id
    assert stored(database_url, job_id) == stored(database_url, after) == THEIRS
    (job,) = queue.claim(["q"], "w1")
    assert (job.id, job.trace_context) == (job_id, THEIRS)


def test_a_handlers_fan_out_carries_its_spawners_context(
    queue: leaseq.Queue, database_url: str
) -> None:
    with in_span():
        split = queue.enqueue("q", "split").job_id
    spawned = Graph("fan-out")
    spawned.add("q", "page", name="p")
    (job,) = queue.claim(["q"], "w1")
    [done] = queue.complete_many([job.lease], spawns=[spawned])
    assert isinstance(done, leaseq.Completed)
    (page,) = queue.claim(["q"], "w1")
    assert page.id != split and page.trace_context == IN_SPAN


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"tracestate": "a=b"}, "'traceparent'"),
        ({**THEIRS, "baggage": "k=v"}, "not baggage"),
        ({"traceparent": "00-x"}, "must be a W3C traceparent"),
        ({**THEIRS, "tracestate": "k=v," * 200}, "the limit is 512"),
    ],
)
def test_a_bad_callers_context_is_refused_naming_it(
    queue: leaseq.Queue, value: dict[str, str], problem: str
) -> None:
    for after in ([], [queue.enqueue("q", "t").job_id]):
        with pytest.raises(leaseq.InvalidJob, match="trace_context") as caught:
            queue.enqueue("q", "t", trace_context=value, after=after)
        assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [('"00-x"', "got a JSON string"), ('{"traceparent": "%s"}' % ("0" * 1100), "limit is 1024")],
)
def test_the_database_bounds_a_producers_own_insert(
    database_url: str, value: str, problem: str
) -> None:
    with (
        psycopg.connect(database_url) as c,
        pytest.raises(psycopg.errors.InvalidParameterValue) as caught,
    ):
        c.execute(
            "INSERT INTO leaseq.jobs (queue, job_type, trace_context) VALUES ('q', 't', %s::jsonb)",
            (value,),
        )
    assert caught.value.diag.column_name == "trace_context"
    assert problem in str(caught.value)


def test_a_signal_sent_is_a_span_in_the_senders_trace(
    queue: leaseq.Queue, database_url: str, exported: InMemorySpanExporter
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    with in_span():
        queue.signal(job_id, "approve", {"by": "ann"})

    async def main() -> None:
        async with AsyncConnectionPool(
            database_url, min_size=1, max_size=1, kwargs={"autocommit": True}
        ) as apool:
            with in_span():
                await AsyncQueue(apool).signal(job_id, "veto")

    asyncio.run(main())
    signals = [s for s in exported.get_finished_spans() if s.name.startswith("signal ")]
    assert [s.name for s in signals] == ["signal approve", "signal veto"]
    for span in signals:
        assert span.parent is not None
        assert (span.context.trace_id, span.parent.span_id) == (TRACE_ID, SPAN_ID)
        assert span.attributes is not None and span.attributes["leaseq.job.id"] == job_id


def test_a_schedules_job_starts_a_trace_of_its_own(
    conn: leaseq.core.db.Conn, queue: leaseq.Queue, exported: InMemorySpanExporter
) -> None:
    schedules = leaseq.Schedules(conn)
    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    spec = leaseq.ScheduleSpec("nightly", "* * * * *", queue="q", job_type="t")
    schedules.add(spec, now=t0 - timedelta(seconds=1))
    with in_span():  # whatever the leader was doing is not the job's parent
        (fired,) = schedules.tick(now=t0).fired
    (span,) = [s for s in exported.get_finished_spans() if s.name == "schedule nightly"]
    assert span.parent is None and span.context.trace_id != TRACE_ID
    assert span.attributes is not None
    assert span.attributes["messaging.message.id"] == str(fired.job_id)
    (job,) = queue.claim(["q"], "w1")
    assert job.id == fired.job_id
    ids = f"{span.context.trace_id:032x}-{span.context.span_id:016x}"
    assert job.trace_context == {"traceparent": f"00-{ids}-{span.context.trace_flags:02x}"}
