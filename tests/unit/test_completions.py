"""The completion loop's grouping (leaseq.runtime.completions), with a recording settlement:
which results share one ``complete_many``, and which thread delivers them."""

from __future__ import annotations

import threading
from typing import Any, cast

from leaseq.runtime.completions import Completions
from leaseq.runtime.inflight import InFlight
from leaseq.runtime.outcomes import Settler
from leaseq.runtime.settlement import Done, Settlement
from support.polling import wait_for

#: Longer than any test waits: a group that waits out its window fails the test instead.
NEVER = 120.0


class Attempt:
    """What the loop reads of an in-flight attempt."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.settled_by: Settler | None = None

    def take(self, by: Settler) -> bool:
        if self.settled_by is not None:
            return False
        self.settled_by = by
        return True


class Recorder:
    """Stands for the settlement: records each group (job ids) and the thread it ran on."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.threads: list[int] = []

    def complete(self, group: list[Done]) -> None:
        self.groups.append([cast(Attempt, d.attempt).job_id for d in group])
        self.threads.append(threading.get_ident())


class Handlers:
    """The worker's count of handlers that have not reported, and their reports."""

    def __init__(self, running: int, window: float = NEVER) -> None:
        self.running = running
        self.recorder = Recorder()
        self.finished: list[int] = []
        self.loop = Completions(
            cast(Settlement, self.recorder),
            running=lambda: self.running,
            finished=lambda attempts: self.finished.extend(
                cast(Attempt, a).job_id for a in attempts
            ),
            after=lambda: None,
            window=window,
        )

    def report(self, job_id: int) -> None:
        """A handler returns: counted first, then handed in (the worker's order)."""
        self.running -= 1
        attempt: Any = Attempt(job_id)
        self.loop.put([Done(cast(InFlight, attempt), None, None)])


def test_results_of_running_handlers_form_one_group_sent_when_the_last_reports() -> None:
    # The window is longer than the test may take: only the last result can close the group.
    handlers = Handlers(running=5)
    thread = handlers.loop.start()
    for job_id in range(1, 6):
        handlers.report(job_id)
    wait_for(lambda: handlers.recorder.groups, "the group to be completed", timeout=20.0)
    assert handlers.recorder.groups == [[1, 2, 3, 4, 5]]
    assert handlers.recorder.threads == [thread.ident]
    assert sorted(handlers.finished) == [1, 2, 3, 4, 5]
    handlers.loop.close()
    thread.join(20.0)
    assert not thread.is_alive()


def test_a_result_nothing_could_join_is_delivered_by_the_thread_that_hands_it_in() -> None:
    handlers = Handlers(running=1)
    handlers.report(7)  # the loop thread is not even started
    assert handlers.recorder.groups == [[7]]
    assert handlers.recorder.threads == [threading.get_ident()]


def test_the_window_closes_a_group_while_other_handlers_still_run() -> None:
    handlers = Handlers(running=3, window=0.05)
    thread = handlers.loop.start()
    handlers.report(1)
    wait_for(lambda: handlers.recorder.groups, "the window to close the group", timeout=20.0)
    assert handlers.recorder.groups == [[1]]
    handlers.loop.close()
    thread.join(20.0)


def test_close_delivers_what_was_handed_in_before_it() -> None:
    handlers = Handlers(running=3)
    thread = handlers.loop.start()
    handlers.report(1)
    handlers.report(2)
    handlers.loop.close()
    thread.join(20.0)
    assert not thread.is_alive()
    assert [job for group in handlers.recorder.groups for job in group] == [1, 2]
