"""A producer process for the tracing test: ``python tracing_producer.py JOB_TYPE...`` sets
up tracing from the OTEL_* variables as ``leaseq worker`` does, and enqueues one job of each
type (queue ``q``) inside a span named ``request``; prints the job ids, one a line."""

from __future__ import annotations

import os
import sys

from opentelemetry import trace

import leaseq
from leaseq.runtime import telemetry


def main(job_types: list[str]) -> None:
    stop = telemetry.configure()
    tracer = trace.get_tracer("tracing_producer")
    with (
        leaseq.connect(os.environ["LEASEQ_DATABASE_URL"], action="enqueue") as conn,
        tracer.start_as_current_span("request"),
    ):
        queue = leaseq.Queue(conn)
        for job_type in job_types:
            print(queue.enqueue("q", job_type, {}, max_attempts=2).job_id)
    stop()


if __name__ == "__main__":
    main(sys.argv[1:])
