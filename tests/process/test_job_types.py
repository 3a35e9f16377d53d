"""A worker claims only the job types its registry serves: during a rolling deploy that ships
a new type, the old workers leave its jobs pending (no attempt spent), the work is shown as
unserved (operator metric, ``leaseq status``) and is not counted as the pool's work, and a
new worker runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import leaseq
from leaseq_operator.metrics import OperatorMetrics
from support.jobs import finished
from support.workers import WorkerProcess

Spawn = Callable[..., WorkerProcess]


def _status(database_url: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "leaseq.cli", "status", "--database-url", database_url, *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_a_rolling_deploy_never_burns_a_new_job_type(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, spawn_worker: Spawn, database_url: str
) -> None:
    spawn_worker("old")  # apps:registry, which has no "resize"
    new = queue.enqueue("q", "resize", {}, max_attempts=1).job_id
    # Enqueued after it, so a claim that took anything passed the new job first.
    known = queue.enqueue("q", "work", {}).job_id
    assert finished(queue, known).status == "succeeded"

    job = queue.get(new)
    assert (job.status, job.attempt_count) == ("pending", 0)
    assert queue.attempts(new) == []
    [unserved] = queue.unserved(["q"])
    assert (unserved.queue, unserved.job_type, unserved.ready) == ("q", "resize", 1)

    metrics = OperatorMetrics()
    metrics.watch_queues(queue, leaseq.Workers(conn))
    sample = metrics.registry.get_sample_value
    assert sample("leaseq_queue_unserved_jobs", {"queue": "q", "job_type": "resize"}) == 1
    text = _status(database_url)
    assert "ready jobs no live worker serves" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["QUEUE", "JOB", "TYPE"])
    assert lines[header + 1].split()[:3] == ["q", "resize", "1"]
    listed = json.loads(_status(database_url, "--json"))
    assert [(u["queue"], u["job_type"]) for u in listed["unserved"]] == [("q", "resize")]
    [old] = listed["workers"]
    assert "resize" not in old["job_types"] and "work" in old["job_types"]

    spawn_worker("next", app="apps_next:registry")
    done = finished(queue, new)
    assert (done.status, done.attempt_count, done.result) == (
        "succeeded",
        1,
        {"worker": "next", "attempt": 1},
    )
    assert queue.unserved(["q"]) == []
    assert sample("leaseq_queue_unserved_jobs", {"queue": "q", "job_type": "resize"}) is None
