"""Upgrading a database that already holds finished jobs: the migration moves nothing (no
long transaction over the jobs), `leaseq migrate` says what waits, and the mover then moves
every old finished job exactly once while a worker goes on.

The worker starts once the schema is current: it is this release's code, whose statements
name columns that later migrations add (the notify flag, flow keys); the workers that run
during a real upgrade are the previous release's, which this test cannot run."""

from __future__ import annotations

import threading

import psycopg
import pytest

import leaseq
from leaseq.cli.main import main
from leaseq.core.history import History
from leaseq.core.schema import known_migrations
from leaseq.leader.history import HistoryDuty
from support.polling import wait_for
from support.upgrade import migrate_before

OLD_JOBS = 3000


def migrate_before_history(conn: leaseq.core.db.Conn) -> None:
    """Apply the migrations older than the history's, as an older leaseq did."""
    [history] = [m for m in known_migrations() if m.name.startswith("history")]
    migrate_before(conn, history.version)


class Worker(threading.Thread):
    """Enqueues, claims and completes jobs one by one on its own connection until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.done = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                queue = leaseq.Queue(conn)
                while not self.stop.is_set():
                    queue.enqueue("live", "t")
                    for job in queue.claim(["live"], "w1"):
                        queue.complete(job.lease, {"ok": True})
                        self.done += 1
        except BaseException as exc:
            self.errors.append(exc)


def test_upgrade_with_finished_jobs_and_a_worker_running(
    empty_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before_history(conn)
        conn.execute(
            "INSERT INTO leaseq.jobs (queue, job_type, status, attempt_count, lease_token,"
            " lease_owner, started_at, finished_at)"
            " SELECT 'old', 't', 'succeeded', 1, 1, 'w', now() - interval '3 days',"
            "        now() - interval '3 days' + i * interval '1 s'"
            "   FROM generate_series(1, %s) i",
            (OLD_JOBS,),
        )
        assert main(["migrate", "--database-url", empty_database_url]) == 0
        out = capsys.readouterr().out
        assert f"{OLD_JOBS} now" in out  # all old ones are due for the mover
        assert "in batches, with workers running" in out
        # The migration itself moved nothing.
        row = conn.execute("SELECT count(*) FROM leaseq.jobs WHERE queue = 'old'").fetchone()
        assert row == (OLD_JOBS,)
        worker = Worker(empty_database_url)
        worker.start()
        try:
            wait_for(lambda: worker.done > 10 or worker.errors, "the worker running")

            conn.execute("UPDATE leaseq.history_mover SET batch = 100")
            mover = HistoryDuty(History(conn), 3600.0, timeout=10.0, budget=60.0)
            before = worker.done
            mover.partitions()
            while mover.move():
                pass
            wait_for(lambda: worker.done > before + 10 or worker.errors, "the worker going on")
        finally:
            worker.stop.set()
            worker.join(timeout=30)
        assert worker.errors == []
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM leaseq.jobs WHERE queue = 'old'),"
            "  (SELECT count(DISTINCT id) FROM leaseq.job_history WHERE queue = 'old'),"
            "  (SELECT count(*) FROM leaseq.job_ledger WHERE queue = 'old'),"
            "  (SELECT count(*) FROM leaseq.jobs WHERE queue = 'live' AND status = 'succeeded')"
        ).fetchone()
        assert counts is not None
        assert counts[:3] == (0, OLD_JOBS, OLD_JOBS)
        assert counts[3] == worker.done  # the worker's jobs finished just now: still hot
