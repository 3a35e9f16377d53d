"""Calls whose commit happened but whose answer was lost with the connection (the server's
reply dropped, then the connection closed): the retry on a fresh connection is answered by
what the first try really did, and no attempt is spent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import leaseq
from support.proxy import CuttableProxy


@pytest.fixture
def proxy(database_url: str) -> Iterator[CuttableProxy]:
    p = CuttableProxy(database_url)
    yield p
    p.close()


@pytest.fixture
def through(proxy: CuttableProxy) -> Iterator[leaseq.Queue]:
    """A queue whose pool goes through the proxy, warmed with one open connection."""
    with leaseq.open_pool(proxy.url, min_size=1, max_size=1, timeout=5) as pool:
        yield leaseq.Queue(pool)


def test_a_claim_whose_answer_was_lost_returns_its_jobs(
    queue: leaseq.Queue, through: leaseq.Queue, proxy: CuttableProxy
) -> None:
    first = queue.enqueue("q", "t").job_id
    queue.enqueue("q", "t")
    proxy.drop_next_reply()
    [job] = through.claim(["q"], "w1")
    assert job.id == first
    assert (job.attempt, job.lease.token) == (1, 1)
    record = queue.get(first)
    assert (record.status, record.attempt_count, record.lease_token) == ("running", 1, 1)
    assert isinstance(through.complete(job.lease), leaseq.Completed)
    assert [a.outcome for a in queue.attempts(first)] == ["succeeded"]


def test_a_completion_whose_answer_was_lost_is_settled_by_its_real_outcome(
    queue: leaseq.Queue, through: leaseq.Queue, proxy: CuttableProxy
) -> None:
    job_id = queue.enqueue("q", "t", idempotency_key="doc-1").job_id
    [job] = through.claim(["q"], "w1")
    proxy.drop_next_reply()
    assert through.complete(job.lease, {"pages": 3}) == leaseq.Completed(job_id, "doc-1", True)
    assert [a.outcome for a in queue.attempts(job_id)] == ["succeeded"]


def test_a_failure_whose_answer_was_lost_is_settled_by_its_real_outcome(
    queue: leaseq.Queue, through: leaseq.Queue, proxy: CuttableProxy
) -> None:
    job_id = queue.enqueue("q", "t", max_attempts=1).job_id
    [job] = through.claim(["q"], "w1")
    proxy.drop_next_reply()
    answer = through.fail(job.lease, "boom")
    assert isinstance(answer, leaseq.Failed)
    assert answer.status == "dead"
    assert [a.outcome for a in queue.attempts(job_id)] == ["failed"]
