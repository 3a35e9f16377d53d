"""The worker runtime in this process (threads, real PostgreSQL, real time), for behaviour
that needs a precise interleaving no signal can give: a completion racing a cancel, stop
reasons, checkpoints, concurrency, start-up."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import leaseq
from leaseq.runtime.context import Interrupted, JobContext, PermanentError, StopReason
from leaseq.runtime.registry import Registry
from leaseq.runtime.settings import WorkerSettings
from leaseq.runtime.shutdown import SignalWatch
from leaseq.runtime.worker import Worker
from support.polling import wait_for

pytestmark = pytest.mark.process

FAST_RETRY = leaseq.RetryPolicy(base_seconds=0.1, cap_seconds=0.2)


@dataclass
class Running:
    worker: Worker
    signals: SignalWatch
    thread: threading.Thread
    exit: list[int] = field(default_factory=list)

    def sample(self, name: str, **labels: str) -> float:
        value = self.worker.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def stop(self) -> int:
        self.signals.trigger()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        return self.exit[0]


@pytest.fixture
def start_worker(database_url: str) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(registry: Registry, url: str = database_url, **overrides: Any) -> Running:
        options: dict[str, Any] = {
            "database_url": url,
            "app": "test",
            "queues": ("q",),
            "lease_seconds": 30.0,
            "heartbeat_seconds": 10.0,
            "poll_seconds": 0.2,
            "drain_seconds": 10.0,
            "worker_id": "w-in",
            "metrics_port": 0,
            **overrides,
        }
        worker = Worker(WorkerSettings(**options), registry, retry=FAST_RETRY)
        signals = SignalWatch()
        running = Running(worker, signals, threading.Thread(target=lambda: None))
        running.thread = threading.Thread(
            target=lambda: running.exit.append(worker.run(signals)), daemon=True
        )
        running.thread.start()
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.signals.trigger()
            running.signals.trigger()
            running.thread.join(timeout=30)


def test_a_completion_after_cancel_is_refused_and_counted_as_cancelled(
    queue: leaseq.Queue, start_worker: Callable[..., Running]
) -> None:
    go = threading.Event()
    registry = Registry()

    @registry.job("hold")
    def hold(payload: Any, ctx: JobContext) -> str:
        go.wait(30)
        return "late"

    w = start_worker(registry)  # renewals every 10 s: nothing notices the cancel first
    job_id = queue.enqueue("q", "hold", idempotency_key="k-cancel").job_id
    wait_for(lambda: queue.get(job_id).status == "running", "the job to start")
    assert queue.cancel(job_id).cancelled
    go.set()

    labels = {"queue": "q", "job_type": "hold"}
    wait_for(
        lambda: w.sample("leaseq_jobs_finished_total", **labels, outcome="cancelled") == 1,
        "the refused complete",
    )
    # A cancellation reaching its worker is no fault: not fenced, not a lost lease.
    assert w.sample("leaseq_jobs_finished_total", **labels, outcome="fenced") == 0
    assert w.sample("leaseq_fenced_calls_total", queue="q") == 0
    assert queue.get(job_id).status == "cancelled"
    assert queue.effect("k-cancel") is None
    assert [a.outcome for a in queue.attempts(job_id)] == ["cancelled"]
    assert w.stop() == 0


def test_a_cancelled_job_stops_its_handler_with_the_reason(
    queue: leaseq.Queue, start_worker: Callable[..., Running]
) -> None:
    reasons: list[StopReason | None] = []
    registry = Registry()

    @registry.job("wait")
    def wait(payload: Any, ctx: JobContext) -> None:
        ctx.wait(30)
        reasons.append(ctx.stop_reason)
        return None

    w = start_worker(registry, lease_seconds=2.0, heartbeat_seconds=0.2)
    job_id = queue.enqueue("q", "wait").job_id
    wait_for(lambda: queue.get(job_id).status == "running", "the job to start")
    queue.cancel(job_id)

    wait_for(lambda: reasons == [StopReason.CANCELLED], "the handler to see the cancel")
    labels = {"queue": "q", "job_type": "wait"}
    assert w.sample("leaseq_jobs_finished_total", **labels, outcome="cancelled") == 1
    assert w.sample("leaseq_jobs_finished_total", **labels, outcome="lease_lost") == 0
    assert w.sample("leaseq_lease_losses_total", queue="q") == 0
    assert w.sample("leaseq_fenced_calls_total", queue="q") == 0
    assert w.sample("leaseq_jobs_finished_total", **labels, outcome="fenced") == 0
    assert queue.get(job_id).status == "cancelled"
    [attempt] = queue.attempts(job_id)
    assert attempt.outcome == "cancelled"


def test_progress_is_stored_and_a_checkpoint_reaches_the_next_attempt(
    queue: leaseq.Queue, start_worker: Callable[..., Running]
) -> None:
    seen = threading.Event()
    registry = Registry()

    @registry.job("resume")
    def resume(payload: Any, ctx: JobContext) -> Any:
        if ctx.attempt == 1:
            ctx.progress({"pct": 50})
            assert ctx.checkpoint({"step": 3})
            seen.wait(30)
            raise RuntimeError("crash after the checkpoint")
        return {"resumed": ctx.last_checkpoint}

    start_worker(registry, lease_seconds=2.0, heartbeat_seconds=0.2)
    job_id = queue.enqueue("q", "resume").job_id
    wait_for(lambda: queue.get(job_id).progress == {"pct": 50}, "progress stored by a renewal")
    seen.set()

    job = wait_for(lambda: (j := queue.get(job_id)).status == "succeeded" and j, "attempt 2")
    assert job.result == {"resumed": {"step": 3}}
    assert job.attempt_count == 2
    assert [a.outcome for a in queue.attempts(job_id)] == ["failed", "succeeded"]


def test_handler_errors_and_bad_results_while_an_unknown_type_waits(
    queue: leaseq.Queue, start_worker: Callable[..., Running]
) -> None:
    registry = Registry()

    @registry.job("permanent")
    def permanent(payload: Any, ctx: JobContext) -> None:
        raise PermanentError("bad input")

    @registry.job("unusable")
    def unusable(payload: Any, ctx: JobContext) -> object:
        return object()

    w = start_worker(registry, concurrency=3)
    ids = {
        "permanent": queue.enqueue("q", "permanent", max_attempts=5).job_id,
        "unusable": queue.enqueue("q", "unusable", max_attempts=5).job_id,
        "missing": queue.enqueue("q", "missing", max_attempts=1).job_id,
    }
    for job_id in (ids["permanent"], ids["unusable"]):
        wait_for(lambda j=job_id: queue.get(j).status == "dead", f"job {job_id} to die")

    assert queue.get(ids["permanent"]).attempt_count == 1
    assert queue.get(ids["permanent"]).last_error == "PermanentError: bad input"
    assert queue.get(ids["unusable"]).attempt_count == 1
    assert "unusable result" in (queue.get(ids["unusable"]).last_error or "")
    # A type this worker has no handler for is not claimed: no attempt spent.
    missing = queue.get(ids["missing"])
    assert (missing.status, missing.attempt_count) == ("pending", 0)
    labels = {"queue": "q", "job_type": "permanent", "outcome": "dead"}
    assert w.sample("leaseq_jobs_finished_total", **labels) == 1


def test_failures_a_registry_or_job_type_marks_permanent_make_one_attempt(
    queue: leaseq.Queue, start_worker: Callable[..., Running]
) -> None:
    registry = Registry(permanent=(ValueError,))

    @registry.job("bad-value")
    def bad_value(payload: Any, ctx: JobContext) -> None:
        raise ValueError("schema version 7 is not supported")

    @registry.job("bad-key", permanent=(KeyError,))
    def bad_key(payload: Any, ctx: JobContext) -> None:
        raise KeyError("tenant")

    @registry.job("flaky")
    def flaky(payload: Any, ctx: JobContext) -> None:
        raise KeyError("not permanent for this type")

    @registry.job("split")
    def split(payload: Any, ctx: JobContext) -> None:
        ctx.spawn("children", "page")
        ctx.spawn("children", "page", max_attempts=0)  # leaseq refuses it: InvalidJob

    w = start_worker(registry, concurrency=4)
    ids = {
        name: queue.enqueue("q", name, max_attempts=3).job_id
        for name in ("bad-value", "bad-key", "flaky", "split")
    }
    for job_id in ids.values():
        wait_for(lambda j=job_id: queue.get(j).status == "dead", f"job {job_id} to die")

    for name in ("bad-value", "bad-key", "split"):
        attempts = queue.attempts(ids[name])
        assert [a.outcome for a in attempts] == ["failed"], name
        assert "Traceback" in (attempts[0].traceback or ""), name
    assert queue.get(ids["bad-value"]).last_error_code == "ValueError"
    assert "InvalidJob: invalid max_attempts" in (queue.attempts(ids["split"])[0].traceback or "")
    assert queue.get(ids["flaky"]).attempt_count == 3
    # The split died before completing: none of its fan-out was written.
    assert queue.jobs(queue="children") == []
    labels = {"queue": "q", "job_type": "bad-value", "outcome": "dead"}
    assert w.sample("leaseq_jobs_finished_total", **labels) == 1


def test_a_permanent_list_names_exception_classes_that_fail_a_job() -> None:
    with pytest.raises(leaseq.ConfigError, match="exception classes"):
        Registry(permanent=("ValueError",))  # type: ignore[arg-type]
    with pytest.raises(leaseq.ConfigError, match="hands a job back"):
        Registry().job("x", permanent=(leaseq.BackOff,))


def test_a_sleeping_job_holds_no_slot_nor_unit_and_resumes_after_its_steps(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, start_worker: Callable[..., Running]
) -> None:
    registry = Registry()
    calls: list[str] = []

    @registry.job("nap")
    def nap(payload: Any, ctx: JobContext) -> str:
        draft = ctx.step("draft", lambda: calls.append("draft") or "drafted")
        ctx.sleep(30)
        return f"{draft} then woke"

    @registry.job("quick")
    def quick(payload: Any, ctx: JobContext) -> str:
        return "done"

    leaseq.FlowControl(conn).set_limit("q", "tenant", max_running=1)
    start_worker(registry, concurrency=1)
    a = queue.enqueue("q", "nap", key="tenant").job_id
    wait_for(lambda: [x.outcome for x in queue.attempts(a)] == ["released"], "A to sleep")
    slept = queue.get(a)
    assert (slept.status, slept.attempt_count) == ("pending", 0)
    first = queue.attempts(a)[0]
    assert slept.available_at - first.started_at >= timedelta(seconds=30)
    assert "sleeping until" in (first.error or "")

    # One slot, a limit of 1 on the key: B runs only if the sleeping A holds neither.
    b = queue.enqueue("q", "quick", key="tenant").job_id
    wait_for(lambda: queue.get(b).status == "succeeded", "B to run while A sleeps")
    assert queue.get(a).status == "pending"

    # Time passes: the recorded wake time and the job's are due now.
    with conn.transaction():
        conn.execute(
            "UPDATE leaseq.job_steps SET result = to_jsonb(%s::text)"
            " WHERE job_id = %s AND name = 'leaseq.sleep-1'",
            ((datetime.now(UTC) - timedelta(seconds=1)).isoformat(), a),
        )
        conn.execute("UPDATE leaseq.jobs SET available_at = now() WHERE id = %s", (a,))
    wait_for(lambda: queue.get(a).status == "succeeded", "A to wake and finish")
    done = queue.get(a)
    assert (done.result, done.attempt_count) == ("drafted then woke", 1)
    assert [x.outcome for x in queue.attempts(a)] == ["released", "succeeded"]
    assert calls == ["draft"]  # the finished step was not run again


def test_an_interrupted_handler_hands_its_job_back_when_draining(
    queue: leaseq.Queue, workers: leaseq.Workers, start_worker: Callable[..., Running]
) -> None:
    registry = Registry()

    @registry.job("long")
    def long(payload: Any, ctx: JobContext) -> None:
        while not ctx.draining:
            ctx.wait(0.02)
        ctx.checkpoint({"saved": True})
        raise Interrupted("draining")

    w = start_worker(registry)
    job_id = queue.enqueue("q", "long").job_id
    wait_for(lambda: queue.get(job_id).status == "running", "the job to start")
    assert w.stop() == 0

    job = queue.get(job_id)
    assert (job.status, job.attempt_count, job.checkpoint) == ("pending", 0, {"saved": True})
    assert [a.outcome for a in queue.attempts(job_id)] == ["released"]
    assert workers.list() == []


def test_slots_run_concurrently_and_start_up_hooks_run_once(
    queue: leaseq.Queue, start_worker: Callable[..., Running]
) -> None:
    registry = Registry()
    hooks: list[str] = []
    barrier = threading.Barrier(3, timeout=30)
    lock = threading.Lock()
    running = [0, 0]  # now, most at once

    @registry.on_startup
    def load() -> None:
        hooks.append("loaded")

    @registry.job("together")
    def together(payload: Any, ctx: JobContext) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        barrier.wait()  # only passes if three handlers run at the same time
        with lock:
            running[0] -= 1

    start_worker(registry, concurrency=3)
    ids = [queue.enqueue("q", "together").job_id for _ in range(9)]
    wait_for(lambda: all(queue.get(i).status == "succeeded" for i in ids), "every job")
    assert hooks == ["loaded"]
    assert running[1] == 3


def test_the_worker_waits_for_the_schema_and_is_not_ready_meanwhile(
    empty_database_url: str, start_worker: Callable[..., Running]
) -> None:
    registry = Registry()
    w = start_worker(registry, url=empty_database_url)
    wait_for(lambda: "schema" in w.worker.health.ready()[1], "the schema check to fail")
    assert not w.worker.health.ready()[0]

    with leaseq.connect(empty_database_url, action="test") as conn:
        leaseq.migrate(conn)
        wait_for(lambda: leaseq.Workers(conn).list(), "the worker to register")
    # It registers as loading first; ready once on_startup has run.
    wait_for(lambda: w.worker.health.ready() == (True, "ok"), "the worker to be ready")
    assert w.stop() == 0


def test_a_completion_whose_effect_key_is_taken_says_so(
    queue: leaseq.Queue,
    start_worker: Callable[..., Running],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another job's effect holds the key (another producer chose the same one): the job
    succeeds, and its attempt's note, a warning and a counter say its effect was not written."""
    registry = Registry()

    @registry.job("bill")
    def bill(payload: Any, ctx: JobContext) -> dict[str, Any]:
        return {"by": payload["by"]}

    first = queue.enqueue("q", "bill", {"by": "a"}, idempotency_key="invoice-9").job_id
    w = start_worker(registry)
    wait_for(lambda: queue.get(first).status == "succeeded", "the first job to succeed")
    labels = {"queue": "q", "job_type": "bill"}
    assert w.sample("leaseq_effects_not_written_total", **labels) == 0
    second = queue.enqueue("q", "bill", {"by": "b"}, idempotency_key="invoice-9").job_id
    wait_for(
        lambda: w.sample("leaseq_effects_not_written_total", **labels) == 1,
        "the second completion to be counted",
    )
    assert queue.get(second).status == "succeeded"
    effect = queue.effect("invoice-9")
    assert effect is not None and effect.job_id == first
    [attempt] = queue.attempts(second)
    assert attempt.error is not None and "effect not written" in attempt.error
    [line] = [r for r in caplog.records if "effect was not written" in r.getMessage()]
    assert "'invoice-9'" in line.getMessage() and line.levelname == "WARNING"
    assert w.stop() == 0
