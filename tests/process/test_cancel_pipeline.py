"""Cancelling a running pipeline's root in front of a real worker process: every descendant
ends cancelled (running, pending, sleeping, waiting on its parents), the running handler sees
``ctx.cancelled`` at the next lease renewal, and what it returns and spawns afterwards is
dropped."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

REASON = "user gave up"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_cancelling_a_running_pipelines_root_ends_every_descendant(
    queue: leaseq.Queue, spawn_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    folder = tmp_path / "seen"
    folder.mkdir()
    root = queue.enqueue("q", "root", {"dir": str(folder)}).job_id
    w = spawn_worker("w-cancel", concurrency=2, app="cancel_app:registry")
    wait_for(lambda: queue.get(root).status == "succeeded", "the root to spawn")
    # The spawns were written with the root's completion: a pipeline of their own.
    first = queue.links(root, limit=10).children[0].job_id
    pipeline_id = queue.links(first, limit=0).pipeline_id
    assert pipeline_id is not None
    jobs = {r["job_type"]: r["job_id"] for r in queue.pipeline_jobs(pipeline_id)}
    assert sorted(jobs) == ["after", "busy", "idle", "napper"]
    wait_for(lambda: lines(folder / "busy") == ["started"], "busy to start")
    # The napper slept: pending again, holding nothing, until an hour from now.
    wait_for(lambda: lines(folder / "napper") == ["attempt 1"], "the napper to run")
    wait_for(lambda: queue.get(jobs["napper"]).status == "pending", "the napper to go to sleep")
    before = {k: queue.get(i).status for k, i in jobs.items()}
    assert before == {"busy": "running", "napper": "pending", "idle": "pending", "after": "waiting"}

    done = queue.cancel(root, reason=REASON)
    assert done == leaseq.Cancelled(root, False, "succeeded", descendants=4, running=1)

    wait_for(lambda: lines(folder / "busy") == ["started", "saw cancelled"], "ctx.cancelled")
    wait_for(lambda: "job cancelled: handler told to stop" in w.log.read_text(), "the settling")
    for kind, job_id in jobs.items():
        record = queue.get(job_id)
        assert (record.status, record.last_error) == (
            "cancelled",
            f"cancelled with ancestor job {root}: {REASON}",
        ), kind
        assert record.result is None
    assert [a.outcome for a in queue.attempts(jobs["busy"])] == ["cancelled"]
    # The late return spawned nothing and nothing else ran.
    assert queue.pipeline(pipeline_id).total == 4
    assert not lines(folder / "late") and not lines(folder / "after")
    assert (
        w.metric("leaseq_jobs_finished_total", queue="q", job_type="busy", outcome="cancelled") == 1
    )
