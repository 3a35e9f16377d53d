"""The scaling policy, driven through scenarios: each step is one reading at time t.

The Deployment follows every decision (current = last desired), as it would in a cluster.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from leaseq.core.models import JobTypeWork, UnservedWork
from leaseq_operator.scaling import (
    Decision,
    Demand,
    Recommendation,
    Work,
    coming_seconds,
    decide,
    lead_seconds,
    replicas_for,
    servable,
    soon_seconds,
    with_slots,
    work_seconds,
)
from leaseq_operator.spec import PoolSpec, ScaleOn, WorkSpec, WorkTarget

BASE = PoolSpec(
    deployment="workers",
    queues=("ocr",),
    min_replicas=0,
    max_replicas=10,
    jobs_per_replica=2,
    poll_seconds=10,
    scale_up_seconds=0,
    scale_down_seconds=60,
)

# (t, ready, due soon, running, expected desired)
Step = tuple[float, int, int, int, int]


def run(spec: PoolSpec, steps: list[Step], current: int = 0) -> list[int]:
    history: tuple[Recommendation, ...] = ()
    seen = []
    for t, ready, soon, running, _ in steps:
        decision = decide(Demand(ready, soon, running), current, history, spec, now=t)
        history = decision.history
        current = decision.desired
        seen.append(current)
    return seen


SCENARIOS: dict[str, tuple[PoolSpec, int, list[Step]]] = {
    "spike scales up at once, down only after the window": (
        BASE,
        0,
        [
            (0, 0, 0, 0, 0),
            (10, 9, 0, 0, 5),  # ceil(9 / 2)
            (20, 1, 0, 8, 5),  # claimed: ready + running still need 5
            (30, 0, 0, 0, 5),  # drained, but the window remembers 5
            (60, 0, 0, 0, 5),
            (79, 0, 0, 0, 5),  # the reading at 20 asked for 5
            (81, 0, 0, 0, 0),  # 20 + 60 has passed: every reading in the window says 0
        ],
    ),
    "flapping backlog inside the window never shrinks the pool": (
        BASE,
        0,
        [
            (0, 6, 0, 0, 3),
            (20, 0, 0, 0, 3),
            (40, 6, 0, 0, 3),
            (60, 0, 0, 0, 3),
            (80, 6, 0, 0, 3),
            (100, 0, 0, 0, 3),
            (141, 0, 0, 0, 0),  # 80 + 60 < 141: the last burst left the window
        ],
    ),
    "scale to zero and back": (
        replace(BASE, scale_down_seconds=0),
        2,
        [
            (0, 0, 0, 0, 0),
            (10, 0, 0, 0, 0),
            (20, 1, 0, 0, 1),
            (30, 0, 0, 1, 1),
            (40, 0, 0, 0, 0),
        ],
    ),
    "jobs due within the poll interval count as demand": (
        BASE,
        0,
        [(0, 0, 3, 0, 2), (10, 0, 0, 0, 2)],
    ),
    "max caps a huge backlog": (
        BASE,
        0,
        [(0, 1000, 0, 0, 10), (10, 1000, 0, 20, 10)],
    ),
    "min keeps replicas with no work": (
        replace(BASE, min_replicas=2, scale_down_seconds=0),
        5,
        [(0, 0, 0, 0, 2), (10, 0, 0, 0, 2)],
    ),
    "jobs that outlive the window keep their replicas": (
        replace(BASE, scale_down_seconds=30),
        0,
        [
            (0, 8, 0, 0, 4),
            *[(t, 0, 0, 8, 4) for t in range(10, 70, 10)],  # running for twice the window
            (70, 0, 0, 3, 4),  # fewer running: the window remembers 4
            (80, 0, 0, 3, 4),
            (91, 0, 0, 3, 2),  # ceil(3 / 2)
            (100, 0, 0, 0, 2),
            (121, 0, 0, 0, 0),
        ],
    ),
    "up-window waits for sustained demand": (
        replace(BASE, scale_up_seconds=30, scale_down_seconds=0),
        1,
        [
            (0, 2, 0, 0, 1),  # first reading: the found count counts as recommended now
            (10, 10, 0, 0, 1),  # a spike: the reading at 0 asked for 1
            (20, 0, 0, 0, 0),  # gone again: no scale-up happened for it
            (30, 10, 0, 0, 0),
            (40, 10, 0, 0, 0),
            (61, 10, 0, 0, 5),  # every reading since 30 asked for 5
        ],
    ),
    "a restarted operator waits a full window before shrinking what it found": (
        BASE,
        4,
        [(0, 0, 0, 0, 4), (59, 0, 0, 0, 4), (61, 0, 0, 0, 0)],
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name: str) -> None:
    spec, start, steps = SCENARIOS[name]
    assert run(spec, steps, start) == [step[-1] for step in steps]


def test_lowered_max_applies_at_once_but_not_over_running_jobs() -> None:
    history = decide(Demand(0, 0, 16), 8, (), BASE, now=0).history
    lowered = replace(BASE, max_replicas=3)
    decision = decide(Demand(0, 0, 16), 8, history, lowered, now=10)
    assert decision.desired == 8  # 16 running jobs need 8 replicas: do not kill them
    assert decision.floor == 8
    decision = decide(Demand(0, 0, 4), 8, decision.history, lowered, now=20)
    assert decision.desired == 3


def test_no_reading_holds_and_restarts_the_down_window() -> None:
    spec = replace(BASE, scale_down_seconds=30)
    history = decide(Demand(10, 0, 0), 0, (), spec, now=0).history
    held: Decision = decide(None, 5, history, spec, now=100)
    assert held.desired == 5
    assert "no queue depth reading" in held.reason
    # Readings resume with nothing to do: the hold at 100 is a recommendation of 5.
    resumed = decide(Demand(0, 0, 0), 5, held.history, spec, now=110)
    assert resumed.desired == 5
    assert decide(Demand(0, 0, 0), 5, resumed.history, spec, now=131).desired == 0


def test_readings_missing_for_a_whole_window_start_over() -> None:
    history = decide(Demand(0, 0, 0), 3, (), BASE, now=0).history
    history = decide(Demand(0, 0, 0), 3, history, BASE, now=30).history
    assert decide(Demand(0, 0, 0), 3, history, BASE, now=61).desired == 0
    # A gap longer than the window: the replicas found count as recommended again.
    assert decide(Demand(0, 0, 0), 3, history, BASE, now=500).desired == 3


def test_history_keeps_only_the_windows() -> None:
    history: tuple[Recommendation, ...] = ()
    for t in range(0, 1000, 10):
        history = decide(Demand(1, 0, 0), 1, history, BASE, now=t).history
    assert all(r.at > 990 - 60 for r in history)


@pytest.mark.parametrize(
    ("jobs", "per", "replicas"), [(0, 1, 0), (1, 1, 1), (1, 4, 1), (4, 4, 1), (5, 4, 2)]
)
def test_replicas_for(jobs: int, per: int, replicas: int) -> None:
    assert replicas_for(jobs, per) == replicas


# -- scaleOn: Work ----------------------------------------------------------------------------

WORK = replace(
    BASE,
    scale_on=ScaleOn.WORK,
    work=WorkSpec(WorkTarget.DRAIN_TIME, target_seconds=100, startup_seconds=20),
)
AGE = replace(
    WORK, work=WorkSpec(WorkTarget.OLDEST_READY_AGE, target_seconds=120, startup_seconds=30)
)

# (t, ready, running, work-seconds, oldest ready age, active pods, loading ages, expected)
WorkStep = tuple[float, int, int, float, float, int, tuple[float, ...], int]


def run_work(spec: PoolSpec, steps: list[WorkStep], current: int = 0) -> list[int]:
    history: tuple[Recommendation, ...] = ()
    seen = []
    for t, ready, running, seconds, age, active, loading, _ in steps:
        work = Work(seconds, age, active, loading)
        decision = decide(Demand(ready, 0, running, work), current, history, spec, now=t)
        history = decision.history
        current = decision.desired
        seen.append(current)
    return seen


# Pools sizes chosen here are reported in the closing note: keep the comments exact.
WORK_SCENARIOS: dict[str, tuple[PoolSpec, int, list[WorkStep]]] = {
    "short jobs: one replica drains what counts would give ten": (
        WORK,
        0,
        # 100 jobs x 1 s; a new pod works 100 - 20 s at 2 jobs at once: 160 work-seconds.
        [(0, 100, 0, 100, 0, 0, (), 1)],
    ),
    "long jobs: replicas by work, fewer than by count": (
        WORK,
        0,
        # 10 jobs x 60 s = 600 work-seconds over 160 per new pod: 4 (counts would ask 5).
        [(0, 10, 0, 600, 0, 0, (), 4)],
    ),
    "start-up eats into the target": (
        replace(WORK, work=replace(WORK.work, startup_seconds=60)),
        0,
        # 20 jobs x 30 s; a new pod now works only 40 s: 80 work-seconds each, 8 for 600.
        [(0, 20, 0, 600, 0, 0, (), 8)],
    ),
    "no start-up time: the whole target": (
        replace(WORK, work=replace(WORK.work, startup_seconds=0), max_replicas=20),
        0,
        # 200 work-seconds per pod: 3 for 600.
        [(0, 10, 0, 600, 0, 0, (), 3)],
    ),
    "active pods count in full, then fewer are needed as the work drains": (
        WORK,
        0,
        [
            (0, 10, 0, 600, 0, 0, (), 4),
            (10, 2, 8, 600, 0, 4, (), 4),  # active pods do 200 each: 3 would do, the window holds
            (20, 0, 6, 360, 0, 4, (), 4),  # 2 would do
            (71, 0, 2, 120, 0, 4, (), 2),  # the reading at 0 left the window; 20's asked 2
            (100, 0, 1, 60, 0, 2, (), 1),
            (150, 0, 0, 0, 0, 1, (), 1),  # the reading at 100 asked 1
            (161, 0, 0, 0, 0, 1, (), 0),
        ],
    ),
    "one long job is one replica, however short the target": (
        WORK,
        0,
        # 1000 work-seconds cannot be done in time by any pool size; one job needs one pod.
        [(0, 1, 0, 1000, 0, 0, (), 1)],
    ),
    "more work than maxReplicas can do in time: maxReplicas": (
        WORK,
        0,
        [(0, 100, 0, 10_000, 0, 0, (), 10)],
    ),
    "nothing to do: zero": (
        WORK,
        3,
        [(0, 0, 0, 0, 0, 3, (), 3), (30, 0, 0, 0, 0, 3, (), 3), (61, 0, 0, 0, 0, 3, (), 0)],
    ),
    "age target: the oldest job's wait is the budget": (
        AGE,
        0,
        # 120 - 30 s of age leaves 90 s, new pods work 60 s of it: 120 each, 5 for 600.
        [(0, 10, 0, 600, 30, 0, (), 5)],
    ),
    "age target: loading pods are capacity already coming": (
        AGE,
        0,
        [
            # Budget 120 s, a new pod works 90 of it: 180 work-seconds, 4 pods for 600.
            (0, 10, 0, 600, 0, 0, (), 4),
            # The ready jobs age while the 4 pods load; so do the pods: each still does 180.
            (10, 10, 0, 600, 10, 0, (10, 10, 10, 10), 4),
            (20, 10, 0, 600, 20, 0, (20, 20, 20, 20), 4),
            (30, 10, 0, 600, 30, 4, (), 4),
        ],
    ),
    "age target: pods not registered yet need the whole start-up": (
        AGE,
        4,
        # 4 pods exist but none registered: 120 - 10 - 30 leaves 80 s, 160 each: 4 do 640.
        [(0, 10, 0, 600, 10, 0, (), 4), (10, 10, 0, 600, 20, 0, (), 5)],
    ),
    "age target already missed: maxReplicas, within the jobs there are": (
        AGE,
        2,
        [(0, 12, 0, 600, 130, 2, (), 6)],  # no budget left; 12 jobs fill 6 replicas
    ),
}


@pytest.mark.parametrize("name", list(WORK_SCENARIOS))
def test_work_scenario(name: str) -> None:
    spec, start, steps = WORK_SCENARIOS[name]
    assert run_work(spec, steps, start) == [step[-1] for step in steps]


def test_loading_pods_without_their_progress_would_grow_the_pool() -> None:
    """The scenario above, with the loading pods counted as if they had just started: the
    pool grows at every reading while the pods load (what the loading credit prevents)."""
    _, _, steps = WORK_SCENARIOS["age target: loading pods are capacity already coming"]
    fresh = [
        (t, r, n, w, age, a, tuple(0.0 for _ in loading), x)
        for t, r, n, w, age, a, loading, x in steps
    ]
    assert run_work(AGE, fresh[:3]) == [4, 4, 5]


def test_work_reason_names_the_estimate() -> None:
    decision = decide(Demand(10, 0, 0, Work(600, 0)), 0, (), WORK, now=0)
    assert "600 work-seconds within 100s (0 active, 0 loading, start-up 20s)" in decision.reason


def test_reported_start_up_outranks_a_smaller_estimate() -> None:
    work = Work(600, 0, reported_startup_seconds=60)
    assert decide(Demand(20, 0, 0, work), 0, (), WORK, now=0).desired == 8
    work = Work(600, 0, reported_startup_seconds=5)
    assert decide(Demand(20, 0, 0, work), 0, (), WORK, now=0).desired == 4


def test_jobs_mode_ignores_the_work_reading() -> None:
    assert decide(Demand(10, 0, 0, Work(600, 0)), 0, (), BASE, now=0).desired == 5


@pytest.mark.parametrize(
    ("loads", "seconds"),
    [
        ([], 0.0),
        ([JobTypeWork("ocr", 3, 1, 2, 10.0, 4)], 60.0),
        ([JobTypeWork("ocr", 3, 0, 0, 10.0, 1), JobTypeWork("embed", 100, 0, 0, 0.5, 9)], 80.0),
        ([JobTypeWork("new", 2, 0, 0, None, 0)], 120.0),  # no recent attempt: the default
    ],
)
def test_work_seconds(loads: list[JobTypeWork], seconds: float) -> None:
    assert work_seconds(loads, default_job_seconds=60.0) == pytest.approx(seconds)


def test_work_no_live_worker_serves_is_not_the_pools_work() -> None:
    loads = [
        JobTypeWork("ocr", ready=5, scheduled_soon=1, running=2, mean_seconds=3.0, samples=9),
        JobTypeWork("resize", ready=4, scheduled_soon=1, running=0, mean_seconds=None, samples=0),
    ]
    # Live workers on "a" lack "resize"; "b" has none live, so its jobs are not listed.
    unserved = [UnservedWork("a", "resize", 3, 12.0)]
    kept = servable(loads, unserved)
    assert [(t.job_type, t.ready, t.scheduled_soon) for t in kept] == [
        ("ocr", 5, 1),
        ("resize", 1, 1),
    ]
    assert servable(loads, []) == loads


def settle(demand: Demand, current: int, spec: PoolSpec = BASE) -> Decision:
    """The decision after the same reading every 10 s for longer than the windows."""
    history: tuple[Recommendation, ...] = ()
    for t in range(0, 200, 10):
        decision = decide(demand, current, history, spec, now=t)
        history, current = decision.history, decision.desired
    return decision


def test_a_job_coming_within_the_window_keeps_its_pod() -> None:
    """An idle pod whose next job is due within the scale-down window stays; without a job
    coming the same readings shrink the pool to zero."""
    assert settle(Demand(0, 0, 0, coming=1), 1).desired == 1
    assert settle(Demand(0, 0, 0), 1).desired == 0
    history = decide(Demand(0, 0, 0), 1, (), BASE, now=0).history
    history = decide(Demand(0, 0, 0), 1, history, BASE, now=30).history
    held = decide(Demand(0, 0, 0, coming=1), 1, history, BASE, now=61)
    assert held.desired == 1
    assert held.reason.startswith("hold for jobs due within the scale-down window")
    assert "1 due within the scale-down window" in held.reason


def test_coming_jobs_add_no_replicas_and_keep_only_what_they_need() -> None:
    assert settle(Demand(0, 0, 0, coming=7), 0).desired == 0
    assert settle(Demand(0, 0, 0, coming=3), 6).desired == 2  # ceil(3 / 2) of 6
    assert settle(Demand(0, 0, 0, coming=99), 10, replace(BASE, max_replicas=4)).desired == 4


def test_a_work_pool_keeps_a_pod_for_a_coming_job_but_sizes_by_work() -> None:
    spec = replace(BASE, scale_on=ScaleOn.WORK, work=WorkSpec(startup_seconds=0))
    assert settle(Demand(0, 0, 0, Work(0, 0, active=3), coming=1), 3, spec).desired == 1


def test_the_lead_time_is_the_spec_or_the_start_up_time() -> None:
    assert lead_seconds(BASE, None) == 30.0  # work.startupSeconds' default
    assert lead_seconds(BASE, 75.0) == 75.0  # the model load the workers reported
    assert lead_seconds(replace(BASE, scale_ahead_seconds=5.0), 75.0) == 5.0
    assert lead_seconds(replace(BASE, scale_ahead_seconds=0.0), 75.0) == 0.0
    assert soon_seconds(BASE, 30.0) == 40.0  # plus one poll
    assert coming_seconds(BASE, 30.0) == 60.0  # the window
    assert coming_seconds(replace(BASE, scale_down_seconds=0), 30.0) == 40.0  # at least soon


def test_slots_due_soon_are_work_of_their_job_type() -> None:
    loads = [JobTypeWork("ocr", 1, 0, 0, 10.0, 3)]
    assert with_slots(loads, ["ocr", "report", "report"]) == [
        JobTypeWork("ocr", 1, 1, 0, 10.0, 3),
        JobTypeWork("report", 0, 2, 0, None, 0),
    ]
    assert with_slots(loads, []) == loads
