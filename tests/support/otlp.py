"""An OTLP/HTTP trace receiver on loopback for tests: it decodes what a real exporter posts
to ``/v1/traces`` (protobuf ExportTraceServiceRequest) into :class:`Span` records."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from opentelemetry.proto.trace.v1.trace_pb2 import Status


@dataclass(frozen=True)
class Span:
    """One received span; ids in hex as trace viewers show them ('' for no parent)."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]]
    error: bool
    events: list[str]


def _value(value: AnyValue) -> Any:
    field = value.WhichOneof("value")
    return getattr(value, field) if field else None


def _spans(request: ExportTraceServiceRequest) -> Iterator[Span]:
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                yield Span(
                    service=str(resource.get("service.name", "")),
                    name=s.name,
                    kind=SpanProto.SpanKind.Name(s.kind),
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex(),
                    attributes={a.key: _value(a.value) for a in s.attributes},
                    links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                    error=s.status.code == Status.STATUS_CODE_ERROR,
                    events=[e.name for e in s.events],
                )


class Receiver:
    """The spans received so far (:attr:`spans`), and the endpoint to export them to."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        self._lock = threading.Lock()
        self._spans: list[Span] = []

    def add(self, spans: list[Span]) -> None:
        with self._lock:
            self._spans.extend(spans)

    @property
    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)


@contextmanager
def receiver() -> Iterator[Receiver]:
    """A receiver serving on a free loopback port while the block runs."""
    box: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            box[0].add(list(_spans(request)))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the test says what it missed

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box.append(Receiver(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield box[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
