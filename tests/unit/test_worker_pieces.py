"""Pure pieces of the worker runtime: backoff, settings, registry, context, in-flight table,
health, metrics, signal watch."""

from __future__ import annotations

import argparse
import os
import random
import signal
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from leaseq import config as settings
from leaseq.core.backoff import Backoff
from leaseq.core.errors import ConfigError, DatabaseError, DatabaseUnavailable, InvalidJob
from leaseq.core.models import ClaimedJob, Lease
from leaseq.runtime.context import Interrupted, JobContext, StopReason
from leaseq.runtime.health import Health
from leaseq.runtime.inflight import InFlight, InFlightTable
from leaseq.runtime.latch import Latch
from leaseq.runtime.metrics import OUTCOMES, WorkerMetrics
from leaseq.runtime.outcomes import Outcome, Settler
from leaseq.runtime.registry import Registry, load_app
from leaseq.runtime.settings import OPTIONS, WorkerSettings
from leaseq.runtime.shutdown import SignalWatch
from support.polling import wait_for


def test_backoff_doubles_within_jittered_bounds_up_to_the_cap() -> None:
    backoff = Backoff(0.5, 4.0, rng=random.Random(1))
    steps = [0.5, 1.0, 2.0, 4.0, 4.0]
    for step in steps:
        assert step / 2 <= backoff.next() <= step
    backoff.reset()
    assert 0.25 <= backoff.next() <= 0.5
    with pytest.raises(ValueError):
        Backoff(2.0, 1.0)


def parse(argv: list[str], env: dict[str, str] | None = None) -> WorkerSettings:
    parser = argparse.ArgumentParser()
    settings.add_options(parser, OPTIONS)
    return WorkerSettings.from_args(parser.parse_args(argv), env or {})


def test_worker_settings_from_flags_and_environment() -> None:
    env = {
        "LEASEQ_DATABASE_URL": "postgresql://db/x",
        "LEASEQ_APP": "pkg.jobs:registry",
        "LEASEQ_QUEUES": "ocr, infer,ocr",
        "LEASEQ_CONCURRENCY": "4",
        "LEASEQ_LISTEN": "false",
    }
    s = parse(["--concurrency", "8", "--worker-id", "w-1"], env)
    assert s.queues == ("ocr", "infer")
    assert s.concurrency == 8  # the flag wins over the variable
    assert s.listen is False
    assert (s.lease_seconds, s.heartbeat_seconds, s.poll_seconds) == (30.0, 10.0, 5.0)
    # Not in a pod (no KUBERNETES_SERVICE_HOST): a free port (None) on loopback.
    assert (s.drain_seconds, s.metrics_port, s.worker_id) == (25.0, None, "w-1")
    assert s.metrics_address == "127.0.0.1"
    flags = parse(["--queue", "a", "--queue", "b"], env)
    assert flags.queues == ("a", "b")
    # A random part after the pid: a restarted container's worker (PID 1 again) has an id of
    # its own, so its leases are never taken for those of the container that terminated.
    first, second = parse([], env), parse([], env)
    assert f"-{os.getpid()}-" in first.worker_id and first.worker_id != second.worker_id
    assert first.own_id  # so it registers when it started, and is reclaimed at its end
    assert not parse(["--worker-id", "fixed"], env).own_id


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--heartbeat-seconds", "30"], "must be below --lease-seconds"),
        (["--listen", "maybe"], "--listen"),
        (["--concurrency", "0"], "--concurrency"),
        (["--concurrency", "100000"], "--concurrency 100000 is above the limit of 1024 slots"),
    ],
)
def test_worker_settings_refuse_bad_values(argv: list[str], message: str) -> None:
    env = {"LEASEQ_DATABASE_URL": "postgresql://db/x", "LEASEQ_APP": "a:b", "LEASEQ_QUEUES": "q"}
    with pytest.raises(ConfigError, match=message):
        parse(argv, env)


def test_the_heartbeat_follows_a_short_lease_unless_given() -> None:
    env = {"LEASEQ_DATABASE_URL": "postgresql://db/x", "LEASEQ_APP": "a:b", "LEASEQ_QUEUES": "q"}
    short = parse(["--lease-seconds", "5"], env)
    assert (short.lease_seconds, short.heartbeat_seconds) == (5.0, 5.0 / 3)
    from_env = parse([], {**env, "LEASEQ_LEASE_SECONDS": "6"})
    assert from_env.heartbeat_seconds == 2.0
    given = parse(["--lease-seconds", "5", "--heartbeat-seconds", "1"], env)
    assert given.heartbeat_seconds == 1.0
    with pytest.raises(ConfigError, match="must be below --lease-seconds"):
        parse(["--lease-seconds", "5", "--heartbeat-seconds", "10"], env)


def test_the_lease_flag_says_a_leader_s_jobs_wait_for_the_leader_lease_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # no line breaks inside the help's words
    parser = argparse.ArgumentParser()
    settings.add_options(parser, OPTIONS)
    text = " ".join(parser.format_help().split())
    assert "waits for the leader lease (15 s) to lapse" in text
    assert "(env LEASEQ_HEARTBEAT_SECONDS; default 1/3 of --lease-seconds)" in text


def test_the_concurrency_limit_is_inclusive() -> None:
    env = {"LEASEQ_DATABASE_URL": "postgresql://db/x", "LEASEQ_APP": "a:b", "LEASEQ_QUEUES": "q"}
    assert parse(["--concurrency", "1024"], env).concurrency == 1024


def test_worker_settings_name_what_is_missing() -> None:
    with pytest.raises(ConfigError, match="--app is required"):
        parse(["--database-url", "postgresql://db/x", "--queue", "q"])
    with pytest.raises(ConfigError, match="--queue is required"):
        parse(["--database-url", "postgresql://db/x", "--app", "a:b"])


registry = Registry()


@registry.job("unit")
def unit_handler(payload: Any, ctx: JobContext) -> None:
    return None


def test_registry_registers_by_job_type_and_runs_hooks_in_order() -> None:
    reg = Registry()
    calls: list[str] = []
    reg.on_startup(lambda: calls.append("a"))
    reg.on_startup(lambda: calls.append("b"))

    @reg.job("ocr", progress_timeout=5)
    def ocr(payload: Any, ctx: JobContext) -> None:
        return None

    reg.run_startup()
    assert calls == ["a", "b"]
    found = reg.get("ocr")
    assert found is not None
    assert (found.handler, found.progress_timeout) == (ocr, 5)
    assert reg.get("nope") is None
    assert reg.job_types == ["ocr"]
    with pytest.raises(ConfigError, match="twice"):
        reg.job("ocr")
    with pytest.raises(ConfigError, match="job_type"):
        reg.job("")
    with pytest.raises(ConfigError, match="progress_timeout"):
        reg.job("x", progress_timeout=0)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_colon", "must look like"),
        ("leaseq_no_such_module:registry", "cannot import"),
        (f"{__name__}:missing", "has no 'missing'"),
        (f"{__name__}:unit_handler", "not a leaseq.Registry"),
    ],
)
def test_load_app_says_what_is_wrong(path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_app(path)


def test_load_app_returns_the_registry() -> None:
    assert load_app(f"{__name__}:registry") is registry


def claimed(timeout: float | None = None, key: str | None = None) -> ClaimedJob:
    now = datetime.now(UTC)
    return ClaimedJob(
        id=7,
        queue="q",
        job_type="unit",
        payload={"x": 1},
        priority=100,
        attempt=2,
        max_attempts=5,
        lease=Lease(7, "w", 11, 2, now, b""),
        lease_expires_at=now,
        timeout_seconds=timeout,
        idempotency_key=key,
        checkpoint={"step": 3},
    )


def context(job: ClaimedJob | None = None) -> JobContext:
    # No checkpoint call is made here, so no queue is needed.
    return JobContext(job or claimed(), None, "w", threading.Event())  # type: ignore[arg-type]


def test_a_sleep_must_be_finite_aware_and_within_3650_days() -> None:
    """Each bad time is refused before anything is recorded, the error naming the argument."""
    ctx = context()
    # The latest datetime Python holds, 14 hours west of UTC: year 10000 in UTC.
    year_10000 = datetime.max.replace(tzinfo=timezone(timedelta(hours=-14)))
    refused: list[tuple[Callable[[], None], str]] = [
        (lambda: ctx.sleep(3651 * 86_400), "seconds: must be at most 315360000 seconds"),
        (lambda: ctx.sleep(float("inf")), "seconds: must be a finite number, got Infinity"),
        (lambda: ctx.sleep(float("nan")), "seconds: must be a finite number, got NaN"),
        (lambda: ctx.sleep(True), "seconds: must be a finite number, got True"),
        # An int beyond a float: math.isfinite would raise OverflowError on it.
        (lambda: ctx.sleep(10**400), "seconds: must be a finite number, got an integer of 1329"),
        (lambda: ctx.sleep(-1), "seconds: must not be negative, got -1"),
        (lambda: ctx.sleep_until(datetime(2030, 1, 1)), "when: must be a timezone-aware"),
        (lambda: ctx.sleep_until("2030-01-01Z"), "when: must be a timezone-aware"),  # type: ignore[arg-type]
        (lambda: ctx.sleep_until(datetime(9999, 1, 1, tzinfo=UTC)), "when: must be at most 3650"),
        (lambda: ctx.sleep_until(year_10000), "when: must be at most 3650 days away"),
    ]
    for call, message in refused:
        with pytest.raises(InvalidJob) as raised:
            call()
        assert str(raised.value).startswith(f"invalid {message}")


def test_a_wait_for_a_signal_names_its_bad_argument() -> None:
    ctx = context()
    with pytest.raises(InvalidJob, match="invalid name: must be a non-empty string"):
        ctx.wait_for("", timeout=60)
    with pytest.raises(InvalidJob, match="invalid name: is 201 characters long"):
        ctx.wait_for("x" * 201, timeout=60)
    with pytest.raises(InvalidJob, match="invalid timeout: must be a finite number"):
        ctx.wait_for("approve", timeout=float("nan"))
    with pytest.raises(InvalidJob, match="invalid timeout: must be at most 315360000"):
        ctx.wait_for("approve", timeout=3651 * 86_400)


def test_context_exposes_the_attempt_and_derives_the_effect_key_from_the_work() -> None:
    ctx = context(claimed(key="invoice-412"))
    assert (ctx.job_id, ctx.attempt, ctx.lease_token, ctx.payload) == (7, 2, 11, {"x": 1})
    assert ctx.last_checkpoint == {"step": 3}
    assert ctx.effect_key == "invoice-412"
    assert context().effect_key == "job:7"


def test_context_progress_is_versioned_and_the_first_stop_reason_wins() -> None:
    ctx = context()
    assert ctx.pending_progress() == (None, 0)
    ctx.progress({"pct": 10})
    ctx.progress({"pct": 20})
    assert ctx.pending_progress() == ({"pct": 20}, 2)
    assert ctx.seconds_since_progress() >= 0
    assert not ctx.should_stop
    assert ctx.wait(0) is False
    ctx.request_stop(StopReason.TIMED_OUT)
    ctx.request_stop(StopReason.LEASE_LOST)
    assert ctx.should_stop
    assert ctx.stop_reason is StopReason.TIMED_OUT
    assert ctx.wait(10) is True  # returns at once once stopped
    with pytest.raises(Interrupted, match="timed_out"):
        ctx.raise_if_stopped()
    ctx.request_stop(StopReason.CANCELLED)
    assert ctx.stop_reason is StopReason.TIMED_OUT and not ctx.cancelled


def test_a_lease_seen_lost_by_a_step_turns_out_cancelled_at_the_renewal() -> None:
    ctx = context()
    ctx.request_stop(StopReason.LEASE_LOST)  # a step call was refused
    assert not ctx.cancelled
    ctx.request_stop(StopReason.CANCELLED)  # the heartbeat: the job was cancelled
    assert ctx.cancelled and ctx.stop_reason is StopReason.CANCELLED
    ctx.request_stop(StopReason.LEASE_LOST)
    assert ctx.cancelled


def started(timeout: float, sent_at: float, received_at: float) -> InFlight:
    """An attempt claimed with a 30 s lease and a 10 s heartbeat interval."""
    return InFlight.start(
        claimed(timeout=timeout),
        None,
        context(),
        sent_at=sent_at,
        received_at=received_at,
        lease_seconds=30,
        heartbeat_seconds=10,
    )


def test_in_flight_attempt_is_settled_by_exactly_one_party() -> None:
    job = started(10.0, 100.0, 100.2)
    assert job.lease_bound == pytest.approx(130.2)
    assert job.renew_at == pytest.approx(110.2)  # no heartbeat for a job done within 10 s
    assert job.deadline == pytest.approx(109.5)  # before the database's deadline, never after
    assert started(1.0, 0.0, 0.0).deadline == pytest.approx(0.75)
    assert job.take(Settler.LEASE_LOST)
    assert not job.take(Settler.HANDLER)
    assert job.settled_by is Settler.LEASE_LOST

    table = InFlightTable()
    table.add(job)
    assert len(table) == 1
    assert table.running() == []
    assert not table.wait_settled(0.01)
    job.settled.set()
    assert table.wait_settled(0.01)
    table.remove([job])
    assert len(table) == 0


def test_latch_wakes_a_waiter_that_came_before_or_after_it_was_set() -> None:
    latch = Latch()
    assert not latch.is_set()
    assert not latch.wait(0.01)  # times out, like an Event
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(latch.wait(60)))
    waiter.start()
    wait_for(lambda: latch._event is not None, "the waiter blocked on its Event")
    latch.set()
    waiter.join(60)
    assert woken == [True]
    assert latch.is_set()
    assert latch.wait(0)  # set before this wait: no Event needed
    never_waited = Latch()
    never_waited.set()
    assert never_waited.is_set() and never_waited._event is None


def test_health_reports_silent_loops_database_errors_and_draining() -> None:
    health = Health()
    assert health.ready() == (False, "database: not connected yet")
    health.db_ok()
    assert health.ready() == (True, "ok")
    # What is wrong and where, never the server's own text (issue 11).
    health.db_failed(DatabaseError("server said: secret detail"))
    assert health.ready() == (False, "database: DatabaseError (see the log)")
    health.db_failed(DatabaseUnavailable("db", "5432", "FATAL: secret detail", "nothing done"))
    assert health.ready() == (False, "database: unreachable at db:5432")
    health.db_ok()
    health.draining = True
    assert health.ready() == (False, "draining")

    health.expect("dispatcher", 0.0)  # no allowance: silent as soon as the clock moves

    def silent() -> str | None:
        ok, reason = health.healthy()
        return None if ok else reason

    reason = wait_for(silent, "the dispatcher counts as silent")
    assert "dispatcher loop silent" in reason
    health.expect("dispatcher", 60.0)
    assert health.healthy() == (True, "ok")


def test_metrics_start_every_known_series_at_zero() -> None:
    m = WorkerMetrics(["a", "b"], ["ocr"])
    get = m.registry.get_sample_value
    for queue in ("a", "b"):
        assert get("leaseq_jobs_in_flight", {"queue": queue}) == 0
        assert get("leaseq_lease_renewals_total", {"queue": queue}) == 0
        assert get("leaseq_jobs_claimed_total", {"queue": queue, "job_type": "ocr"}) == 0
        for outcome in OUTCOMES:
            labels = {"queue": queue, "job_type": "ocr", "outcome": outcome}
            assert get("leaseq_jobs_finished_total", labels) == 0
    m.finish("a", "ocr", Outcome.SUCCEEDED)
    labels = {"queue": "a", "job_type": "ocr", "outcome": "succeeded"}
    assert get("leaseq_jobs_finished_total", labels) == 1


def test_signal_watch_counts_real_signals_and_triggers() -> None:
    watch = SignalWatch()
    watch.install()
    try:
        assert watch.wait(0, 0.01) == 0
        os.kill(os.getpid(), signal.SIGTERM)
        assert watch.wait(0, 10) == 1
        watch.trigger()
        assert watch.wait(1, 10) == 2
    finally:
        watch.uninstall()
        watch.close()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
