"""OpenTelemetry spans and the trace context a job carries, through the API only.

leaseq emits through ``opentelemetry-api`` alone: without an SDK (no tracer provider set)
every span here is a non-recording one and nothing is stored or sent. Whoever sets a tracer
provider (``leaseq worker`` from the standard ``OTEL_*`` variables with the ``otel`` extra,
see :mod:`leaseq.runtime.telemetry`, or the application's own setup) gets:

- a producer span per enqueue (``send <queue>``), whose W3C trace context (``traceparent``,
  ``tracestate``) is stored with each job it writes (``jobs.trace_context``);
- a consumer span per attempt (``process <queue>``): the job's first run is a child of the
  stored context; any later run (a retry, a reclaim, a resume after a sleep or a signal)
  starts a trace of its own with a link to it, so a job that resumes tomorrow does not
  stretch today's trace;
- a consumer span per call of a batch handler, linked to each of its jobs' contexts;
- a span per durable step (``step <name>``), a child of its attempt, and events on the
  attempt's span for a sleep, a wait for a signal and a stream item;
- a span per signal sent (``signal <name>``), and a root span per schedule slot fired
  (``schedule <name>``), whose trace its job continues.

Names and attributes follow the OpenTelemetry semantic conventions for messaging
(``messaging.system``, ``messaging.operation.*``, ``messaging.destination.name``,
``messaging.message.id``); what they have no name for is under ``leaseq.``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace import Span as Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from leaseq.core.errors import InvalidJob

#: The value of ``messaging.system`` on every span (no registered name exists for leaseq).
SYSTEM = "leaseq"
#: The headers a job's trace context may hold (W3C Trace Context): a traceparent as the
#: standard's version 00 writes it, and a tracestate of at most its 512 characters (what
#: leaseq.enqueue() in SQL checks too; the database bounds the stored object at 1,024 bytes).
HEADERS = ("traceparent", "tracestate")
TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_TRACESTATE = 512

#: The claim that gives a job its first lease gives it token 1, or on a server that failed
#: over, its failover epoch ((timeline - 1) << 32, leaseq.lease_token_next): a token whose
#: low 32 bits are 0. Every later claim, sleep or release adds one.
_EPOCH_BITS = 32

_tracer = trace.get_tracer("leaseq")
# Only W3C trace context: the global propagator may add baggage, which would grow every row.
_propagator = TraceContextTextMapPropagator()

Carrier = dict[str, str]
#: A context carried into another thread or task (:func:`captured`, :func:`carried`).
Context = otel_context.Context


def current_carrier() -> Carrier | None:
    """The active span's trace context as W3C headers, or None when no span is active (or it
    is invalid: no SDK and no incoming context)."""
    carrier: Carrier = {}
    _propagator.inject(carrier)
    return carrier or None


def checked_carrier(field: str, value: Mapping[str, str] | None) -> Carrier | None:
    """A caller-supplied trace context: None, or a mapping of a W3C ``traceparent``
    (required) and a ``tracestate`` (optional, at most :data:`MAX_TRACESTATE` characters);
    InvalidJob naming ``field`` otherwise."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or "traceparent" not in value:
        raise InvalidJob(field, "must be a mapping with a 'traceparent' (W3C Trace Context)")
    unknown = sorted(set(value) - set(HEADERS))
    if unknown:
        raise InvalidJob(field, f"may hold only {', '.join(HEADERS)}, not {', '.join(unknown)}")
    if not all(isinstance(v, str) for v in value.values()):
        raise InvalidJob(field, "must map header names to strings")
    if not TRACEPARENT.fullmatch(value["traceparent"]):
        raise InvalidJob(
            field,
            "traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), got "
            f"{value['traceparent'][:64]!r}",
        )
    if len(value.get("tracestate", "")) > MAX_TRACESTATE:
        raise InvalidJob(
            field,
            f"tracestate is {len(value['tracestate'])} characters long; the limit is "
            f"{MAX_TRACESTATE}",
        )
    return dict(value)


def _messaging(operation: str, queue: str, kind: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": kind,
        "messaging.destination.name": queue,
    }


@contextlib.contextmanager
def enqueue_span(queues: list[str], count: int) -> Iterator[Span]:
    """The producer span of one enqueue call writing ``count`` jobs into ``queues``: active
    while the jobs are written, so :func:`current_carrier` names it."""
    queue = queues[0] if len(set(queues)) == 1 else ""
    attributes = _messaging("send", queue, "send")
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    name = f"send {queue}" if queue else "send"
    with _tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        yield span


def enqueued(span: Span, job_ids: list[int]) -> None:
    """Name the job an enqueue span wrote (``messaging.message.id``), when it wrote one."""
    if len(job_ids) == 1 and span.is_recording():
        span.set_attribute("messaging.message.id", str(job_ids[0]))


@contextlib.contextmanager
def schedule_span(name: str, slot: datetime) -> Iterator[Span]:
    """The producer span of one schedule slot's firing (``schedule <name>``): the root of
    the trace its job runs in (a schedule is nobody's request)."""
    attributes: dict[str, str] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "leaseq.schedule.name": name,
        "leaseq.schedule.slot": slot.isoformat(),
    }
    with _tracer.start_as_current_span(
        f"schedule {name}",
        context=otel_context.Context(),
        kind=SpanKind.PRODUCER,
        attributes=attributes,
    ) as span:
        yield span


def first_run(token: int) -> bool:
    """Whether the claim that gave a lease ``token`` was the job's first: then its attempt
    continues the enqueue's trace. (A resume claimed just after a failover has the epoch's
    token too, and is taken for a first run: it is then a child, not linked.)"""
    return token == 1 or (token > 1 and token % (1 << _EPOCH_BITS) == 0)


@contextlib.contextmanager
def attempt_span(
    queue: str,
    job_id: int,
    job_type: str,
    attempt: int,
    token: int,
    worker_id: str,
    carrier: Mapping[str, str] | None,
) -> Iterator[Span]:
    """The consumer span of one attempt, active while its handler runs: a child of the
    job's stored trace context on its first run, else the root of a new trace linked to it
    (and a root without a link when the job carries none)."""
    first = first_run(token)
    parent = _propagator.extract(carrier or {}) if first else otel_context.Context()
    links = [] if first else _links([carrier])
    attributes = _messaging("process", queue, "process")
    attributes.update(
        {
            "messaging.message.id": str(job_id),
            "leaseq.job.type": job_type,
            "leaseq.job.attempt": attempt,
            "leaseq.lease.token": token,
            "leaseq.worker.id": worker_id,
        }
    )
    with _tracer.start_as_current_span(
        f"process {queue}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def _links(carriers: list[Mapping[str, str] | None]) -> list[Link]:
    """Links to the stored trace contexts among ``carriers`` (an untraced job has none)."""
    links = []
    for carrier in carriers:
        stored = trace.get_current_span(_propagator.extract(carrier or {})).get_span_context()
        if stored.is_valid:
            links.append(Link(stored))
    return links


@contextlib.contextmanager
def batch_span(
    queue: str, job_type: str, worker_id: str, carriers: list[Mapping[str, str] | None]
) -> Iterator[Span]:
    """The consumer span of one call of a batch handler (several attempts at once): a root
    linked to each job's stored trace context, as the messaging conventions draw a batch."""
    links = _links(carriers)
    attributes = _messaging("process", queue, "process")
    attributes.update(
        {
            "messaging.batch.message_count": len(carriers),
            "leaseq.job.type": job_type,
            "leaseq.worker.id": worker_id,
        }
    )
    with _tracer.start_as_current_span(
        f"process {queue}",
        context=otel_context.Context(),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def attempt_ended(ending: str, error: BaseException | None, error_code: str) -> None:
    """Say on the active attempt span how its handler ended (``leaseq.attempt.ending``); an
    attempt that failed records its exception and an error status (``error.type``)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("leaseq.attempt.ending", ending)
    if error_code:
        span.set_attribute("error.type", error_code)
        if error is not None:
            span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{error_code}: {error}"))


@contextlib.contextmanager
def step_span(name: str, not_errors: tuple[type[BaseException], ...]) -> Iterator[Span]:
    """The span of one durable step, a child of the active (attempt) span. An exception
    leaving it (the step's function or check raised) is recorded as an error, but for one of
    ``not_errors`` (the attempt interrupted) and what is no Exception (a suspension)."""
    with _tracer.start_as_current_span(
        f"step {name}",
        attributes={"leaseq.step.name": name},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except Exception as exc:
            if span.is_recording() and not isinstance(exc, not_errors):
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def step_replayed(span: Span) -> None:
    """Say on a step's span that its result was recorded by an earlier attempt: it did not
    run."""
    if span.is_recording():
        span.set_attribute("leaseq.step.replayed", True)


def event(name: str, attributes: Mapping[str, str | int]) -> None:
    """An event ``name`` on the active span (an attempt's: a sleep, a wait, a stream item)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, dict(attributes))


@contextlib.contextmanager
def signal_span(job_id: int, name: str) -> Iterator[Span]:
    """The span of one signal sent to a job (``signal <name>``), a child of the active span."""
    attributes: dict[str, str | int] = {
        "messaging.system": SYSTEM,
        "leaseq.job.id": job_id,
        "leaseq.signal.name": name,
    }
    with _tracer.start_as_current_span(f"signal {name}", attributes=attributes) as span:
        yield span


def log_fields() -> dict[str, str]:
    """The active span's ``trace_id`` and ``span_id`` (hex, as trace viewers show them), for a
    log line; empty when no valid span is active."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def captured() -> Context:
    """The current context, to carry into another thread or task (:func:`carried`)."""
    return otel_context.get_current()


@contextlib.contextmanager
def carried(context: Context) -> Iterator[None]:
    """``context`` (from :func:`captured`) current while the block runs: an async handler's
    coroutine runs on the handler loop's thread, under its attempt's span."""
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)
