"""A tenant's pipeline under its limit, with real workers: the fan-out a handler spawns
inherits the handler's flow key, so the key's limit holds across the pages (measured from
the attempt history), and the producer gets the merge's result from one call. A permanent
error costs one attempt and stops the pipeline there."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import leaseq
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

TENANT = "tenant-A"
PAGES = 6


def most_at_once(spans: list[tuple[object, object]]) -> int:
    """The most spans open at one moment (an end before a start at the same instant: the
    unit a finished attempt frees is taken by a later claim)."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_a_tenants_fan_out_stays_under_its_limit_and_the_producer_gets_the_merge(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    leaseq.FlowControl(conn).set_limit("q", TENANT, max_running=2)
    # 8 slots in all: without the tenant's limit all 6 pages run at once.
    for name in ("w-a", "w-b"):
        spawn_worker(name, concurrency=4, lease=5)
    split = queue.enqueue("q", "doc.split", {"pages": PAGES, "seconds": 0.4}, key=TENANT).job_id

    outcome = queue.wait_pipeline(job=split, timeout=120)

    texts = " / ".join(f"text of page {n}" for n in range(PAGES))
    assert outcome.result == {"pages": PAGES, "text": texts}
    assert (outcome.state, outcome.total, outcome.succeeded) == ("succeeded", PAGES + 1, 7)
    assert outcome.pipeline_id == queue.pipeline_of(split)
    rows = conn.execute(
        "SELECT j.job_type, j.key, a.started_at, a.ended_at FROM leaseq.jobs j"
        " JOIN leaseq.job_attempts a ON a.job_id = j.id WHERE j.pipeline_id = %s",
        (outcome.pipeline_id,),
    ).fetchall()
    pages = [(r[2], r[3]) for r in rows if r[0] == "doc.page"]
    assert len(pages) == PAGES  # one attempt each
    assert most_at_once(pages) <= 2
    assert {(r[0], r[1]) for r in rows} == {("doc.page", TENANT), ("doc.merge", TENANT)}


def test_a_permanent_error_makes_one_attempt_and_the_pipeline_spawns_nothing_more(
    queue: leaseq.Queue, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    spawn_worker("w-a", concurrency=4, lease=5)
    # A page that can never work: dead after one attempt, and the merge never runs.
    split = queue.enqueue(
        "q", "doc.split", {"pages": 4, "bad_page": 2}, key=TENANT, max_attempts=5
    ).job_id
    outcome = queue.wait_pipeline(job=split, timeout=120)
    assert (outcome.state, outcome.total, outcome.dead, outcome.cancelled) == ("failed", 5, 1, 1)
    jobs = queue.pipeline_jobs(outcome.pipeline_id or 0)
    [bad] = [j for j in jobs if j["status"] == "dead"]
    assert [a.outcome for a in queue.attempts(bad["job_id"])] == ["failed"]
    assert queue.get(bad["job_id"]).payload["page"] == 2
    [merge] = outcome.sinks
    assert (merge.status, merge.last_error_code) == ("cancelled", "PARENT_FAILED")
    with pytest.raises(leaseq.JobCancelled):
        _ = outcome.result

    # The splitter itself fails permanently after spawning: one attempt, no fan-out written.
    split = queue.enqueue(
        "q", "doc.split", {"pages": 4, "fail_after_spawn": True}, key=TENANT, max_attempts=5
    ).job_id
    alone = queue.wait_pipeline(job=split, timeout=120)
    assert (alone.pipeline_id, alone.state) == (None, "failed")
    assert [a.outcome for a in queue.attempts(split)] == ["failed"]
    assert queue.pipeline_of(split) is None
    with pytest.raises(leaseq.JobDead, match="schema version is not supported"):
        _ = alone.result
    assert len(queue.pipeline_jobs(outcome.pipeline_id or 0)) == 5  # and nothing joined it
