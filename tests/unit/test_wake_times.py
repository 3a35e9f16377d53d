"""A durable sleep's wake-up (issue 60): the payload a hand-back notifies, the listener's
timers, and which wake-ups a worker acts on. The clock is a fake: nothing here sleeps."""

from __future__ import annotations

import threading

import pytest

from leaseq.core.notifications import Wakeup, parse
from leaseq.runtime.health import Health
from leaseq.runtime.listener import Listener
from leaseq.runtime.wake_times import WakeTimes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("payload", "wakeup"),
    [
        ("q", Wakeup("q")),
        ("q 1.250000 nap", Wakeup("q", 1.25, "nap")),
        # A job type may hold spaces; a queue name never does.
        ("q 2 send mail", Wakeup("q", 2.0, "send mail")),
        # A wake time that passed while the notification travelled: claimable now.
        ("q -0.5 nap", Wakeup("q", 0.0, "nap")),
        # Anything else names no queue a worker serves.
        ("q soon nap", Wakeup("q soon nap")),
        ("q 1.5", Wakeup("q 1.5")),
        ("q NaN nap", Wakeup("q NaN nap")),
        ("q inf nap", Wakeup("q inf nap")),
    ],
)
def test_a_payload_says_a_queue_and_when_its_job_is_claimable(payload: str, wakeup: Wakeup) -> None:
    assert parse(payload) == wakeup


def test_each_wake_time_wakes_once_and_times_that_come_together_wake_once() -> None:
    clock = Clock()
    times = WakeTimes(clock=clock)
    assert times.wait(1.0) == 1.0 and not times.due()
    for seconds in (3.0, 0.5, 0.5, 2.0):
        times.add(seconds)
    assert times.wait(1.0) == 0.5
    clock.now += 0.5
    assert times.wait(1.0) == 0.0
    assert times.due() and not times.due()
    assert times.wait(10.0) == pytest.approx(1.5)
    clock.now += 5.0
    assert times.due() and len(times) == 0 and not times.due()


def test_a_far_wake_time_waits_at_most_the_longest_and_the_latest_go_past_the_limit() -> None:
    clock = Clock()
    times = WakeTimes(limit=2, clock=clock)
    times.add(3600.0 * 24 * 3650)
    assert times.wait(1.0) == 1.0 and not times.due()
    times.add(7.0)
    times.add(5.0)
    assert len(times) == 2
    clock.now += 6.0
    assert times.due() and len(times) == 1  # 7 s is kept, the ten years went
    clock.now += 1.0
    assert times.due() and len(times) == 0


class Subscription:
    """Hands out the given batches, one a call, then nothing; records each call's timeout."""

    def __init__(self, *batches: list[Wakeup]) -> None:
        self.batches = list(batches)
        self.timeouts: list[float] = []

    def receive(self, timeout: float) -> list[Wakeup]:
        self.timeouts.append(timeout)
        return self.batches.pop(0) if self.batches else []


def listener(clock: Clock) -> tuple[Listener, list[int]]:
    woken: list[int] = []
    listening = Listener(
        "dbname=unused",
        ["q"],
        lambda: woken.append(1),
        job_types=["nap"],
        health=Health(),
        stopping=threading.Event(),
    )
    listening.wake_times = WakeTimes(clock=clock)
    return listening, woken


def test_the_listener_wakes_the_dispatcher_at_a_served_jobs_wake_time_only() -> None:
    clock = Clock()
    listening, woken = listener(clock)
    sub = Subscription(
        [
            Wakeup("other", 1.0, "nap"),  # a queue it does not serve
            Wakeup("q", 1.0, "other"),  # a type it does not serve
            Wakeup("q", 3600.0, "nap"),  # far away
            Wakeup("q", 2.0, "nap"),
        ]
    )
    listening._receive(sub)
    assert woken == [] and len(listening.wake_times) == 2
    listening._receive(sub)
    # It waits for notifications until the nearest wake time, not a second longer.
    assert sub.timeouts == [1.0, 1.0] and woken == []
    clock.now += 1.5
    listening._receive(sub)
    assert sub.timeouts[-1] == pytest.approx(0.5) and woken == []
    clock.now += 0.5
    listening._receive(sub)
    assert sub.timeouts[-1] == 0.0 and woken == [1]
    # Woken once for that time; the far one waits, and no receive is cut short for it.
    for _ in range(3):
        listening._receive(sub)
    assert woken == [1] and sub.timeouts[-3:] == [1.0, 1.0, 1.0]


def test_a_job_claimable_now_wakes_at_once_and_a_batch_wakes_once() -> None:
    clock = Clock()
    listening, woken = listener(clock)
    listening._receive(Subscription([Wakeup("q"), Wakeup("q"), Wakeup("other")]))
    assert woken == [1]
    listening._receive(Subscription([Wakeup("other")]))
    assert woken == [1]
