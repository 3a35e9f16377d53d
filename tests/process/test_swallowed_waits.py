"""A handler that catches what ``ctx.sleep`` or ``ctx.wait_for`` raise cannot turn the sleep
or wait into a success, in real worker processes (plain and ``async def`` handlers, threads
and child processes): the control-flow exceptions are not ``Exception``s, so ``except
Exception`` lets them through, and a handler that catches them anyway (``except
BaseException``) and returns or raises something else still ends its attempt as the sleep
or wait it asked for."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.process

#: (what the handler catches, what it does then)
CATCHES = [("exception", "return"), ("base", "return"), ("base", "raise")]


@pytest.mark.parametrize(
    ("app", "isolation"),
    [
        ("steps_app:registry", "thread"),
        ("async_app:registry", "thread"),
        ("steps_app:registry", "process"),
    ],
    ids=["sync", "async", "sync-process"],
)
def test_a_caught_sleep_or_wait_still_ends_the_attempt_as_asked(
    queue: leaseq.Queue,
    spawn_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
    app: str,
    isolation: str,
) -> None:
    jobs = {
        (call, catch, then): queue.enqueue(
            "q", "swallow", {"dir": str(tmp_path), "call": call, "catch": catch, "then": then}
        ).job_id
        for call in ("sleep", "wait")
        for catch, then in CATCHES
    }
    spawn_worker("w-1", app=app, concurrency=2, isolation=isolation)

    def handed_back(job_id: int) -> bool:
        return [a.outcome for a in queue.attempts(job_id)] == ["released"]

    wait_for(lambda: all(map(handed_back, jobs.values())), "every job to be handed back", 60)
    for (call, catch, then), job_id in jobs.items():
        job = queue.get(job_id)
        what = f"{call} caught by {catch}, then {then}"
        assert (job.status, job.attempt_count, job.result) == ("pending", 0, None), what
        [attempt] = queue.attempts(job_id)
        expected = "waiting for signal 'approve'" if call == "wait" else "sleeping until"
        assert (attempt.error or "").startswith(expected), what
        assert job.waiting_for == ("approve" if call == "wait" else None), what
        step = "leaseq.wait-1" if call == "wait" else "leaseq.sleep-1"
        assert [s.name for s in queue.steps(job_id)] == [step], what

    # ``except Exception`` caught neither; only ``except BaseException`` did.
    assert sorted((tmp_path / "caught").read_text().split()) == ["base"] * 4

    # The wait the handler tried to swallow resumes on its signal.
    waiter = jobs[("wait", "exception", "return")]
    assert queue.signal(waiter, "approve", {"by": "ana"}).waiting
    done = wait_for(
        lambda: (j := queue.get(waiter)).status == "succeeded" and j, "the waiter to resume", 60
    )
    assert done.result == {"decision": {"by": "ana"}}
