"""The scaling policy, driven through scenarios: each step is one reading at time t.

The Deployment follows every decision (current = last desired), as it would in a cluster.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from leaseq.operator.scaling import Decision, Demand, Recommendation, decide, replicas_for
from leaseq.operator.spec import PoolSpec

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
