"""A pool that knows its schedules: it keeps its pod when the next slot comes within the
scale-down window, and otherwise scales to zero and back up the lead time before the slot.

Time is driven, not waited for: the operator runs (kopf watches the WorkerPool, the reaper
holds the leader lease, scaling goes through the emulator), but its own pool loop is idle (a
tick of an hour) and the test polls the pool through the operator's tick at chosen database
times (``tick_pool(..., at=t)``), firing the schedule at those times as the leader's
scheduler would. The times lie years ahead, where the leader's own scheduler, ticking on the
real clock, finds nothing due.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from harness import NAMESPACE, Api, RunningOperator, StartOperator

import leaseq
from leaseq_operator.handlers import tick_pool
from support.polling import wait_for

pytestmark = pytest.mark.k8s

EPOCH = datetime(2031, 1, 1, tzinfo=UTC)  # origin of the scaling history's clock
POLL = 10  # seconds between the pool's readings (its pollSeconds)
LEAD = 45  # work.startupSeconds: the lead time when no worker reported a longer model load
JOB_SECONDS = 5


@dataclass
class Run:
    """What the pool did at every reading: (time, replicas after it), and for each slot's
    job the replicas the pool had when the job became ready."""

    replicas: list[tuple[datetime, int]]
    warm: dict[datetime, int]

    def changes(self) -> list[tuple[datetime, int]]:
        """The readings after which the replica count differed from the one before."""
        found, last = [], 0
        for t, replicas in self.replicas:
            if replicas != last:
                found.append((t, replicas))
            last = replicas
        return found


def drive(
    api: Api,
    operator: RunningOperator,
    queue: leaseq.Queue,
    schedules: leaseq.Schedules,
    start: datetime,
    end: datetime,
) -> Run:
    """Every POLL seconds of database time from ``start`` to ``end``: fire the due slot,
    poll the pool, and run each ready job on the pool's pod (if it has one then)."""
    key = f"{NAMESPACE}/ocr"
    state = wait_for(lambda: operator.app.pools.get(key), what="the watch saw the pool")
    wait_for(lambda: operator.app.leading, what="the operator leads")
    run = Run([], {})
    t = start
    while t <= end:
        for fired in schedules.tick(now=t).fired:
            run.warm[fired.slot] = api.replicas("workers")
        tick_pool(operator.app, key, state, (t - EPOCH).total_seconds(), at=t)
        replicas = api.replicas("workers")
        run.replicas.append((t, replicas))
        if replicas:
            for job in queue.claim(["ocr"], "worker-1", limit=replicas, lease_seconds=600, now=t):
                queue.complete(job.lease, now=t + timedelta(seconds=JOB_SECONDS))
        t += timedelta(seconds=POLL)
    return run


def start_pool(
    api: Api,
    start_operator: StartOperator,
    schedules: leaseq.Schedules,
    cron: str | None,
    at: datetime,
) -> RunningOperator:
    api.create_deployment("workers", replicas=0)
    if cron is not None:
        schedules.add(leaseq.ScheduleSpec("report", cron, "ocr", "report"), now=at)
    operator = start_operator(tick_seconds=3600.0)  # its own loop idles: the test polls
    api.create_pool(
        "ocr",
        {
            "deployment": "workers",
            "queues": ["ocr"],
            "minReplicas": 0,
            "pollSeconds": POLL,
            "scaleDownStabilizationSeconds": 120,
            "work": {"startupSeconds": LEAD},
        },
    )
    return operator


def test_a_per_minute_schedule_keeps_one_pod_across_slots(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    schedules = leaseq.Schedules(conn)
    start = datetime(2031, 3, 4, 9, 58, tzinfo=UTC)
    operator = start_pool(api, start_operator, schedules, "* * * * *", start)
    run = drive(api, operator, queue, schedules, start, start + timedelta(minutes=8))

    # Up once, ahead of the first slot (09:59) by the lead time, and never down again.
    first = datetime(2031, 3, 4, 9, 59, tzinfo=UTC)
    [(up, replicas)] = run.changes()
    assert replicas == 1
    assert first - timedelta(seconds=LEAD + POLL) <= up <= first - timedelta(seconds=LEAD)
    assert len(run.warm) == 8
    assert set(run.warm.values()) == {1}, run.warm  # every slot's job found the pod up
    assert api.pool("ocr")["status"]["scaleAheadSeconds"] == LEAD


def test_a_ten_minute_schedule_scales_to_zero_and_is_ready_by_the_lead_time(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    schedules = leaseq.Schedules(conn)
    start = datetime(2031, 3, 4, 9, 55, tzinfo=UTC)
    operator = start_pool(api, start_operator, schedules, "*/10 * * * *", start)
    run = drive(api, operator, queue, schedules, start, start + timedelta(minutes=29))

    slots = [datetime(2031, 3, 4, 10, m, tzinfo=UTC) for m in (0, 10, 20)]
    assert sorted(run.warm) == slots
    assert set(run.warm.values()) == {1}, run.warm  # every slot's job found the pod up
    ups = [t for t, replicas in run.changes() if replicas == 1]
    downs = [t for t, replicas in run.changes() if replicas == 0]
    assert len(ups) == len(downs) == len(slots), run.changes()
    for slot, up, down in zip(slots, ups, downs, strict=True):
        # Up by the lead time before the slot, no sooner than one poll before that.
        assert slot - timedelta(seconds=LEAD + POLL) <= up <= slot - timedelta(seconds=LEAD)
        # Down between the slots: after the job and the window, long before the next one.
        assert slot + timedelta(seconds=120) <= down < slot + timedelta(minutes=5)


def test_a_delayed_job_due_within_the_window_keeps_the_pod(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """A job done now and the next one due in 200 s, past the 120 s window: the window alone
    would stop the pod at 120 s and start it again at 145 s (the lead time before 200 s). From
    80 s on the delayed job is due within the window, so the pod stays."""
    schedules = leaseq.Schedules(conn)
    start = datetime(2031, 3, 4, 12, 0, tzinfo=UTC)
    queue.enqueue("ocr", "extract", {"n": 1}, now=start)
    queue.enqueue("ocr", "extract", {"n": 2}, run_at=start + timedelta(seconds=200), now=start)
    operator = start_pool(api, start_operator, schedules, None, start)
    run = drive(api, operator, queue, schedules, start, start + timedelta(seconds=300))

    assert run.changes() == [(start, 1)]  # up for the first job, and kept for the second
    assert len(queue.jobs(status="succeeded", queue="ocr")) == 2  # both ran on that pod


def test_the_lead_time_is_the_model_load_the_workers_reported_and_outlives_them(
    api: Api, start_operator: StartOperator, queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    """Unset, scaleAheadSeconds is the pool's start-up time: the larger of work.startupSeconds
    and the model load its workers reported, remembered once the pool is at zero (no worker
    is left to report it)."""
    schedules, workers = leaseq.Schedules(conn), leaseq.Workers(conn)
    start = datetime(2031, 3, 4, 9, 55, tzinfo=UTC)
    workers.register(
        "worker-1",
        pod="workers-1",
        node="node-1",
        queues=["ocr"],
        concurrency=1,
        state=leaseq.WorkerState.RUNNING,
        in_flight=0,
        startup_seconds=75.0,
    )
    operator = start_pool(api, start_operator, schedules, "*/10 * * * *", start)
    drive(api, operator, queue, schedules, start, start)
    assert api.pool("ocr")["status"]["scaleAheadSeconds"] == 75
    workers.remove("worker-1")  # the pool's last pod went away
    run = drive(
        api,
        operator,
        queue,
        schedules,
        start + timedelta(seconds=POLL),
        start + timedelta(minutes=6),
    )

    slot = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)
    [(up, _), *_] = run.changes()
    assert slot - timedelta(seconds=75 + POLL) <= up <= slot - timedelta(seconds=75)
    assert api.pool("ocr")["status"]["scaleAheadSeconds"] == 75
