"""Cancelling a job cancels its unfinished descendants (spawned by it, or after it, at any
depth), and cancelling a pipeline cancels all its unfinished jobs: pending, sleeping (pending
until a later time), waiting and running alike, in one statement, each with its reason. Real
PostgreSQL; the producer calls run through the sync and the asyncio face alike (``face``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from test_results import Face
from test_roles import Roles, as_role
from test_roles import roles as roles

import leaseq
from leaseq import Graph
from leaseq.cli.main import main
from support.polling import wait_for

REASON = "user gave up"


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest, database_url: str) -> Iterator[Face]:
    f = Face(request.param, database_url)
    try:
        yield f
    finally:
        f.close()


def fan_out(queue: leaseq.Queue) -> tuple[int, dict[str, int], leaseq.ClaimedJob]:
    """A root job that spawned, on completion: ``run`` (claimed: running), ``idle`` (pending),
    ``nap`` (pending until an hour later, as a sleeping job is), ``after`` (waiting on
    ``run``), and a grandchild ``deep`` spawned by ``idle``'s sibling ``mid`` (succeeded)."""
    root = queue.enqueue("q", "root").job_id
    (job,) = queue.claim(["q"], "w0", job_types=["root"])
    g = Graph("fan-out")
    run = g.add("q", "run", name="run")
    g.add("q", "idle", name="idle")
    g.add("q", "nap", name="nap", delay=3600)
    g.add("q", "after", name="after", after=[run])
    g.add("q", "mid", name="mid")
    (done,) = queue.complete_many([job.lease], spawns=[g])
    assert isinstance(done, leaseq.Completed)
    (mid,) = queue.claim(["q"], "w1", job_types=["mid"])
    deeper = Graph("deeper")
    deeper.add("q", "deep", name="deep")
    assert isinstance(queue.complete_many([mid.lease], spawns=[deeper])[0], leaseq.Completed)
    pipeline_id = queue.links(mid.id, limit=0).pipeline_id
    assert pipeline_id is not None
    ids = {r["job_type"]: r["job_id"] for r in queue.pipeline_jobs(pipeline_id)}
    (running,) = queue.claim(["q"], "w2", job_types=["run"])
    return root, ids, running


def test_cancelling_a_finished_root_cancels_every_unfinished_descendant(
    face: Face, queue: leaseq.Queue
) -> None:
    root, ids, running = fan_out(queue)
    before = {k: queue.get(i).status for k, i in ids.items()}
    assert before == {
        "run": "running",
        "idle": "pending",
        "nap": "pending",
        "after": "waiting",
        "mid": "succeeded",
        "deep": "pending",
    }
    done = face.call("cancel", root, reason=REASON)
    assert done == leaseq.Cancelled(root, False, "succeeded", descendants=5, running=1)
    assert done.pending == 4
    for kind in ("run", "idle", "nap", "after", "deep"):
        record = queue.get(ids[kind])
        assert record.status == "cancelled", kind
        assert record.last_error == f"cancelled with ancestor job {root}: {REASON}"
        assert record.last_error_code == "ANCESTOR_CANCELLED"
    assert queue.get(ids["mid"]).status == "succeeded"
    # The running one's attempt says why; its late completion is refused and spawns nothing.
    [attempt] = queue.attempts(ids["run"])
    assert (attempt.outcome, attempt.error) == (
        "cancelled",
        f"cancelled with ancestor job {root}: {REASON}",
    )
    late = Graph("late")
    late.add("q", "late", name="late")
    answer = queue.complete_many([running.lease], spawns=[late])[0]
    assert answer == leaseq.Fenced(ids["run"], "complete", "cancelled")
    assert queue.get(ids["run"]).result is None
    assert queue.links(ids["run"], limit=10).children[0].job_id == ids["after"]
    progress = queue.pipeline(queue.links(ids["run"], limit=0).pipeline_id or 0)
    assert (progress.total, progress.succeeded, progress.cancelled) == (6, 1, 5)
    assert progress.finished
    # Nothing is left to cancel: a second call changes nothing.
    assert face.call("cancel", root) == leaseq.Cancelled(root, False, "succeeded")


def test_cancelling_a_middle_job_spares_its_ancestors_and_siblings(queue: leaseq.Queue) -> None:
    root, ids, _ = fan_out(queue)
    done = queue.cancel(ids["run"], reason=REASON)
    assert done == leaseq.Cancelled(ids["run"], True, "running", descendants=1, running=1)
    assert queue.get(ids["run"]).last_error == REASON
    assert queue.get(ids["run"]).last_error_code == "CANCELLED"
    assert queue.get(ids["after"]).last_error == (
        f"cancelled with ancestor job {ids['run']}: {REASON}"
    )
    assert {queue.get(ids[k]).status for k in ("idle", "nap", "deep")} == {"pending"}
    assert queue.get(root).status == "succeeded"


def test_cancelling_a_pipeline_says_so_on_each_job(face: Face, queue: leaseq.Queue) -> None:
    root, ids, running = fan_out(queue)
    pipeline_id = queue.links(root, limit=0).pipeline_id
    assert pipeline_id is None  # the spawns made a pipeline of their own
    pipeline_id = queue.links(ids["run"], limit=0).pipeline_id
    assert pipeline_id is not None
    done = face.call("cancel_pipeline", pipeline_id, reason=REASON)
    assert (done.cancelled, done.pending, done.running) == (5, 4, 1)
    for kind in ("run", "idle", "nap", "after", "deep"):
        record = queue.get(ids[kind])
        assert (record.status, record.last_error, record.last_error_code) == (
            "cancelled",
            f"cancelled with pipeline {pipeline_id}: {REASON}",
            "PIPELINE_CANCELLED",
        )
    assert queue.heartbeat(running.lease).job_status == "cancelled"


def test_a_retry_of_a_dead_ancestor_does_not_bring_back_what_a_cancel_ended(
    queue: leaseq.Queue,
) -> None:
    g = Graph("chain")
    first = g.add("q", "first", name="first")
    g.add("q", "second", name="second", after=[first])
    made = queue.enqueue_graph(g)
    (job,) = queue.claim(["q"], "w", job_types=["first"])
    queue.fail(job.lease, error="boom", retryable=False)
    assert queue.get(made["second"]).last_error_code == "PARENT_FAILED"
    queue.retry_dead(made["first"])
    assert queue.get(made["second"]).status == "waiting"  # the cascade's undo
    queue.cancel(made["first"], reason=REASON)
    assert queue.get(made["second"]).last_error_code == "ANCESTOR_CANCELLED"
    # Cancelled is final: no retry of it, so nothing revives the descendant.
    with pytest.raises(leaseq.JobStateError):
        queue.retry_dead(made["first"])
    assert queue.get(made["second"]).status == "cancelled"


def test_ten_thousand_descendants_are_cancelled_in_one_call(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """A fan-out of 10,000 jobs under one root and a merge after all of them: one statement
    walks the edges (each job once) and cancels them all."""
    root = queue.enqueue("q", "root").job_id
    (job,) = queue.claim(["q"], "w0", job_types=["root"])
    g = Graph("wide")
    pages = [g.add("q", "page", {"i": i}, name=f"p{i}") for i in range(10_000)]
    g.add("q", "merge", name="merge", after=pages)
    assert isinstance(queue.complete_many([job.lease], spawns=[g])[0], leaseq.Completed)
    claimed = queue.claim(["q"], "w1", job_types=["page"], limit=3)
    done = queue.cancel(root, reason=REASON)
    assert (done.descendants, done.running, done.pending) == (10_001, 3, 9_998)
    row = conn.execute(
        "SELECT count(*) FROM leaseq.jobs WHERE status <> 'cancelled' AND id <> %s", (root,)
    ).fetchone()
    assert row == (0,)
    assert all(isinstance(queue.complete(c.lease), leaseq.Fenced) for c in claimed)


@pytest.mark.parametrize("when", list(leaseq.After))
def test_a_cancel_writes_its_pipeline_and_merge_once_however_many_jobs_it_ends(
    database_url: str, when: leaseq.After
) -> None:
    """A pipeline of 2,000 pages and a merge after them all (met when each page succeeded, or
    finished), cancelled in one transaction: the pipeline's row is written once (its count
    at commit), not once per job, and the merge once (by the cancel), not once per page;
    each rewrite of one row in a transaction walks every version the earlier ones left, so
    per-job writes made a large cancel quadratic."""
    with leaseq.connect(database_url, action="test") as conn:
        queue = leaseq.Queue(conn)
        g = Graph("wide")
        pages = [g.add("q", "page", {"i": i}, name=f"p{i}") for i in range(2000)]
        g.add("q", "merge", name="merge", after=pages, when=when)
        made = queue.enqueue_graph(g)
        conn.execute("BEGIN")
        done = queue.cancel_pipeline(made.pipeline_id, reason=REASON)
        conn.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the count due at commit, now
        writes = dict(
            conn.execute(
                "SELECT relname, n_tup_upd FROM pg_stat_xact_user_tables"
                " WHERE schemaname = 'leaseq' AND relname IN ('jobs', 'pipelines')"
            ).fetchall()
        )
        conn.execute("COMMIT")
    assert done.cancelled == 2001
    assert writes == {"jobs": 2001, "pipelines": 1}
    with leaseq.connect(database_url, action="test") as conn:
        progress = leaseq.Queue(conn).pipeline(made.pipeline_id)
    assert (progress.total, progress.cancelled, progress.finished_at is not None) == (
        2001,
        2001,
        True,
    )


def test_a_completion_that_commits_while_the_cancel_waits_loses_its_spawns(
    queue: leaseq.Queue, database_url: str, conn: leaseq.core.db.Conn
) -> None:
    """The root completes (spawning a child) in a transaction that holds the root's row while
    the cancel waits for it: the cancel's first pass could not see the child, its next pass
    (a new snapshot) cancels it."""
    root = queue.enqueue("q", "root").job_id
    (job,) = queue.claim(["q"], "w0", job_types=["root"])
    g = Graph("late spawn")
    g.add("q", "child", name="child")
    answers: list[leaseq.Cancelled] = []
    with leaseq.connect(database_url, action="test") as completing:
        completing.execute("BEGIN")
        done = leaseq.Queue(completing).complete_many([job.lease], spawns=[g])[0]
        assert isinstance(done, leaseq.Completed)  # written, not yet committed

        def cancel() -> None:
            with leaseq.connect(database_url, action="test") as own:
                answers.append(leaseq.Queue(own).cancel(root, reason=REASON))

        cancelling = threading.Thread(target=cancel)
        cancelling.start()
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE '%%cancel_as_caller%%'"
                ).fetchone()
                == (1,)
            ),
            "the cancel to wait for the root's row",
        )
        completing.execute("COMMIT")
        cancelling.join(timeout=60)
    assert not cancelling.is_alive()
    [child] = queue.links(root, limit=10).children
    assert answers == [leaseq.Cancelled(root, False, "succeeded", descendants=1)]
    assert queue.get(child.job_id).status == "cancelled"


def test_the_cli_says_how_many_were_cancelled_pending_and_running(
    queue: leaseq.Queue, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root, ids, _ = fan_out(queue)
    db = ("--database-url", database_url)
    assert main(["cancel", str(ids["run"]), "--reason", REASON, *db]) == 0
    assert capsys.readouterr().out == (
        f"2 job(s) cancelled: job {ids['run']} (was running) and 1 unfinished"
        " descendant(s); 1 had not started, 1 were running (their workers are now fenced)\n"
    )
    assert main(["cancel", str(root), *db]) == 0
    assert capsys.readouterr().out == (
        f"job {root} was already succeeded; its 3 unfinished descendant(s) cancelled;"
        " 3 had not started, 0 were running\n"
    )
    assert main(["cancel", str(root), *db]) == 1
    assert "nothing changed" in capsys.readouterr().out
    # A job alone: its counts are its own, not its (no) descendants'.
    alone = queue.enqueue("q", "t").job_id
    assert main(["cancel", str(alone), *db]) == 0
    assert capsys.readouterr().out == (
        f"1 job(s) cancelled: job {alone} (was pending) and 0 unfinished descendant(s);"
        " 1 had not started, 0 were running\n"
    )
    pipeline_id = queue.links(ids["run"], limit=0).pipeline_id
    assert main(["pipelines", "cancel", str(pipeline_id), *db]) == 0
    assert capsys.readouterr().out == (
        f"pipeline {pipeline_id}: 0 unfinished job(s) cancelled;"
        " 0 had not started, 0 were running\n"
    )


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_producer_cancels_its_own_root_with_what_workers_spawned_for_it(
    roles: Roles, kind: str
) -> None:
    """A producer's role cancels its own job and what a worker's fan-out spawned under it (the
    spawns are its own: a fan-out is written under the spawning job's owner), and its own
    pipelines; the same calls as the operator's (Queue.cancel, cancel_pipeline)."""
    face = Face(kind, roles.urls["producer"])
    try:
        with as_role(roles, "worker") as w:
            worker = leaseq.Queue(w)
            root = face.call("enqueue", "q", "root").job_id
            (job,) = worker.claim(["q"], "w", job_types=["root"])
            g = Graph("spawned")
            g.add("q", "page", name="page")
            g.add("q", "other", name="other")
            assert isinstance(worker.complete_many([job.lease], spawns=[g])[0], leaseq.Completed)
            (page,) = worker.claim(["q"], "w", job_types=["page"])
            done = face.call("cancel", page.id, reason=REASON)
            assert done == leaseq.Cancelled(page.id, True, "running", running=1)
            assert worker.get(page.id).last_error == REASON
            assert worker.heartbeat(page.lease).job_status == "cancelled"
            pipeline_id = face.call("pipeline_of", page.id)
            done = face.call("cancel_pipeline", pipeline_id, reason=REASON)
            assert (done.cancelled, done.pending, done.running) == (1, 1, 0)
            assert face.call("cancel", root) == leaseq.Cancelled(root, False, "succeeded")
            with pytest.raises(leaseq.JobNotFound):
                face.call("cancel", 10**12)
            with pytest.raises(leaseq.InvalidJob, match="reason"):
                face.call("cancel", root, reason="x" * 2001)
    finally:
        face.close()


def test_a_reason_over_2000_characters_is_refused_whoever_cancels(
    face: Face, queue: leaseq.Queue
) -> None:
    """The reason is written on every job a cancel reaches: one over 2,000 characters is
    refused under the owner's role as under a producer's, and nothing is cancelled."""
    job = queue.enqueue("q", "t").job_id
    g = Graph("two")
    g.add("q", "a", name="a")
    g.add("q", "b", name="b", after=["a"])
    pipeline_id = queue.enqueue_graph(g).pipeline_id
    with pytest.raises(leaseq.InvalidJob, match=r"reason.*2001 characters"):
        face.call("cancel", job, reason="x" * 2001)
    with pytest.raises(leaseq.InvalidJob, match=r"reason.*2001 characters"):
        face.call("cancel_pipeline", pipeline_id, reason="x" * 2001)
    assert queue.get(job).status == "pending"
    assert queue.pipeline(pipeline_id).cancelled == 0
    assert face.call("cancel", job, reason="x" * 2000).cancelled


def test_a_producers_cancel_leaves_descendants_of_another_owner(
    database_url: str, roles: Roles
) -> None:
    """A job of another owner under a producer's job (edges only the owner of leaseq's
    tables writes across owners: a fan-out waits only for its own producer's jobs) is
    neither cancelled nor walked through: that owner, or the operator, cancels it."""
    with as_role(roles, "producer") as a, as_role(roles, "producer2") as b:
        mine, deep = (leaseq.Queue(a).enqueue("q", t).job_id for t in ("mine", "deep"))
        theirs = leaseq.Queue(b).enqueue("q", "theirs").job_id
        with leaseq.connect(database_url, action="test") as owner:
            owner.execute(
                "INSERT INTO leaseq.job_deps (parent_id, child_id, after, counted)"
                " VALUES (%s, %s, 'succeeded', false), (%s, %s, 'succeeded', false)",
                (mine, theirs, theirs, deep),
            )
        done = leaseq.Queue(a).cancel(mine, reason=REASON)
        assert done == leaseq.Cancelled(mine, True, "pending")
        assert leaseq.Queue(b).get(theirs).status == "pending"
        assert leaseq.Queue(a).get(deep).status == "pending"
        done = leaseq.Queue(b).cancel(theirs)
        assert done == leaseq.Cancelled(theirs, True, "pending")
        assert leaseq.Queue(a).get(deep).status == "pending"


def test_the_operator_cancels_a_producers_root_with_what_workers_spawned(roles: Roles) -> None:
    with as_role(roles, "producer") as p, as_role(roles, "worker") as w:
        producer, worker = leaseq.Queue(p), leaseq.Queue(w)
        root = producer.enqueue("q", "root").job_id
        (job,) = worker.claim(["q"], "w", job_types=["root"])
        g = Graph("spawned")
        g.add("q", "page", name="page")
        assert isinstance(worker.complete_many([job.lease], spawns=[g])[0], leaseq.Completed)
        (page,) = worker.claim(["q"], "w", job_types=["page"])
        # Another producer's cancel reaches nothing of it.
        with as_role(roles, "producer2") as p2, pytest.raises(leaseq.JobNotFound):
            leaseq.Queue(p2).cancel(root, reason=REASON)
        assert worker.get(page.id).status == "running"
    with as_role(roles, "operator") as o:
        done = leaseq.Queue(o).cancel(root, reason=REASON)
        assert done == leaseq.Cancelled(root, False, "succeeded", descendants=1, running=1)
        assert leaseq.Queue(o).get(page.id).last_error_code == "ANCESTOR_CANCELLED"
