"""A worker's settling calls across a PostgreSQL it cannot reach: a completion (of one attempt,
or of a group in one statement) is retried with backoff until the server answers again, while
the lease may still hold; one whose lease has surely expired meanwhile is left to the reaper,
never reported, and the attempt is marked settled either way."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from functools import partial

import psycopg
import pytest

import leaseq
from leaseq.core.models import Call, ClaimedJob
from leaseq.runtime.context import JobContext
from leaseq.runtime.health import Health
from leaseq.runtime.inflight import InFlight
from leaseq.runtime.metrics import WorkerMetrics
from leaseq.runtime.outcomes import Outcome, Settler
from leaseq.runtime.settlement import Done, Settlement
from support.polling import wait_for
from support.proxy import CuttableProxy

#: Bound on a settling call once the server answers again (the backoff caps at 2 s).
SETTLED_WITHIN = 30.0


@pytest.fixture
def proxy(database_url: str) -> Iterator[CuttableProxy]:
    p = CuttableProxy(database_url)
    yield p
    p.close()


@pytest.fixture
def through(proxy: CuttableProxy) -> Iterator[leaseq.Queue]:
    """A queue whose pool goes through the proxy; a wait for a connection gives up in 1 s."""
    with leaseq.open_pool(proxy.url, min_size=1, max_size=1, timeout=1) as pool:
        yield leaseq.Queue(pool)


@pytest.fixture
def settlement(through: leaseq.Queue) -> Iterator[Settlement]:
    s = Settlement(
        through,
        metrics=WorkerMetrics(["q"], ["t"]),
        health=Health(),
        stopping=threading.Event(),
    )
    yield s
    s.stopping.set()  # a retry loop a failing test left behind gives up


def taken(job: ClaimedJob) -> InFlight:
    """The attempt as a worker holds it once its handler returned, lease 60 s from now."""
    now = time.monotonic()
    context = JobContext(job, None, "w1", threading.Event())  # type: ignore[arg-type]
    attempt = InFlight.start(
        job, None, context, sent_at=now, received_at=now, lease_seconds=60, heartbeat_seconds=10
    )
    assert attempt.take(Settler.HANDLER)
    return attempt


def succeeded(s: Settlement) -> float | None:
    labels = {"queue": "q", "job_type": "t", "outcome": Outcome.SUCCEEDED.value}
    return s.metrics.registry.get_sample_value("leaseq_jobs_finished_total", labels)


def in_thread(fn: partial[None]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def retrying(caplog: pytest.LogCaptureFixture, what: str) -> bool:
    return any(r.getMessage().startswith(f"{what} failed") for r in caplog.records)


def test_a_group_completion_is_retried_until_the_server_answers(
    queue: leaseq.Queue,
    through: leaseq.Queue,
    proxy: CuttableProxy,
    settlement: Settlement,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="leaseq.worker")
    ids = [queue.enqueue("q", "t").job_id for _ in range(2)]
    group = [Done(taken(job), {"n": job.id}, None) for job in queue.claim(["q"], "w1", limit=2)]
    proxy.cut()
    thread = in_thread(partial(settlement.complete, group))
    wait_for(lambda: retrying(caplog, "complete of 2"), "a retry of the group")
    assert queue.get(ids[0]).status == "running"
    proxy.restore()
    thread.join(SETTLED_WITHIN)
    assert not thread.is_alive()
    for job_id in ids:
        record = queue.get(job_id)
        assert (record.status, record.attempt_count, record.result) == (
            "succeeded",
            1,
            {"n": job_id},
        )
    assert succeeded(settlement) == 2
    assert all(done.attempt.settled.is_set() for done in group)


def test_one_completion_is_retried_until_the_server_answers(
    queue: leaseq.Queue,
    through: leaseq.Queue,
    proxy: CuttableProxy,
    settlement: Settlement,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="leaseq.worker")
    job_id = queue.enqueue("q", "t").job_id
    [job] = queue.claim(["q"], "w1")
    attempt = taken(job)
    proxy.cut()
    complete = partial(through.complete, job.lease, {"pages": 3})
    thread = in_thread(partial(settlement.settle_taken, attempt, Call.COMPLETE, complete))
    wait_for(lambda: retrying(caplog, "complete"), "a retry of the completion")
    proxy.restore()
    thread.join(SETTLED_WITHIN)
    assert not thread.is_alive()
    record = queue.get(job_id)
    assert (record.status, record.attempt_count, record.result) == ("succeeded", 1, {"pages": 3})
    assert succeeded(settlement) == 1
    assert attempt.settled.is_set()


def test_a_completion_whose_lease_expired_is_left_to_the_reaper(
    queue: leaseq.Queue,
    through: leaseq.Queue,
    proxy: CuttableProxy,
    settlement: Settlement,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="leaseq.worker")
    job_id = queue.enqueue("q", "t").job_id
    [job] = queue.claim(["q"], "w1")
    attempt = taken(job)
    attempt.lease_bound = time.monotonic() - 1  # surely expired, as far as the worker knows
    proxy.cut()
    complete = partial(through.complete, job.lease, {"pages": 3})
    thread = in_thread(partial(settlement.settle_taken, attempt, Call.COMPLETE, complete))
    thread.join(SETTLED_WITHIN)
    assert not thread.is_alive(), "still retrying a completion whose lease had expired"
    assert not retrying(caplog, "complete")
    assert any("not delivered" in r.getMessage() for r in caplog.records)
    assert queue.get(job_id).status == "running"  # the reaper's to return
    assert succeeded(settlement) == 0
    assert attempt.settled.is_set()


def test_a_completion_that_waits_out_its_lock_timeout_is_retried(
    database_url: str, queue: leaseq.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """A session holding the job's row in an idle transaction makes the completion wait past
    its role's lock_timeout: nothing was applied, so it is tried again, and lands once the
    row is free; the attempt is not handed to the reaper."""
    caplog.set_level(logging.INFO, logger="leaseq.worker")
    url = psycopg.conninfo.make_conninfo(database_url, options="-c lock_timeout=100")
    job_id = queue.enqueue("q", "t").job_id
    [job] = queue.claim(["q"], "w1")
    attempt = taken(job)
    with leaseq.open_pool(url, min_size=1, max_size=1, timeout=1) as pool:
        short = leaseq.Queue(pool)
        s = Settlement(
            short, metrics=WorkerMetrics(["q"], ["t"]), health=Health(), stopping=threading.Event()
        )
        holder = psycopg.connect(database_url)
        try:
            holder.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", (job_id,))
            complete = partial(short.complete, job.lease, {"pages": 3})
            thread = in_thread(partial(s.settle_taken, attempt, Call.COMPLETE, complete))
            wait_for(lambda: retrying(caplog, "complete"), "a retry of the completion")
            assert queue.get(job_id).status == "running"
        finally:
            holder.close()
        thread.join(SETTLED_WITHIN)
        s.stopping.set()
    assert not thread.is_alive()
    record = queue.get(job_id)
    assert (record.status, record.attempt_count, record.result) == ("succeeded", 1, {"pages": 3})
    assert attempt.settled.is_set()
