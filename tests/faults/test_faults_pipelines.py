"""The fan-in's aggregating job runs exactly once whatever boundary a worker is SIGKILLed at:
real workers, real SIGKILL, a real PostgreSQL.

Boundaries are made exact with row locks, never sleeps: the test locks the row the next
completion must update (the merge job, whose unmet-parent count a page's completion
decrements, or the splitting job itself for the fan-out) and waits until a worker's backend is
blocked on it. "before commit": SIGKILL the worker and terminate its backend, so the
completion's transaction rolls back (the lease expires, the reaper returns the job, another
worker runs it again). "after commit": let the completion commit, then SIGKILL the worker at
once.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

import leaseq
from support.polling import wait_for


def _blocked_by(url: str, locker: psycopg.Connection[Any]) -> list[int]:
    """Backends waiting for a lock ``locker`` holds, running a completion: job_complete (a
    call of leaseq.lease_complete), or the first statement of a fan-out's completion
    transaction (a call of leaseq.lease_spawn_lock), which marks the spawner a parent."""
    pid = locker.info.backend_pid
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
            " AND (position('leaseq.lease_complete(' in query) > 0"
            " OR position('leaseq.lease_spawn_lock(' in query) > 0)",
            (pid,),
        ).fetchall()
    return [r[0] for r in rows]


def _ids(conn: leaseq.core.db.Conn, job_type: str) -> list[int]:
    rows = conn.execute(
        "SELECT id FROM leaseq.jobs WHERE job_type = %s ORDER BY id", (job_type,)
    ).fetchall()
    return [r[0] for r in rows]


def _status(conn: leaseq.core.db.Conn, job_id: int) -> str:
    row = conn.execute("SELECT status::text FROM leaseq.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


PAGES = 3
CASES = [("page", i, when) for i in range(PAGES) for when in ("before", "after")] + [
    ("split", None, "before"),
    ("split", None, "after"),
]


@pytest.mark.parametrize(
    ("where", "page", "when"),
    CASES,
    ids=[f"{w}{'' if p is None else p}-{c}-commit" for w, p, c in CASES],
)
def test_the_aggregating_job_runs_exactly_once_under_sigkill_at_every_boundary(
    where: str,
    page: int | None,
    when: str,
    database_url: str,
    conn: leaseq.core.db.Conn,
    queue: leaseq.Queue,
    spawn_on: Any,
    reaper_on: Any,
    tmp_path: Path,
) -> None:
    payload: dict[str, Any] = {"dir": str(tmp_path), "pages": PAGES}
    if where == "split":
        payload["hold_split"] = True
    else:
        payload["hold_page"] = page
    split = queue.enqueue("q", "split", payload).job_id
    victim = spawn_on(database_url, "victim", concurrency=1, lease=2.0, heartbeat=0.5)
    if where == "split":
        wait_for(lambda: _status(conn, split) == "running", "the split to run")
        target = split
    else:
        pages = wait_for(lambda: len(ids := _ids(conn, "page")) == PAGES and ids, "the fan-out")
        target = pages[page]
        wait_for(lambda: _status(conn, target) == "running", f"page {page} to run")
    merge_ids = _ids(conn, "merge")
    locked_row = target if where == "split" else merge_ids[0]

    with psycopg.connect(database_url) as locker:
        if when == "before":
            locker.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s FOR UPDATE", (locked_row,))
            (tmp_path / "go").write_text("")
            blocked = wait_for(lambda: _blocked_by(database_url, locker), "the completion to block")
            victim.signal(signal.SIGKILL)
            assert victim.wait_exit() == -signal.SIGKILL
            with psycopg.connect(database_url, autocommit=True) as admin:
                for pid in blocked:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            locker.rollback()
            assert _status(conn, target) == "running"  # rolled back with its backend
        else:
            (tmp_path / "go").write_text("")
            wait_for(lambda: _status(conn, target) == "succeeded", "the completion to commit")
            victim.signal(signal.SIGKILL)
            assert victim.wait_exit() == -signal.SIGKILL

    reaper_on(database_url, 0.3)
    spawn_on(database_url, "rescuer", concurrency=2, lease=2.0, heartbeat=0.5)
    (merge,) = wait_for(lambda: len(m := _ids(conn, "merge")) == 1 and m, "one merge job")
    wait_for(lambda: _status(conn, merge) == "succeeded", "the merge to succeed", timeout=60)

    assert len(_ids(conn, "page")) == PAGES  # the fan-out was neither lost nor doubled
    # The merge ran to success once. An earlier attempt can only be the victim's, cut by its
    # SIGKILL: once the last page's completion commits, the victim may claim the merge before
    # the signal lands, and that attempt is reaped like any other; the signal may land before
    # or after its handler starts, so such an attempt may have left no mark.
    runs = {int(p.name.rsplit("-", 1)[1]) for p in tmp_path.glob(f"merge-{merge}-*")}
    attempts = {
        token: (worker, outcome)
        for token, worker, outcome in conn.execute(
            "SELECT lease_token, worker, outcome::text FROM leaseq.job_attempts WHERE job_id = %s",
            (merge,),
        ).fetchall()
    }
    (succeeded,) = [t for t, (_, outcome) in attempts.items() if outcome == "succeeded"]
    assert succeeded in runs and runs <= set(attempts)
    assert all(a == ("victim", "lease_expired") for a in attempts.values() if a[1] != "succeeded")
    assert queue.get(merge).result == {"text": " ".join(f"p{i}" for i in range(PAGES))}
    links = queue.links(merge)
    assert links.pipeline_id is not None
    progress = queue.pipeline(links.pipeline_id)
    assert (progress.total, progress.succeeded, progress.finished) == (PAGES + 1, PAGES + 1, True)
    if where == "split" and when == "before":
        assert len(list(tmp_path.glob("split-*"))) == 2  # the split ran again, spawned once


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_fan_out_and_parent_results_work_under_both_isolations(
    isolation: str,
    database_url: str,
    conn: leaseq.core.db.Conn,
    queue: leaseq.Queue,
    tmp_path: Path,
) -> None:
    """The spawned graph crosses a child's pipe with its outcome; a child reads its parents'
    results through the supervisor, one keyset page per request (the merge asks for pages
    of 2, so 3 parents take two)."""
    from faultkit import HERE, worker_args

    from support.workers import Workers

    workers = Workers(database_url, tmp_path, pythonpath=[HERE])
    try:
        workers.start("w", *worker_args(concurrency=2), "--isolation", isolation)
        split = queue.enqueue("q", "split", {"dir": str(tmp_path), "pages": PAGES}).job_id
        (merge,) = wait_for(lambda: len(m := _ids(conn, "merge")) == 1 and m, "the fan-out")
        wait_for(lambda: _status(conn, merge) == "succeeded", "the merge to succeed")
    finally:
        workers.stop_all()
    assert queue.get(merge).result == {"text": " ".join(f"p{i}" for i in range(PAGES))}
    assert [j.job_type for j in queue.links(split).children] == ["page"] * PAGES
