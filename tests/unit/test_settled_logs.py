"""What a worker logs when attempts settle: a success per job only at DEBUG (not even
formatted otherwise), other outcomes per job at INFO or WARNING, and one INFO summary line
per interval with the counts per queue and outcome."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime

import pytest

from leaseq.core.models import Call, ClaimedJob, Completed, Failed, JobStatus, Lease, Released
from leaseq.runtime.context import JobContext
from leaseq.runtime.health import Health
from leaseq.runtime.inflight import InFlight
from leaseq.runtime.logs import JsonFormatter
from leaseq.runtime.metrics import WorkerMetrics
from leaseq.runtime.outcomes import Settler
from leaseq.runtime.settlement import Answer, Settlement, Tally


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def attempt(job_id: int, queue: str) -> InFlight:
    now = datetime.now(UTC)
    job = ClaimedJob(
        job_id, queue, "unit", None, 100, 1, 5, Lease(job_id, "w-1", 3, 1, now, b""), now, None,
        None, None,
    )  # fmt: skip
    ctx = JobContext(job, None, "w-1", threading.Event())  # type: ignore[arg-type]
    return InFlight.start(
        job, None, ctx, sent_at=0, received_at=0, lease_seconds=30, heartbeat_seconds=10
    )


def settlement(clock: Clock) -> Settlement:
    s = Settlement(
        None,  # type: ignore[arg-type]  # no call is retried here
        metrics=WorkerMetrics(["a", "b"], ["unit"]),
        health=Health(),
        stopping=threading.Event(),
    )
    s.tally = Tally(s.metrics.finished, 60.0, clock)
    return s


def settle(s: Settlement, attempt: InFlight, call: Call, answer: Answer) -> None:
    assert attempt.take(Settler.HANDLER)
    s.settle_taken(attempt, call, lambda: answer)


def worker_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "leaseq.worker"]


def test_successes_log_no_line_per_job_and_one_summary_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="leaseq.worker")
    clock = Clock()
    s = settlement(clock)
    for job_id, queue in [(1, "a"), (2, "a"), (3, "a"), (4, "b")]:
        job = attempt(job_id, queue)
        settle(s, job, Call.COMPLETE, Completed(job_id, None, False))
    retried, dead = attempt(5, "a"), attempt(6, "a")
    settle(s, retried, Call.FAIL, Failed(5, JobStatus.PENDING, datetime.now(UTC)))
    settle(s, dead, Call.FAIL, Failed(6, JobStatus.DEAD, None))
    settle(s, attempt(7, "b"), Call.RELEASE, Released(7))
    # Per job: only what is not a success, with the job's fields.
    assert worker_lines(caplog) == [
        (logging.INFO, "attempt settled: failed"),
        (logging.WARNING, "attempt settled: dead"),
        (logging.INFO, "attempt settled: released"),
    ]
    dead_line = caplog.records[1]
    assert (dead_line.job_id, dead_line.queue, dead_line.worker) == (6, "a", "w-1")  # type: ignore[attr-defined]
    assert (dead_line.attempt, dead_line.token) == (1, 3)  # type: ignore[attr-defined]
    caplog.clear()

    clock.now += 59.0
    s.tally.summary({"worker": "w-1"})
    assert worker_lines(caplog) == []  # not due yet
    clock.now += 1.0
    s.tally.summary({"worker": "w-1"})
    assert worker_lines(caplog) == [
        (
            logging.INFO,
            "attempts settled in the last 60s: a: 3 succeeded, 1 failed, 1 dead; "
            "b: 1 succeeded, 1 released",
        )
    ]
    [line] = caplog.records
    assert line.counts == {  # type: ignore[attr-defined]
        "a": {"succeeded": 3, "failed": 1, "dead": 1},
        "b": {"succeeded": 1, "released": 1},
    }
    logged = json.loads(JsonFormatter().format(line))
    assert logged["counts"]["a"]["succeeded"] == 3
    assert (logged["worker"], logged["seconds"]) == ("w-1", 60.0)
    caplog.clear()

    clock.now += 120.0
    s.tally.summary({"worker": "w-1"})
    assert worker_lines(caplog) == []  # quiet when nothing settled
    job = attempt(8, "b")
    settle(s, job, Call.COMPLETE, Completed(8, None, False))
    clock.now += 5.0
    s.tally.summary({"worker": "w-1"}, force=True)  # at exit: whatever is left, at once
    assert worker_lines(caplog) == [
        (logging.INFO, "attempts settled in the last 5s: b: 1 succeeded")
    ]


def test_a_success_formats_nothing_unless_debug_is_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = InFlight.fields

    def counted(self: InFlight) -> dict[str, object]:
        calls.append(self.job.id)
        return real(self)

    monkeypatch.setattr(InFlight, "fields", counted)
    s = settlement(Clock())
    caplog.set_level(logging.INFO, logger="leaseq.worker")
    settle(s, attempt(1, "a"), Call.COMPLETE, Completed(1, None, False))
    assert calls == []
    assert worker_lines(caplog) == []
    caplog.set_level(logging.DEBUG, logger="leaseq.worker")
    settle(s, attempt(2, "a"), Call.COMPLETE, Completed(2, None, False))
    assert calls == [2]
    assert worker_lines(caplog) == [(logging.DEBUG, "attempt settled: succeeded")]
