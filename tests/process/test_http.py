"""The worker's HTTP port: every documented metric series, and the probes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

OUTCOMES = ("succeeded", "failed", "dead", "timed_out", "released", "lease_lost", "fenced")
# Everything tests/process/apps.py registers.
JOB_TYPES = (
    "broken", "die", "embed", "embed_fill", "gated", "hold_gil", "late_checkpoint", "runaway",
    "silent", "steps", "work",
)  # fmt: skip


def documented_series(queue: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """The worker's series (see leaseq.runtime.metrics), as they must appear before any job ran."""
    q = (("queue", queue),)
    series = {
        ("leaseq_claim_latency_seconds_count", ()),
        ("leaseq_last_heartbeat_timestamp_seconds", ()),
        ("leaseq_worker_draining", ()),
        ("leaseq_worker_loading", ()),
        ("leaseq_worker_startup_seconds", ()),
        ("leaseq_child_processes_started_total", ()),
        ("leaseq_jobs_in_flight", q),
        ("leaseq_lease_renewals_total", q),
        ("leaseq_lease_losses_total", q),
        ("leaseq_fenced_calls_total", q),
    }
    for job_type in JOB_TYPES:
        qt = (("job_type", job_type), ("queue", queue))
        series.add(("leaseq_jobs_claimed_total", qt))
        series.add(("leaseq_job_duration_seconds_count", qt))
        series.add(("leaseq_effects_not_written_total", qt))
        for outcome in OUTCOMES:
            labels = (("job_type", job_type), ("outcome", outcome), ("queue", queue))
            series.add(("leaseq_jobs_finished_total", labels))
    return series


def test_metrics_expose_every_documented_series_and_probes_answer(
    queue: leaseq.Queue, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    a = spawn_worker("w-a")
    samples = a.metrics()
    missing = documented_series("q") - set(samples)
    assert not missing
    assert samples[("leaseq_worker_draining", ())] == 0
    assert a.get("/healthz") == (200, "ok\n")
    wait_for(lambda: a.get("/readyz") == (200, "ok\n"), "readiness")

    job_id = queue.enqueue("q", "work", {"seconds": 0.5}).job_id
    wait_for(lambda: queue.get(job_id).status == "succeeded", "the job")
    qt = {"queue": "q", "job_type": "work"}
    wait_for(
        lambda: a.metric("leaseq_jobs_finished_total", **qt, outcome="succeeded") == 1, "outcome"
    )
    samples = a.metrics()
    assert samples[("leaseq_jobs_claimed_total", (("job_type", "work"), ("queue", "q")))] == 1
    assert (
        samples[("leaseq_job_duration_seconds_count", (("job_type", "work"), ("queue", "q")))] == 1
    )
    assert samples[("leaseq_claim_latency_seconds_count", ())] >= 1
    assert samples[("leaseq_lease_renewals_total", (("queue", "q"),))] >= 1
    assert samples[("leaseq_last_heartbeat_timestamp_seconds", ())] > 0
    assert samples[("leaseq_jobs_in_flight", (("queue", "q"),))] == 0
    assert a.get("/nope")[0] == 404
