"""The component roles under the real runtime (issue 11): a `leaseq worker` process running
as the worker role, and the operator's reaper, queue metrics and work estimate as the
operator role, do their whole job; nothing they need is missing from the grants."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import generate_latest

import leaseq
from leaseq.leader.reaper import LeaderLease, Reaper
from leaseq_operator.metrics import OperatorMetrics
from support.polling import wait_for
from support.roles import Roles, component_roles
from support.workers import WorkerProcess


@pytest.fixture
def roles(database_url: str) -> Iterator[Roles]:
    with component_roles(database_url) as made:
        yield made


def test_a_worker_process_runs_as_the_worker_role(
    roles: Roles, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    with leaseq.connect(roles.urls["producer"], action="test") as p:
        ids = [leaseq.Queue(p).enqueue("q", "work", {"n": n}).job_id for n in range(6)]
        ids.append(leaseq.Queue(p).enqueue("q", "broken", max_attempts=1).job_id)
    worker = spawn_worker(
        "as-role", concurrency=3, env={"LEASEQ_DATABASE_URL": roles.urls["worker"]}
    )
    with leaseq.connect(roles.urls["producer"], action="test") as p:
        queue = leaseq.Queue(p)
        wait_for(
            lambda: all(queue.get(i).status in ("succeeded", "dead") for i in ids),
            "every job to finish under the worker role",
        )
        assert [queue.get(i).status for i in ids] == ["succeeded"] * 6 + ["dead"]
    assert worker.metric("leaseq_jobs_finished_total", queue="q", job_type="work",
                         outcome="succeeded") == 6  # fmt: skip
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit() == 0
    log = worker.log.read_text()
    assert "permission denied" not in log, log


def test_the_operator_reaps_scrapes_and_estimates_as_the_operator_role(
    database_url: str, roles: Roles
) -> None:
    with leaseq.connect(roles.urls["producer"], action="test") as p:
        for _ in range(3):
            leaseq.Queue(p).enqueue("q", "work", {})
    with leaseq.connect(roles.urls["worker"], action="test") as w:
        claimed = leaseq.Queue(w).claim(["q"], "crashed", limit=2, lease_seconds=5)
        leaseq.Workers(w).register(
            "crashed", pod=None, node=None, queues=["q"], concurrency=2,
            state=leaseq.WorkerState.RUNNING, in_flight=2,
        )  # fmt: skip
    later = max(c.lease_expires_at for c in claimed) + timedelta(hours=1)
    with leaseq.open_pool(roles.urls["operator"], min_size=1, max_size=4) as pool:
        queue, workers = leaseq.Queue(pool), leaseq.Workers(pool)
        metrics = OperatorMetrics()
        metrics.watch_queues(queue, workers)
        reaper = Reaper(
            LeaderLease(leaseq.Leadership(pool), "op-1", ttl=15),
            queue,
            workers,
            interval=5,
            vacuum_dead_tuples=1,
            on_reaped=metrics.count_reaped,
        )
        done = reaper.run_once(now=later)
        assert done.leading and done.locked
        text = generate_latest(metrics.registry).decode()
        assert 'leaseq_reaped_total{outcome="retried",queue="q"} 2.0' in text
        # Reaped jobs keep their place (no backoff on top of the expired lease): all 3 ready.
        assert 'leaseq_queue_jobs{queue="q",state="ready"} 3.0' in text
        assert "leaseq_operator_database_up 1.0" in text
        [work] = queue.work(["q"], window=3600)
        assert work.job_type == "work"
        assert workers.list() == []  # the crashed worker was forgotten
        reaper.lease.release()
    with psycopg.connect(database_url) as admin:
        # Released: no live lease; the operator's row stays, lapsed, so workers yield.
        holder = admin.execute(
            "SELECT count(*) FILTER (WHERE expires_at > now()), count(*) FROM leaseq.leader_leases"
        ).fetchone()
    assert holder == (0, 1)


def test_a_worker_role_offered_to_lead_says_it_may_not_and_runs_its_jobs(
    database_url: str, roles: Roles, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    """The worker role lacks the leader's privileges: the worker's first pass is refused,
    it logs that once and stops offering, and it runs its jobs as before."""
    worker = spawn_worker(
        "as-role", env={"LEASEQ_DATABASE_URL": roles.urls["worker"], "LEASEQ_LEAD": "true"}
    )
    wait_for(lambda: "leader duties refused, not leading" in worker.log.read_text(), "refusal")
    with leaseq.connect(roles.urls["producer"], action="test") as p:
        queue = leaseq.Queue(p)
        job_id = queue.enqueue("q", "work", {}).job_id
        wait_for(lambda: queue.get(job_id).status == "succeeded", "the job to run")
    assert worker.serving()
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit() == 0
    log = worker.log.read_text()
    assert log.count("leader duties refused") == 1, log
    said = [line for line in log.splitlines() if "permission denied" in line]
    assert [line for line in said if " DEBUG " not in line] == said[-1:], log
    with psycopg.connect(database_url) as admin:
        assert admin.execute("SELECT count(*) FROM leaseq.leader_leases").fetchone() == (0,)
