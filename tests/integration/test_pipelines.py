"""Pipelines against a real PostgreSQL: dependencies, graphs, unblocking in the parent's
transaction, cascade cancel and its undo, fencing, progress, results by reference. The
producer cases run through the sync and the asyncio face alike (``face``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from test_results import NO_POLL, Face
from test_roles import Roles, as_role
from test_roles import roles as roles

import leaseq
from leaseq import After, Dep, Graph
from support.dbtime import db_now
from support.jobs import take_over
from support.polling import wait_for


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest, database_url: str) -> Iterator[Face]:
    f = Face(request.param, database_url)
    try:
        yield f
    finally:
        f.close()


def status(queue: leaseq.Queue, job_id: int) -> str:
    return str(queue.get(job_id).status)


def run(queue: leaseq.Queue, job_id: int, result: Any = None, *, fail: bool = False) -> None:
    """Claim exactly ``job_id`` (the only claimable job of its type) and settle it."""
    record = queue.get(job_id)
    (job,) = queue.claim([record.queue], "w1", job_types=[record.job_type])
    assert job.id == job_id
    if fail:
        queue.fail(job.lease, error="boom", retryable=False)
    else:
        assert isinstance(queue.complete(job.lease, result), leaseq.Completed)


def ocr_graph(pages: int) -> Graph:
    g = Graph("doc-1")
    parts = [g.add("q", "page", {"page": i}, name=f"page-{i}") for i in range(pages)]
    merge = g.add("q", "merge", name="merge", after=parts)
    g.add("q", "embed", name="embed", after=[merge])
    return g


def test_a_job_after_parents_waits_outside_the_claim_until_the_last_one_succeeds(
    face: Face, queue: leaseq.Queue
) -> None:
    a = face.call("enqueue", "q", "a").job_id
    b = face.call("enqueue", "q", "b").job_id
    child = face.call("enqueue", "q", "c", after=[a, b]).job_id
    assert status(queue, child) == "waiting"
    assert queue.claim(["q"], "w", job_types=["c"]) == []
    assert queue.waiting() == {"q": 1}
    run(queue, a, {"text": "A"})
    assert status(queue, child) == "waiting"
    run(queue, b, {"text": "B"})
    assert status(queue, child) == "pending"
    assert queue.waiting() == {}
    (job,) = queue.claim(["q"], "w", job_types=["c"])
    assert job.id == child
    results = queue.parent_results(child)
    assert [(r.job_id, r.status, r.result) for r in results] == [
        (a, "succeeded", {"text": "A"}),
        (b, "succeeded", {"text": "B"}),
    ]


def test_a_waiter_on_a_job_after_parents_is_woken_when_it_finishes(
    face: Face, queue: leaseq.Queue
) -> None:
    """enqueue(after=..., wait=True) flags the child in the enqueue's transaction, so
    result() on it is woken by its completion (the poll is far longer than the case)."""
    parent = face.call("enqueue", "q", "split").job_id
    child = face.call("enqueue", "q", "merge", after=[parent], wait=True).job_id
    with psycopg.connect(face.url) as c:
        flagged = c.execute("SELECT notify_done FROM leaseq.jobs WHERE id = %s", (child,))
        assert flagged.fetchone() == (True,)
    done = threading.Thread(target=lambda: (run(queue, parent), run(queue, child, "merged")))
    done.start()
    try:
        assert face.call("result", child, timeout=30, poll=3600) == "merged"
    finally:
        done.join()


def test_an_ordering_key_with_after_is_refused_not_dropped(face: Face, queue: leaseq.Queue) -> None:
    parent = face.call("enqueue", "q", "split").job_id
    with pytest.raises(leaseq.InvalidJob, match="invalid ordering_key: cannot be combined with"):
        face.call("enqueue", "q", "merge", after=[parent], ordering_key="order-1")
    with psycopg.connect(face.url) as c:
        assert c.execute("SELECT count(*) FROM leaseq.jobs").fetchone() == (1,)


def keys_of(url: str, ids: list[int]) -> list[str | None]:
    with psycopg.connect(url) as c:
        rows = c.execute(
            "SELECT key FROM leaseq.jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
        ).fetchall()
    return [r[0] for r in rows]


def test_graph_and_after_jobs_carry_their_flow_key(face: Face, queue: leaseq.Queue) -> None:
    g = Graph("keyed")
    page = g.add("q", "page", name="page", key="tenant-A")
    g.add("q", "merge", name="merge", after=[page])  # INHERIT: no spawning job, no key
    made = face.call("enqueue_graph", g)
    later = face.call("enqueue", "q", "late", after=[made["page"]], key="tenant-B").job_id
    assert keys_of(face.url, [made["page"], made["merge"], later]) == [
        "tenant-A",
        None,
        "tenant-B",
    ]


def test_a_fan_out_inherits_its_spawners_flow_key_unless_told_otherwise(
    queue: leaseq.Queue, database_url: str
) -> None:
    split = queue.enqueue("q", "split", key="tenant-A").job_id
    spawned = Graph("fan-out")
    pages = [spawned.add("q", "page", name=f"p{i}") for i in range(2)]
    spawned.add("q", "other", name="other", key="tenant-B")
    spawned.add("q", "free", name="free", key=None)
    spawned.add("q", "merge", name="merge", after=pages)
    (job,) = queue.claim(["q"], "w1", job_types=["split"])
    assert job.id == split
    [done] = queue.complete_many([job.lease], spawns=[spawned])
    assert isinstance(done, leaseq.Completed)
    with psycopg.connect(database_url) as c:
        rows = dict(
            c.execute(
                "SELECT job_type, key FROM leaseq.jobs WHERE id > %s ORDER BY id",
                (split,),
            ).fetchall()
        )
    assert rows == {"page": "tenant-A", "other": "tenant-B", "free": None, "merge": "tenant-A"}


def test_a_parent_given_by_id_must_exist_and_be_able_to_succeed(
    face: Face, queue: leaseq.Queue
) -> None:
    with pytest.raises(leaseq.InvalidGraph, match="parent job 999 does not exist"):
        face.call("enqueue", "q", "c", after=[999])
    dead = face.call("enqueue", "q", "d", max_attempts=1).job_id
    run(queue, dead, fail=True)
    with pytest.raises(leaseq.InvalidGraph, match=f"job {dead} to succeed, but it is dead"):
        face.call("enqueue", "q", "c", after=[dead])
    # Waiting for it to finish in any state is met at once.
    anyway = face.call("enqueue", "q", "c", after=[dead], when=After.FINISHED).job_id
    assert status(queue, anyway) == "pending"
    assert [j.id for j in queue.jobs(queue="q")] == [anyway, dead]


def test_a_graph_is_enqueued_in_one_transaction_with_its_pipeline(
    face: Face, queue: leaseq.Queue
) -> None:
    made = face.call("enqueue_graph", ocr_graph(3))
    assert made.pipeline_id is not None
    assert [status(queue, made[f"page-{i}"]) for i in range(3)] == ["pending"] * 3
    assert status(queue, made["merge"]) == status(queue, made["embed"]) == "waiting"
    progress = face.call("pipeline", made.pipeline_id)
    assert (progress.total, progress.succeeded, progress.finished) == (5, 0, False)
    for i in range(3):
        run(queue, made[f"page-{i}"], {"page": i})
    run(queue, made["merge"])
    run(queue, made["embed"])
    progress = queue.pipeline(made.pipeline_id)
    assert (progress.total, progress.succeeded, progress.unfinished, progress.finished) == (
        5,
        5,
        0,
        True,
    )


def test_cycles_and_unknown_nodes_are_refused_naming_them_and_nothing_is_written(
    face: Face, queue: leaseq.Queue
) -> None:
    g = Graph("loop")
    g.add("q", "a", name="a", after=["c"])
    g.add("q", "b", name="b", after=["a"])
    g.add("q", "c", name="c", after=["b"])
    g.add("q", "free", name="free")
    with pytest.raises(
        leaseq.InvalidGraph, match=r"cycle: (a -> b -> c -> a|b -> c -> a -> b|c -> a -> b -> c)"
    ):
        face.call("enqueue_graph", g)
    unknown = Graph("typo")
    unknown.add("q", "a", name="a", after=["nope"])
    with pytest.raises(leaseq.InvalidGraph, match="node 'a' waits for unknown node 'nope'"):
        face.call("enqueue_graph", unknown)
    itself = Graph("self")
    itself.add("q", "a", name="a", after=["a"])
    with pytest.raises(leaseq.InvalidGraph, match="waits for itself"):
        face.call("enqueue_graph", itself)
    missing = Graph("missing parent")
    missing.add("q", "a", name="a", after=[123456])
    with pytest.raises(leaseq.InvalidGraph, match="parent job 123456 does not exist"):
        face.call("enqueue_graph", missing)
    assert queue.jobs() == []
    assert queue.pipelines() == []


def test_dead_parent_cancels_waiting_descendants_and_its_retry_brings_back_exactly_them(
    face: Face, queue: leaseq.Queue
) -> None:
    g = Graph("doc")
    ok = g.add("q", "ok", name="ok")
    bad = g.add("q", "bad", name="bad", max_attempts=1)
    merge = g.add("q", "merge", name="merge", after=[ok, bad])
    g.add("q", "embed", name="embed", after=[merge])
    g.add("q", "report", name="report", after=[bad], when=After.FINISHED)
    g.add("q", "other", name="other", after=[ok])
    made = face.call("enqueue_graph", g)
    run(queue, made["ok"])
    run(queue, made["bad"], fail=True)
    assert {k: status(queue, made[k]) for k in ("merge", "embed", "report", "other")} == {
        "merge": "cancelled",
        "embed": "cancelled",
        "report": "pending",
        "other": "pending",
    }
    merge_record = queue.get(made["merge"])
    assert merge_record.last_error_code == "PARENT_FAILED"
    assert merge_record.last_error == f"cancelled: parent job {made['bad']} is dead"
    assert queue.links(made["embed"]).cancelled_by == made["bad"]
    progress = queue.pipeline(made.pipeline_id)
    assert (progress.succeeded, progress.dead, progress.cancelled) == (1, 1, 2)

    face.call("retry_dead", made["bad"])
    assert status(queue, made["merge"]) == status(queue, made["embed"]) == "waiting"
    assert status(queue, made["report"]) == "pending"  # already released: not taken back
    assert queue.links(made["merge"]).deps_left == 1
    progress = queue.pipeline(made.pipeline_id)
    assert (progress.succeeded, progress.dead, progress.cancelled) == (1, 0, 0)
    run(queue, made["bad"])
    run(queue, made["merge"])
    assert status(queue, made["embed"]) == "pending"


def test_a_stale_parent_completion_changes_nothing(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    a = queue.enqueue("q", "a").job_id
    b = queue.enqueue("q", "b").job_id
    child = queue.enqueue("q", "c", after=[a, b]).job_id
    (stale,) = queue.claim(["q"], "w1", job_types=["a"])
    fresh = take_over(queue, conn, a)
    assert isinstance(queue.complete(stale.lease, "stale"), leaseq.Fenced)
    assert queue.links(child).deps_left == 2
    assert isinstance(queue.complete(fresh.lease, "fresh"), leaseq.Completed)
    assert isinstance(queue.complete(fresh.lease, "again"), leaseq.Fenced)
    assert queue.links(child).deps_left == 1
    assert status(queue, child) == "waiting"
    run(queue, b)
    assert status(queue, child) == "pending"


def test_the_last_parents_completion_wakes_the_childs_queue_in_its_transaction(
    queue: leaseq.Queue, database_url: str
) -> None:
    a = queue.enqueue("q", "a").job_id
    queue.enqueue("pages", "c", after=[a])
    (job,) = queue.claim(["q"], "w1")
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN leaseq_jobs")
        queue.complete(job.lease)
        woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert woken == ["pages"]


def test_cancelling_a_pipeline_cancels_every_unfinished_job_and_fences_running_ones(
    face: Face, queue: leaseq.Queue
) -> None:
    made = face.call("enqueue_graph", ocr_graph(3))
    run(queue, made["page-0"])
    (running,) = queue.claim(["q"], "w1", job_types=["page"])
    done = queue.cancel_pipeline(made.pipeline_id, reason="user gave up")
    assert (done.cancelled, done.running) == (4, 1)
    assert isinstance(queue.complete(running.lease), leaseq.Fenced)
    assert [a.outcome for a in queue.attempts(running.id)] == ["cancelled"]
    assert status(queue, made["page-0"]) == "succeeded"
    assert {status(queue, made[k]) for k in ("page-1", "page-2", "merge", "embed")} == {"cancelled"}
    progress = queue.pipeline(made.pipeline_id)
    assert (progress.succeeded, progress.cancelled, progress.finished) == (1, 4, True)


def test_a_pipeline_whose_running_job_lost_an_expired_lease_can_be_cancelled(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    then = db_now(conn) - timedelta(minutes=1)
    made = queue.enqueue_graph(ocr_graph(1), now=then)
    (running,) = queue.claim(["q"], "w1", job_types=["page"], lease_seconds=5, now=then)
    assert queue.heartbeat(running.lease).status is leaseq.HeartbeatStatus.LOST  # not reaped
    done = queue.cancel_pipeline(made.pipeline_id, reason="user gave up")
    assert (done.cancelled, done.running) == (3, 1)
    assert [a.outcome for a in queue.attempts(running.id)] == ["fenced"]
    assert status(queue, made["page-0"]) == "cancelled"


def test_cancelling_a_waiting_job_cancels_its_descendants(face: Face, queue: leaseq.Queue) -> None:
    made = face.call("enqueue_graph", ocr_graph(1))
    assert face.call("cancel", made["merge"]).cancelled
    assert status(queue, made["embed"]) == "cancelled"
    assert status(queue, made["page-0"]) == "pending"


def test_parent_results_are_read_in_keyset_pages(queue: leaseq.Queue) -> None:
    g = Graph("wide")
    parts = [g.add("q", "page", name=f"p{i}") for i in range(25)]
    g.add("q", "merge", name="merge", after=parts)
    made = queue.enqueue_graph(g)
    for _ in range(25):
        (job,) = queue.claim(["q"], "w", job_types=["page"])
        queue.complete(job.lease, {"i": job.id})
    assert status(queue, made["merge"]) == "pending"
    page = queue.parent_results(made["merge"], limit=10)
    assert len(page) == 10
    every = list(queue.iter_parent_results(made["merge"], page=7))
    assert [r.job_id for r in every] == sorted(made[f"p{i}"] for i in range(25))
    assert all(r.result == {"i": r.job_id} for r in every)


def test_dependency_modes_per_edge(queue: leaseq.Queue) -> None:
    a = queue.enqueue("q", "a", max_attempts=1).job_id
    b = queue.enqueue("q", "b").job_id
    child = queue.enqueue("q", "c", after=[Dep(a, After.FINISHED), b]).job_id
    run(queue, a, fail=True)
    assert status(queue, child) == "waiting"
    run(queue, b)
    assert status(queue, child) == "pending"


def test_history_and_prune_keep_parents_of_unfinished_children(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    a = queue.enqueue("q", "a").job_id
    b = queue.enqueue("q", "b").job_id
    child = queue.enqueue("q", "c", after=[a, b]).job_id
    run(queue, a, {"kept": True})
    later = db_now(conn) + timedelta(days=30)
    assert queue.prune(older_than=60, now=later) == 0
    assert queue.parent_results(child)[0].result == {"kept": True}
    run(queue, b)
    run(queue, child)
    assert queue.prune(older_than=60, now=later) == 3


def test_waiting_jobs_are_counted_in_metrics_but_never_as_work(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    from leaseq_operator.metrics import OperatorMetrics

    parent = queue.enqueue("ocr", "split").job_id
    for _ in range(3):
        queue.enqueue("pages", "page", after=[parent])
    metrics = OperatorMetrics()
    metrics.watch_queues(queue, leaseq.Workers(conn))
    sample = metrics.registry.get_sample_value
    assert sample("leaseq_queue_jobs", {"queue": "pages", "state": "waiting"}) == 3
    assert sample("leaseq_queue_jobs", {"queue": "pages", "state": "ready"}) == 0
    assert sample("leaseq_queue_jobs", {"queue": "ocr", "state": "waiting"}) == 0
    # The operator scales on claimable work: waiting jobs are none of it.
    assert [(w.job_type, w.ready) for w in queue.work(["pages", "ocr"], window=60)] == [
        ("split", 1)
    ]


def test_a_producer_waits_for_a_pipeline_in_one_call_woken_by_its_finish(
    face: Face, queue: leaseq.Queue
) -> None:
    made = face.call("enqueue_graph", ocr_graph(2))
    for n in range(2):
        run(queue, made[f"page-{n}"], {"text": f"t{n}"})
    listener = face.listener()

    def finish() -> None:  # once the producer waits: only the finish's notification wakes it
        wait_for(lambda: listener.waiters == 1, "the waiter")
        run(queue, made["merge"], {"text": "t0 t1"})
        run(queue, made["embed"], {"vector": [1, 2]})

    finisher = threading.Thread(target=finish)
    finisher.start()
    try:
        outcome = face.woken("wait_pipeline", made.pipeline_id)
    finally:
        finisher.join()
    assert (outcome.pipeline_id, outcome.state, outcome.total) == (
        made.pipeline_id,
        leaseq.PipelineState.SUCCEEDED,
        4,
    )
    assert [s.job_id for s in outcome.sinks] == [made["embed"]]
    assert outcome.result == {"vector": [1, 2]}


def test_a_producer_waits_for_the_pipeline_its_job_spawns_by_that_jobs_id(
    face: Face, queue: leaseq.Queue
) -> None:
    split = face.call("enqueue", "q", "split").job_id
    assert queue.pipeline_of(split) is None  # nothing spawned yet

    def claim(job_type: str) -> leaseq.ClaimedJob:
        # Polled: the waiter flags the jobs it waits for (an UPDATE of their rows), and a
        # claim skips a row another transaction holds for that moment.
        (job,) = wait_for(lambda: queue.claim(["q"], "w1", job_types=[job_type]), job_type)
        return job

    def work() -> None:
        job = claim("split")
        fan_out = Graph("doc")
        pages = [fan_out.add("q", "page", {"page": n}, name=f"p{n}") for n in range(2)]
        fan_out.add("q", "merge", name="merge", after=pages)
        queue.complete_many([job.lease], spawns=[fan_out])
        for _ in range(2):
            page = claim("page")
            queue.complete(page.lease, {"text": f"t{page.payload['page']}"})
        merge = claim("merge")
        texts = sorted(r.result["text"] for r in queue.iter_parent_results(merge.id))
        queue.complete(merge.lease, {"text": " ".join(texts)})

    worker = threading.Thread(target=work)
    worker.start()
    try:
        outcome = face.call("wait_pipeline", job=split, timeout=60, poll=NO_POLL)
    finally:
        worker.join()
    # The split is the met parent of its fan-out's pipeline, not one of its jobs.
    assert outcome.pipeline_id == queue.pipeline_of(split) is not None
    assert (outcome.state, outcome.total, outcome.succeeded) == ("succeeded", 3, 3)
    assert outcome.result == {"text": "t0 t1"}


def test_a_pipelines_outcome_says_how_it_ended_and_whether_it_has_one_result(
    face: Face, queue: leaseq.Queue
) -> None:
    lone = face.call("enqueue", "q", "lone").job_id
    run(queue, lone, "alone")
    outcome = face.call("wait_pipeline", job=lone, timeout=30)
    assert (outcome.pipeline_id, outcome.state, outcome.result) == (None, "succeeded", "alone")

    g = Graph("two ends")
    bad = g.add("q", "bad", name="bad", max_attempts=1)
    g.add("q", "after-bad", name="after-bad", after=[bad])
    g.add("q", "other", name="other")
    made = face.call("enqueue_graph", g)
    with pytest.raises(leaseq.PipelineTimeout, match=f"pipeline {made.pipeline_id} did not"):
        face.call("wait_pipeline", made.pipeline_id, timeout=0)
    run(queue, made["bad"], fail=True)
    run(queue, made["other"], "fine")
    outcome = face.call("wait_pipeline", made.pipeline_id, timeout=30)
    assert (outcome.state, outcome.dead, outcome.cancelled) == ("failed", 1, 1)
    assert [(s.job_id, s.status) for s in outcome.sinks] == sorted(
        [(made["after-bad"], "cancelled"), (made["other"], "succeeded")]
    )
    with pytest.raises(leaseq.JobStateError, match="ends in 2 jobs"):
        _ = outcome.result
    newest = face.call("wait_pipeline", made.pipeline_id, sinks=1)
    assert ([s.job_id for s in newest.sinks], newest.more_sinks) == ([made["after-bad"]], True)
    with pytest.raises(leaseq.InvalidJob, match="not both"):
        face.call("wait_pipeline", made.pipeline_id, job=lone)
    with pytest.raises(leaseq.JobNotFound):
        face.call("wait_pipeline", job=10**9, timeout=1)


def test_pipelines_work_under_component_roles(roles: Roles) -> None:
    """A producer enqueues a graph and a job after one of its jobs; a worker completes the
    parents, reads their results and fans out; the operator shows and cancels."""
    with as_role(roles, "producer") as p, as_role(roles, "worker") as w:
        producer, worker = leaseq.Queue(p), leaseq.Queue(w)
        made = producer.enqueue_graph(ocr_graph(2))
        extra = producer.enqueue("q", "extra", after=[made["embed"]], key="tenant-A").job_id
        for _ in range(2):
            (job,) = worker.claim(["q"], "w", job_types=["page"])
            worker.complete(job.lease, {"text": "t"})
        (merge,) = worker.claim(["q"], "w", job_types=["merge"])
        assert [r.result for r in worker.parent_results(merge.id)] == [{"text": "t"}] * 2
        more = Graph("late")
        more.add("q", "late", name="late")
        more.add("q", "keyed", name="keyed", key="tenant-B")  # the roles may write a key
        (done,) = worker.complete_many([merge.lease], [None], spawns=[more])
        assert isinstance(done, leaseq.Completed)
        (late,) = worker.claim(["q"], "w", job_types=["late"])
        assert worker.links(late.id).pipeline_id == made.pipeline_id
        assert producer.get(extra).status == "waiting"
    with as_role(roles, "operator") as o:
        operator = leaseq.Queue(o)
        assert operator.pipeline(made.pipeline_id).total == 7
        assert (
            operator.cancel_pipeline(made.pipeline_id).cancelled == 4
        )  # embed, extra, keyed, and late (running: fenced)


def test_a_producer_role_waits_for_the_fan_out_a_worker_role_spawned(roles: Roles) -> None:
    """The fan-out (and the pipeline it creates) belongs to the split's producer: that
    producer's role sees it and waits for it; another producer's does not."""
    with as_role(roles, "producer") as p, as_role(roles, "worker") as w:
        producer, worker = leaseq.Queue(p), leaseq.Queue(w)
        split = producer.enqueue("q", "split", key="tenant-A").job_id
        (job,) = worker.claim(["q"], "w", job_types=["split"])
        fan_out = Graph("doc")
        pages = [fan_out.add("q", "page", name=f"p{n}") for n in range(2)]
        fan_out.add("q", "merge", name="merge", after=pages)
        worker.complete_many([job.lease], spawns=[fan_out])
        pipeline_id = producer.pipeline_of(split)
        assert pipeline_id is not None
        assert [j["job_type"] for j in producer.pipeline_jobs(pipeline_id)] == [
            "page",
            "page",
            "merge",
        ]
        with psycopg.connect(roles.urls["producer"]) as own:
            owners = own.execute(
                "SELECT DISTINCT j.enqueued_by, p.created_by FROM leaseq.jobs j"
                " JOIN leaseq.pipelines p ON p.id = j.pipeline_id WHERE p.id = %s",
                (pipeline_id,),
            ).fetchall()
        assert owners == [(roles.names["producer"], roles.names["producer"])]
        with as_role(roles, "producer2") as p2, pytest.raises(leaseq.JobStateError):
            leaseq.Queue(p2).wait_pipeline(pipeline_id, timeout=0)
        for _ in range(2):
            (page,) = worker.claim(["q"], "w", job_types=["page"])
            worker.complete(page.lease, {"text": "t"})
        (merge,) = worker.claim(["q"], "w", job_types=["merge"])
        worker.complete(merge.lease, {"text": "t t"})
        outcome = producer.wait_pipeline(job=split, timeout=30)
        assert (outcome.pipeline_id, outcome.result) == (pipeline_id, {"text": "t t"})
        with psycopg.connect(roles.urls["producer"]) as own:  # the guide's SQL, as written
            assert own.execute(PIPELINE_OF_SQL, (split,)).fetchone() == (pipeline_id,)
            assert own.execute(
                "SELECT total, succeeded, dead, cancelled, finished_at IS NOT NULL"
                " FROM leaseq.pipelines WHERE id = %s",
                (pipeline_id,),
            ).fetchone() == (3, 3, 0, 0, True)
            assert own.execute(
                "SELECT id, status, result FROM leaseq.jobs"
                " WHERE pipeline_id = %s AND NOT has_children",
                (pipeline_id,),
            ).fetchall() == [(merge.id, "succeeded", {"text": "t t"})]


def test_a_producer_role_waits_for_a_pipeline_in_sql_with_one_function(roles: Roles) -> None:
    """The guide's one-call wait from any language: LISTEN leaseq_done, read
    leaseq.pipeline_outcome, and while it runs wait for the pipeline's notification (bounded)
    while a worker finishes it in another thread; then read it again."""
    with as_role(roles, "producer") as p, as_role(roles, "worker") as w:
        producer, worker = leaseq.Queue(p), leaseq.Queue(w)
        split = producer.enqueue("q", "split").job_id
        (job,) = worker.claim(["q"], "w", job_types=["split"])
        fan_out = Graph("doc")
        pages = [fan_out.add("q", "page", name=f"p{n}") for n in range(2)]
        fan_out.add("q", "merge", name="merge", after=pages)
        worker.complete_many([job.lease], spawns=[fan_out])
        pipeline_id = producer.pipeline_of(split)
        with psycopg.connect(roles.urls["producer"], autocommit=True) as own:
            own.execute("LISTEN leaseq_done")
            outcome = own.execute(OUTCOME_SQL, (pipeline_id,)).fetchone()
            assert outcome == ("running", 3, 0, 0, 0, None, None, None)

            def finish() -> None:
                for _ in range(2):
                    (page,) = worker.claim(["q"], "w", job_types=["page"])
                    worker.complete(page.lease, {"text": "t"})
                (merge,) = worker.claim(["q"], "w", job_types=["merge"])
                worker.complete(merge.lease, {"text": "t t"})

            finishing = threading.Thread(target=finish)
            finishing.start()
            heard = [
                n.payload
                for n in own.notifies(timeout=60, stop_after=1)
                if n.payload == f"pipeline:{pipeline_id}"
            ]
            finishing.join(timeout=60)
            assert heard == [f"pipeline:{pipeline_id}"]
            assert own.execute(OUTCOME_SQL, (pipeline_id,)).fetchone() == (
                "succeeded",
                3,
                3,
                0,
                0,
                1,
                "succeeded",
                {"text": "t t"},
            )
        # Several sinks: no one result, their count; another producer sees no row.
        g = Graph("two ends")
        g.add("q", "a", name="a")
        g.add("q", "b", name="b")
        made = producer.enqueue_graph(g)
        producer.cancel_pipeline(made.pipeline_id or 0)
        with psycopg.connect(roles.urls["producer"]) as own:
            assert own.execute(OUTCOME_SQL, (made.pipeline_id,)).fetchone() == (
                "cancelled",
                2,
                0,
                0,
                2,
                2,
                None,
                None,
            )
        with psycopg.connect(roles.urls["producer2"]) as other:
            assert other.execute(OUTCOME_SQL, (pipeline_id,)).fetchall() == []


#: docs/guides/pipelines.md: a pipeline's outcome in one call.
OUTCOME_SQL = (
    "SELECT state, total, succeeded, dead, cancelled, sinks, sink_status, result"
    " FROM leaseq.pipeline_outcome(%s)"
)


#: docs/guides/pipelines.md: a root job's pipeline, from SQL.
PIPELINE_OF_SQL = (
    "SELECT coalesce(j.pipeline_id, (SELECT c.pipeline_id FROM leaseq.job_deps d JOIN"
    " leaseq.jobs c ON c.id = d.child_id WHERE d.parent_id = j.id AND c.pipeline_id IS NOT NULL"
    " ORDER BY d.child_id LIMIT 1)) FROM leaseq.jobs j WHERE j.id = %s"
)


def test_the_history_mover_keeps_a_pipeline_until_it_finishes(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    from leaseq.core.history import History

    history = History(conn)
    made = queue.enqueue_graph(ocr_graph(2))
    plain = queue.enqueue("q", "plain").job_id
    run(queue, plain)
    run(queue, made["page-0"], {"text": "kept"})
    run(queue, made["page-1"], {"text": "kept"})
    soon = db_now(conn) + timedelta(seconds=10)
    history.ensure_partitions(ahead=2, timeout=10, now=soon)
    assert history.move(hot_retention=1, batch=100, timeout=10, now=soon).moved == 1  # plain
    assert [r.result for r in queue.parent_results(made["merge"])] == [{"text": "kept"}] * 2
    run(queue, made["merge"])
    run(queue, made["embed"])
    assert history.move(hot_retention=1, batch=100, timeout=10, now=soon).moved == 4
    with pytest.raises(leaseq.JobNotFound):
        queue.get(made["merge"])


def test_a_completion_rolled_back_to_break_a_deadlock_runs_again(
    pool: leaseq.Pool, database_url: str
) -> None:
    """Completions that unblock children lock the children's rows in the batch's order; when
    PostgreSQL aborts one to break a deadlock, nothing of it was applied and it runs again."""
    queue = leaseq.Queue(pool)
    p1, p2 = queue.enqueue("q", "a").job_id, queue.enqueue("q", "a").job_id
    m1 = queue.enqueue("q", "m", after=[p1]).job_id
    m2 = queue.enqueue("q", "m", after=[p2]).job_id
    jobs = queue.claim(["q"], "w", limit=2, job_types=["a"])
    answers: list[Any] = []
    with psycopg.connect(database_url) as other:
        other.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", (m2,))
        thread = threading.Thread(
            target=lambda: answers.extend(queue.complete_many([j.lease for j in jobs]))
        )
        thread.start()
        # The completion holds m1's row and waits for m2's; now wait for m1's the other way.
        wait_for(lambda: _waiting_for_lock(database_url) >= 1, "the completion to wait")
        try:
            other.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", (m1,))
            other.commit()
        except psycopg.errors.DeadlockDetected:
            other.rollback()  # PostgreSQL chose this session: the completion goes on
        thread.join(30)
    assert [type(a) for a in answers] == [leaseq.Completed, leaseq.Completed]
    assert status(queue, m1) == status(queue, m2) == "pending"
    assert queue.links(m1).deps_left == queue.links(m2).deps_left == 0


def _waiting_for_lock(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_parent_reaped_to_dead_cancels_its_child_and_a_retry_brings_it_back(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    parent = queue.enqueue("q", "a", max_attempts=1).job_id
    child = queue.enqueue("q", "c", after=[parent]).job_id
    queue.claim(["q"], "w1", job_types=["a"], lease_seconds=1)
    later = db_now(conn) + timedelta(seconds=5)
    assert [(r.job_id, r.status) for r in queue.reap(now=later)] == [(parent, "dead")]
    assert status(queue, child) == "cancelled"
    assert queue.links(child).cancelled_by == parent
    queue.retry_dead(parent)
    assert status(queue, child) == "waiting"
    run(queue, parent)
    assert status(queue, child) == "pending"


def test_the_cli_enqueues_after_jobs_and_shows_pipelines_and_links(
    queue: leaseq.Queue, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from leaseq.cli.main import main

    def cli(*argv: str) -> str:
        capsys.readouterr()
        assert main([*argv, "--database-url", database_url]) == 0
        return capsys.readouterr().out

    made = queue.enqueue_graph(ocr_graph(2))
    assert cli("enqueue", "q", "extra", "--after", str(made["merge"])) == "enqueued job 5\n"
    shown = cli("jobs", "show", str(made["merge"]))
    assert f"pipeline      {made.pipeline_id}" in shown
    assert "PARENT" in shown and "CHILD" in shown and "extra" in shown
    assert "waiting for parent jobs (not claimable yet): q 3" in cli("status")
    progress = cli("pipelines", "show", str(made.pipeline_id))
    assert "jobs        5" in progress and "running" in progress
    assert str(made.pipeline_id) in cli("pipelines", "list", "--unfinished")
    listed = json.loads(cli("pipelines", "show", str(made.pipeline_id), "--json"))
    assert [j["status"] for j in listed["jobs"]] == ["pending"] * 2 + ["waiting"] * 3
    assert "5 unfinished job(s) cancelled" in cli("pipelines", "cancel", str(made.pipeline_id))
