"""Setting up the OpenTelemetry SDK for a leaseq process from the standard ``OTEL_*`` variables.

Off by default: without ``OTEL_TRACES_EXPORTER`` (or with ``none``, or ``OTEL_SDK_DISABLED``
true) nothing is set up and leaseq's spans (:mod:`leaseq.core.tracing`) are the API's no-ops.
A process that already has a tracer provider (``opentelemetry-instrument``, or the app's
own setup) keeps it. Otherwise a tracer provider is set with the SDK's own reading of the
environment (``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` for the resource,
``OTEL_TRACES_SAMPLER`` for sampling, ``OTEL_BSP_*`` for batching, ``OTEL_EXPORTER_OTLP_*``
for the exporter), exporting to each exporter ``OTEL_TRACES_EXPORTER`` names: ``otlp``
(OTLP over HTTP/protobuf) or ``console``. The SDK and exporter come with the ``otel`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from opentelemetry import trace

from leaseq.core.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

#: The exporters ``OTEL_TRACES_EXPORTER`` may name here.
EXPORTERS = ("otlp", "console")


def _nothing() -> None:
    return None


def configure(environ: Mapping[str, str] = os.environ) -> Callable[[], None]:
    """Set the process's tracer provider as ``environ`` asks (module docstring); returns what
    flushes and stops it at exit (nothing to do when none was set). ConfigError names an
    exporter it does not know, or the extra to install when the SDK is missing."""
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    if disabled or not names or names == ["none"]:
        return _nothing
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return _nothing
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}; leaseq sets up "
            f"{', '.join(EXPORTERS)} or none (or run it under opentelemetry-instrument)"
        )
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={','.join(names)} needs the OpenTelemetry SDK: "
            f"pip install 'leaseq[otel]' ({exc})"
        ) from exc
    provider = TracerProvider(resource=Resource.create())
    for name in names:
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(_otlp()))
    trace.set_tracer_provider(provider)
    return provider.shutdown


def _otlp() -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter: pip install 'leaseq[otel]' ({exc})"
        ) from exc
    return OTLPSpanExporter()
