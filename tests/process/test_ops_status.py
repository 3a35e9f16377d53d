"""`leaseq status` as an operator without Kubernetes reads it: finished work is reported, and
a worker that stopped heartbeating (SIGKILLed, or crashed while loading) is marked silent,
in the CLI and in what the operator reads (``Workers.list``). Real workers, real signals,
the real CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta

import pytest

import leaseq
from leaseq.core.models import SILENT_AFTER_SECONDS
from leaseq_operator.capacity import pod_states
from support.dbtime import db_now
from support.jobs import finished
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

Spawn = Callable[..., WorkerProcess]


def status(database_url: str, *argv: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "leaseq.cli", "status", *argv, "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def test_status_reports_succeeded_jobs_and_marks_a_killed_worker_silent(
    database_url: str, queue: leaseq.Queue, conn: leaseq.core.db.Conn, spawn_worker: Spawn
) -> None:
    w = spawn_worker("w-status")
    ids = [queue.enqueue("q", "work", {"seconds": 0}).job_id for _ in range(2)]
    for job_id in ids:
        assert finished(queue, job_id).status == "succeeded"
    text = status(database_url)
    assert "no jobs" not in text and "no unfinished" not in text
    [row] = [line.split() for line in text.splitlines() if line.startswith("q ")]
    # QUEUE READY SCHEDULED RUNNING DEAD HELD SUCCEEDED-1H CANCELLED-1H ...
    assert row[:8] == ["q", "0", "0", "0", "0", "0", "2", "0"]
    [live] = [line for line in text.splitlines() if line.startswith("w-status")]
    assert live.split()[1] == "running"

    w.signal(signal.SIGKILL)
    w.wait_exit()
    # Time passes in the database, not in the test: the row's last heartbeat moves back.
    conn.execute(
        "UPDATE leaseq.workers SET heartbeat_at = now() - make_interval(secs => %s)"
        " WHERE worker_id = 'w-status'",
        [SILENT_AFTER_SECONDS + 1],
    )
    [dead] = [line for line in status(database_url).splitlines() if line.startswith("w-status")]
    assert dead.split()[1:4] == ["silent", "(last", "running)"]
    [shown] = json.loads(status(database_url, "--json"))["workers"]
    assert (shown["worker_id"], shown["silent"], shown["state"]) == ("w-status", True, "running")
    [record] = leaseq.Workers(conn).list()
    assert record.silent


def test_a_worker_that_died_while_loading_is_silent_and_no_capacity(
    database_url: str, conn: leaseq.core.db.Conn
) -> None:
    workers = leaseq.Workers(conn)
    now = db_now(conn)
    for worker_id, seconds_ago in (("loading-live", 1.0), ("loading-dead", 120.0)):
        workers.register(
            worker_id, pod=worker_id, node="n", queues=["q"], concurrency=1,
            state=leaseq.WorkerState.LOADING, in_flight=0,
            now=now - timedelta(seconds=seconds_ago),
        )  # fmt: skip
    listed = {w.worker_id: w for w in workers.list()}
    assert not listed["loading-live"].silent and listed["loading-dead"].silent
    states = {line.split()[0]: line.split()[1] for line in status(database_url).splitlines()[-2:]}
    assert states == {"loading-dead": "silent", "loading-live": "loading"}
    # The operator counts only the live loading pod as capacity on its way.
    assert len(pod_states(["loading-live", "loading-dead"], list(listed.values())).loading) == 1
