"""leaseq behind a real PgBouncer in transaction-pooling mode (README: polling, no LISTEN):
every job runs once, and a PgBouncer restart under running jobs costs no attempt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from faultkit import HERE, worker_args

import leaseq
from support import pgbouncer
from support.pgserver import RestartablePostgres
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not pgbouncer.available(), reason="pgbouncer is not installed"),
]


@pytest.fixture
def bouncer(database_url: str) -> Iterator[pgbouncer.PgBouncer]:
    b = pgbouncer.PgBouncer(database_url)
    yield b
    print(b.log())
    b.close()


def test_workers_behind_pgbouncer_survive_its_restart(
    database_url: str,
    queue: leaseq.Queue,
    bouncer: pgbouncer.PgBouncer,
    spawn_on: Callable[..., WorkerProcess],
) -> None:
    for n in range(2):
        # The workers go through the bouncer; the harness checks on them directly.
        spawn_on(
            database_url,
            f"w-pgb-{n}",
            env={"LEASEQ_DATABASE_URL": bouncer.url},
            concurrency=3,
            lease=5.0,
            listen=False,
            prepared_statements=False,
            poll=0.3,
        )
    with leaseq.connect(bouncer.url, action="test", prepare_threshold=None) as through:
        # Producers go through the pooler too: enqueue is one statement.
        ids = [
            j.job_id
            for j in leaseq.Queue(through).enqueue_many(
                [
                    leaseq.JobSpec("q", "step", {"seconds": 1.5, "checkpoint_every": 0.1})
                    for _ in range(24)
                ]
            )
        ]
    wait_for(lambda: sum(queue.get(i).status == "succeeded" for i in ids) >= 3, "first jobs")
    bouncer.restart()
    time.sleep(0.5)
    bouncer.restart()

    def unfinished() -> list[tuple[int, str]]:
        return [(i, s) for i in ids if (s := queue.get(i).status) != "succeeded"]

    try:
        wait_for(lambda: not unfinished(), "every job", 120)
    finally:
        print("unfinished:", unfinished(), "ids:", ids)
    assert [queue.get(i).attempt_count for i in ids] == [1] * len(ids)
    for i in ids:
        assert [a.outcome for a in queue.attempts(i)] == ["succeeded"]


@pytest.mark.parametrize(
    "login_retry",
    [
        1,
        pytest.param(
            None,
            marks=pytest.mark.xfail(
                strict=True,
                reason="evidence: at PgBouncer's default server_login_retry (15 s) a 1 s "
                "outage keeps the workers cut off for 15 s, past their 8 s leases",
            ),
        ),
    ],
)
def test_a_short_outage_behind_pgbouncer_costs_no_attempt(
    restartable: RestartablePostgres,
    restartable_url: str,
    spawn_on: Callable[..., WorkerProcess],
    reaper_on: Callable[..., object],
    login_retry: int | None,
) -> None:
    """PostgreSQL stops for 1 s under workers that reach it through PgBouncer (leases 8 s,
    heartbeats 1 s). With ``server_login_retry = 1`` PgBouncer logs in again within a second
    of the server's return, the workers renew, and every job succeeds on its first attempt."""
    bouncer = pgbouncer.PgBouncer(restartable_url, server_login_retry=login_retry)
    try:
        reaper_on(restartable_url, 0.5)  # direct: the reaper is not what is under test
        for n in range(2):
            spawn_on(
                restartable_url,
                f"w-pgb-{n}",
                env={"LEASEQ_DATABASE_URL": bouncer.url},
                concurrency=2,
                lease=8.0,
                heartbeat=1.0,
                listen=False,
                prepared_statements=False,
                poll=0.3,
            )
        with leaseq.connect(restartable_url, action="test") as conn:
            queue = leaseq.Queue(conn)
            specs = [leaseq.JobSpec("q", "step", {"seconds": 12, "checkpoint_every": 0.5})] * 4
            ids = [j.job_id for j in queue.enqueue_many(specs)]
            wait_for(lambda: all(queue.get(i).status == "running" for i in ids), "all running")
        restartable.stop("fast")
        time.sleep(1.0)  # the outage itself, not a synchronisation
        restartable.start()
        with leaseq.connect(restartable_url, action="test") as conn:
            queue = leaseq.Queue(conn)
            wait_for(
                lambda: all(queue.get(i).status in ("succeeded", "dead") for i in ids),
                "every job to finish",
                90,
            )
            lost = conn.execute(
                "SELECT job_id, outcome::text FROM leaseq.job_attempts"
                " WHERE job_id = ANY(%s) AND outcome NOT IN ('succeeded', 'released')",
                [ids],
            ).fetchall()
        assert lost == []
    finally:
        print(bouncer.log())
        bouncer.close()


def test_a_worker_started_behind_pgbouncer_while_postgresql_is_down_waits_for_it(
    restartable: RestartablePostgres, restartable_url: str, tmp_path: Path
) -> None:
    """PgBouncer, which served before the outage, accepts a new worker's login while
    PostgreSQL is down and fails its first statement instead (the pool's check of which
    server it reached): the worker waits for the database, as it does when it connects
    directly, and runs jobs once PostgreSQL is back. It used to exit with status 2."""
    bouncer = pgbouncer.PgBouncer(restartable_url, server_login_retry=1, query_wait_timeout=1)
    log = tmp_path / "w-pgb.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        with leaseq.connect(bouncer.url, action="test", prepare_threshold=None) as through:
            through.execute("SELECT 1")  # PgBouncer knows the server from before the outage
        restartable.stop("fast")
        cmd = [sys.executable, "-m", "leaseq.cli", "worker", "--worker-id", "w-pgb",
               "--metrics-port", "0",
               *worker_args(listen=False, prepared_statements=False, poll=0.3)]  # fmt: skip
        paths = [str(HERE), os.environ.get("PYTHONPATH", "")]
        env = {
            **os.environ,
            "LEASEQ_DATABASE_URL": bouncer.url,
            "LEASEQ_LEAD": "false",
            "PYTHONPATH": os.pathsep.join(filter(None, paths)),
        }
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        started = proc
        wait_for(
            lambda: started.poll() is not None or "waiting for the database" in log.read_text(),
            "the worker to wait for the database, or to exit",
            60,
        )
        assert proc.poll() is None, log.read_text()
        restartable.start()
        with leaseq.connect(restartable_url, action="test") as conn:
            queue = leaseq.Queue(conn)
            job_id = queue.enqueue("q", "step", {"seconds": 0}).job_id
            wait_for(lambda: queue.get(job_id).status == "succeeded", "the job", 60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        restartable.start()  # the module's server, for the tests after this one
        print(log.read_text(errors="replace")[-5000:] if log.exists() else "")
        print(bouncer.log())
        bouncer.close()
