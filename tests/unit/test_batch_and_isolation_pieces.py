"""Pure pieces of micro-batching and process isolation: batch registration, how a batch
handler's answer becomes one outcome per job, a batch's share of the worker's capacity,
words for a dead child, the isolation flag."""

from __future__ import annotations

import argparse
import signal
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from leaseq import config as settings
from leaseq.core.errors import ConfigError
from leaseq.core.models import ClaimedJob, Lease
from leaseq.runtime.batching import Batching
from leaseq.runtime.context import JobContext, PermanentError
from leaseq.runtime.executor import Ending, Executor, OnDone, ThreadExecutor, run_unit
from leaseq.runtime.inflight import InFlight
from leaseq.runtime.processes import exit_cause
from leaseq.runtime.registry import Registry
from leaseq.runtime.settings import OPTIONS, Isolation, WorkerSettings
from support.polling import wait_for


def attempt(registry: Registry, job_id: int, payload: Any, job_type: str = "embed") -> InFlight:
    now = datetime.now(UTC)
    job = ClaimedJob(
        id=job_id,
        queue="q",
        job_type=job_type,
        payload=payload,
        priority=100,
        attempt=1,
        max_attempts=3,
        lease=Lease(job_id, "w", 1, 1, now, b""),
        lease_expires_at=now,
        timeout_seconds=None,
        idempotency_key=None,
        checkpoint=None,
    )
    # No checkpoint call is made here, so no queue is needed.
    ctx = JobContext(job, None, "w", threading.Event())  # type: ignore[arg-type]
    return InFlight.start(
        job,
        registry.get(job_type),
        ctx,
        sent_at=0.0,
        received_at=0.0,
        lease_seconds=30.0,
        heartbeat_seconds=10.0,
    )


def embed_registry(answer: Any = None) -> Registry:
    registry = Registry()

    @registry.batch("embed", max_batch=4, max_wait=0.01)
    def embed(payloads: list[Any], ctxs: list[JobContext]) -> Any:
        if answer is not None:
            return answer
        return [
            PermanentError(f"bad {p}") if p == "bad" else {"n": len(payloads), "job": c.job_id}
            for p, c in zip(payloads, ctxs, strict=True)
        ]

    return registry


def test_batch_types_register_with_their_limits_and_refuse_bad_ones() -> None:
    registry = embed_registry()
    found = registry.get("embed")
    assert found is not None and found.batch is not None
    assert (found.batch.max_batch, found.batch.max_wait) == (4, 0.01)
    assert registry.largest_batch == 4
    assert Registry().largest_batch == 1
    with pytest.raises(ConfigError, match="twice"):
        registry.batch("embed", max_batch=2, max_wait=0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="max_batch"):
            registry.batch("other", max_batch=bad, max_wait=0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_wait"):
        registry.batch("other", max_batch=2, max_wait=-1)


def test_a_batch_gives_one_outcome_per_job_and_a_bad_input_fails_alone() -> None:
    registry = embed_registry()
    unit = [attempt(registry, i, p) for i, p in enumerate(["a", "bad", "c"], start=1)]
    outcomes = run_unit(unit)
    assert [o.ending for o in outcomes] == [Ending.RETURNED, Ending.PERMANENT, Ending.RETURNED]
    assert [outcomes[0].value, outcomes[2].value] == [{"n": 3, "job": 1}, {"n": 3, "job": 3}]
    assert outcomes[1].error == "PermanentError: bad bad"
    # A batch of one goes through the same handler.
    (single,) = run_unit([attempt(registry, 9, "bad")])
    assert (single.ending, single.error) == (Ending.PERMANENT, "PermanentError: bad bad")


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ([{"only": "one"}], "returned 1 results for 2 jobs"),
        ("ab", "must return a list, got str"),
    ],
)
def test_a_batch_answer_of_the_wrong_shape_fails_every_job(answer: Any, message: str) -> None:
    registry = embed_registry(answer)
    outcomes = run_unit([attempt(registry, i, "x") for i in (1, 2)])
    assert [o.ending for o in outcomes] == [Ending.ERROR, Ending.ERROR]
    assert all(message in o.error for o in outcomes)


def test_a_dead_child_is_described_by_its_signal_or_exit_code() -> None:
    assert exit_cause(-signal.SIGKILL).startswith("child process killed by SIGKILL (signal 9)")
    assert "OOM" in exit_cause(-signal.SIGKILL)
    assert exit_cause(-signal.SIGSEGV) == "child process killed by SIGSEGV (signal 11)"
    assert exit_cause(3) == "child process exited with code 3"
    assert exit_cause(None) == "child process vanished"


def parse(argv: list[str], env: dict[str, str]) -> WorkerSettings:
    parser = argparse.ArgumentParser()
    settings.add_options(parser, OPTIONS)
    return WorkerSettings.from_args(parser.parse_args(argv), env)


def test_isolation_is_a_flag_with_a_variable_and_defaults_to_threads() -> None:
    env = {"LEASEQ_DATABASE_URL": "postgresql://db/x", "LEASEQ_APP": "a:b", "LEASEQ_QUEUES": "q"}
    assert parse([], env).isolation is Isolation.THREAD
    assert parse([], {**env, "LEASEQ_ISOLATION": "process"}).isolation is Isolation.PROCESS
    flag = parse(["--isolation", "thread"], {**env, "LEASEQ_ISOLATION": "process"})
    assert flag.isolation is Isolation.THREAD
    with pytest.raises(ConfigError, match=r"LEASEQ_ISOLATION.*thread, process"):
        parse([], {**env, "LEASEQ_ISOLATION": "fork"})


class Slots(Executor):
    """Slots that only record what they were given (the unit under test is Batching)."""

    def __init__(self, capacity: int, on_done: OnDone) -> None:
        super().__init__(capacity, on_done)
        self.units: list[list[InFlight]] = []

    def start(self) -> None:
        pass

    def submit(self, attempt: InFlight) -> None:
        self.units.append([attempt])

    def submit_batch(self, attempts: list[InFlight]) -> None:
        self.units.append(attempts)

    def close(self, timeout: float) -> None:
        pass


def test_a_batch_takes_one_slot_and_room_to_fill_only_while_it_is_open() -> None:
    registry = embed_registry()  # max_batch 4, max_wait 10 ms

    @registry.job("single")
    def single(payload: Any, ctx: JobContext) -> None:
        return None

    reported: list[list[int]] = []
    made: list[Slots] = []

    def slots(on_done: OnDone) -> Executor:
        made.append(Slots(2, on_done))
        return made[0]

    batching = Batching(registry, lambda jobs, _: reported.append([j.job.id for j in jobs]), slots)
    inner = made[0]
    assert batching.capacity == 2  # no batch work: exactly the slots
    batching.submit(attempt(registry, 1, "x", job_type="single"))
    assert batching.capacity == 2 and len(inner.units) == 1

    batch = [attempt(registry, i, "x") for i in range(10, 14)]
    batching.submit(batch[0])
    assert batching.capacity == 2 + 3  # an open batch: room for three more
    assert batching.kill(batch[0])  # killed before it ran: never submitted, never reported
    for a in batch[1:]:
        batching.submit(a)
    assert batching.capacity == 2 + 3
    batching.start()
    wait_for(lambda: len(inner.units) == 2, "the batch to be submitted at max_wait")
    assert [a.job.id for a in inner.units[1]] == [11, 12, 13]
    assert batching.capacity == 2 + 2  # submitted: one slot for three jobs
    inner.on_done(inner.units[1], run_unit(inner.units[1]))
    assert reported == [[11, 12, 13]]
    assert batching.capacity == 2
    batching.close(1.0)


def test_an_attempt_without_a_handler_fails_as_no_handler_and_its_slot_goes_on() -> None:
    """A slot given an attempt whose type has no handler (registered in the worker, not in
    the process that runs handlers) reports a NoHandler error and takes the next unit."""
    registry = embed_registry()

    @registry.job("known")
    def known(payload: Any, ctx: JobContext) -> Any:
        return payload

    reported: list[tuple[int, Ending, str]] = []

    def on_done(attempts: list[InFlight], outcomes: list[Any]) -> None:
        reported.extend(
            (a.job.id, o.ending, o.error_code) for a, o in zip(attempts, outcomes, strict=True)
        )

    executor = ThreadExecutor(1, on_done, startup=lambda: None)
    executor.start()
    try:
        executor.submit(attempt(registry, 1, None, job_type="gone"))
        executor.submit(attempt(registry, 2, 42, job_type="known"))
        wait_for(lambda: len(reported) == 2, "both attempts reported by the one slot")
    finally:
        executor.close(timeout=1.0)
    assert reported == [(1, Ending.ERROR, "NoHandler"), (2, Ending.RETURNED, "")]
