"""leaseq.core.tracing's first-run rule and leaseq.runtime.telemetry's reading of OTEL_*."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from leaseq.core.errors import ConfigError
from leaseq.core.tracing import first_run
from leaseq.runtime import telemetry

EPOCH = 1 << 32  # a server's failover epoch after one promotion (leaseq.lease_epoch)


@pytest.mark.parametrize(
    ("token", "first"),
    [
        (1, True),  # the first claim on a server that never failed over
        (2, False),  # a retry, a reclaim, or a resume after a sleep (each adds one)
        (EPOCH, True),  # the first claim after a failover: the epoch itself
        (EPOCH + 1, False),
        (3 * EPOCH, True),
        (3 * EPOCH + 7, False),
    ],
)
def test_only_a_jobs_first_claim_continues_its_enqueues_trace(token: int, first: bool) -> None:
    assert first_run(token) is first


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"},
    ],
)
def test_tracing_is_off_unless_an_exporter_is_named(environ: dict[str, str]) -> None:
    before = trace.get_tracer_provider()
    telemetry.configure(environ)()
    assert trace.get_tracer_provider() is before


def test_an_unknown_exporter_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER names zipkin"):
        telemetry.configure({"OTEL_TRACES_EXPORTER": "otlp,zipkin"})
