"""A job stopped at an uncertain durable step is held, not dead: everyone waiting on it waits
on, and is answered once an operator settles the step and the job finishes.

Each test fails where such a job was dead: its result raised JobDead, its pipeline ended
failed (its children cancelled), its stream ended and signals to it were refused."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

import leaseq
from leaseq import Graph
from leaseq.cli.main import main
from support.dbtime import claim_one
from support.steps import context, stop_uncertain

#: The longest any waiter below may take to answer once the job finished.
ANSWER_SECONDS = 60.0

T = TypeVar("T")


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


def waiting(
    pool: ThreadPoolExecutor, database_url: str, wait: Callable[[leaseq.Queue], T]
) -> Future[T]:
    """``wait`` run in another thread on its own connection, as a producer waits."""

    def run() -> T:
        with leaseq.connect(database_url, action="test waiter") as conn:
            return wait(leaseq.Queue(conn))

    return pool.submit(run)


def hold(queue: leaseq.Queue, conn: leaseq.core.db.Conn, job_id: int, job_type: str = "t") -> None:
    """Job ``job_id`` (the only claimable one of ``job_type``) stops at its uncertain step
    "charge"; it is held."""
    [first] = queue.claim(["q"], "w1", job_types=[job_type])
    assert first.id == job_id
    stop_uncertain(queue, conn, context(queue, first), "charge")
    found = queue.get(job_id)
    assert (found.status, found.finished_at) == (leaseq.JobStatus.HELD, None)


def resolve_and_finish(queue: leaseq.Queue, job_id: int, result: Any = "paid") -> None:
    """The operator settles "charge"; the next attempt runs on and succeeds."""
    queue.resolve_step(job_id, "charge", result={"charged": 1}, actor="ops", reason="in ledger")
    attempt = claim_one(queue, "w3")
    assert attempt.id == job_id
    assert context(queue, attempt).step("charge", lambda: pytest.fail("ran again")) == {
        "charged": 1
    }
    assert isinstance(queue.complete(attempt.lease, result), leaseq.Completed)


def test_result_waits_through_the_hold_and_returns_the_result(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, database_url: str, pool: ThreadPoolExecutor
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    hold(queue, conn, job_id)
    with pytest.raises(leaseq.ResultTimeout):
        queue.result(job_id, timeout=0.2)
    answer = waiting(pool, database_url, lambda q: q.result(job_id, timeout=ANSWER_SECONDS))
    resolve_and_finish(queue, job_id, "paid")
    assert answer.result(timeout=ANSWER_SECONDS) == "paid"


def test_a_pipeline_waits_through_the_hold_and_its_children_run_after(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, database_url: str, pool: ThreadPoolExecutor
) -> None:
    g = Graph("agent")
    root = g.add("q", "t", name="root")
    g.add("q", "after", name="after", after=[root])
    enqueued = queue.enqueue_graph(g)
    root_id, child_id, pipeline_id = enqueued["root"], enqueued["after"], enqueued.pipeline_id
    assert pipeline_id is not None
    hold(queue, conn, root_id)
    assert queue.get(child_id).status == leaseq.JobStatus.WAITING
    assert not queue.pipeline(pipeline_id).finished
    with pytest.raises(leaseq.ResultTimeout):
        queue.wait_pipeline(pipeline_id, timeout=0.2)
    answer = waiting(
        pool,
        database_url,
        lambda q: q.wait_pipeline(pipeline_id, timeout=ANSWER_SECONDS),
    )
    resolve_and_finish(queue, root_id)
    [child] = queue.claim(["q"], "w4", job_types=["after"])
    assert isinstance(queue.complete(child.lease, "merged"), leaseq.Completed)
    outcome = answer.result(timeout=ANSWER_SECONDS)
    assert (outcome.state, outcome.succeeded, outcome.result) == (
        leaseq.PipelineState.SUCCEEDED,
        2,
        "merged",
    )


def test_a_stream_stays_open_through_the_hold_and_ends_with_the_job(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, database_url: str, pool: ThreadPoolExecutor
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    [first] = queue.claim(["q"], "w1")
    ctx = context(queue, first)
    ctx.emit("thinking")
    queue.release(first.lease, shutdown=True)  # the next claim is the first attempt again
    hold(queue, conn, job_id)
    assert queue.stream_page(job_id).finished is False
    read = waiting(pool, database_url, lambda q: [i.value for i in q.stream(job_id, poll=0.05)])
    resolve_and_finish(queue, job_id)
    assert read.result(timeout=ANSWER_SECONDS) == ["thinking"]
    assert queue.stream_page(job_id).finished is True


def test_a_signal_to_a_held_job_is_kept_for_its_next_attempt(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    hold(queue, conn, job_id)
    sent = queue.signal(job_id, "approve", {"by": "ana"})
    assert (sent.stored, sent.waiting) == (True, False)
    queue.resolve_step(job_id, "charge", result={"charged": 1}, actor="ops", reason="in ledger")
    ctx = context(queue, claim_one(queue, "w3"))
    assert ctx.wait_for("approve", timeout=60) == {"by": "ana"}


def test_status_and_stats_list_a_held_job_as_needing_a_human(
    queue: leaseq.Queue,
    conn: leaseq.core.db.Conn,
    database_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    hold(queue, conn, job_id)
    [stats] = queue.stats(["q"])
    assert (stats.held, stats.dead) == (1, 0)
    assert main(["status", "--database-url", database_url]) == 0
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    assert header.split()[4:6] == ["DEAD", "HELD"]
    assert row.split()[4:6] == ["0", "1"]
    assert "1 job(s) held at an uncertain step need a human" in out
    assert f"\n{job_id} " in out
    # Neither retried as a dead job nor pruned as a finished one.
    with pytest.raises(leaseq.JobStateError, match="held at an uncertain step"):
        queue.retry_dead(job_id)
    assert queue.prune(older_than=0) == 0
    assert queue.get(job_id).status == leaseq.JobStatus.HELD


def test_an_ordered_aggregate_waits_behind_a_held_head(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    head = queue.enqueue("q", "t", ordering_key="order-7").job_id
    hold(queue, conn, head)
    behind = queue.enqueue("q", "next", ordering_key="order-7").job_id
    assert queue.claim(["q"], "w5") == [], "nothing behind a held head starts"
    resolve_and_finish(queue, head)
    [claimed] = queue.claim(["q"], "w5")
    assert claimed.id == behind
