"""Durable steps (ctx.step) against a real PostgreSQL: recorded once, uncertain outcomes
reconciled or stopped, settled by an operator, and every write fenced by the lease."""

from __future__ import annotations

import asyncio

import pytest
from psycopg_pool import AsyncConnectionPool

import leaseq
from leaseq.aio import AsyncQueue
from leaseq.runtime.context import Interrupted, JobContext, StopReason
from leaseq.runtime.steps import StepNameReused
from support.dbtime import claim_one
from support.steps import context, crash_in, stop_uncertain, take_over


def test_a_recorded_step_is_returned_without_calling_it_again(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    first = context(queue, claim_one(queue))
    calls: list[int] = []
    assert first.step("fetch", lambda n: calls.append(n) or {"n": n, "t": (1, 2)}, 7) == {
        "n": 7,
        "t": [1, 2],
    }
    with pytest.raises(StepNameReused, match="step 'fetch' ran already in this attempt"):
        first.step("fetch", lambda: None)

    second = context(queue, take_over(queue, conn, "w2"))
    assert second.step("fetch", lambda n: calls.append(n), 8) == {"n": 7, "t": [1, 2]}
    assert calls == [7]
    [step] = queue.steps(job_id)
    assert (step.name, step.attempt, step.lease_token, step.recorded) == ("fetch", 1, 1, True)


def test_a_step_whose_function_raised_runs_afresh_on_the_next_attempt(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    queue.enqueue("q", "t")
    first = context(queue, claim_one(queue))

    def flaky() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError):
        first.step("call", flaky)
    second = context(queue, take_over(queue, conn, "w2"))
    # No intent is left: no reconcile is needed, and none is called.
    assert second.step("call", lambda: "ok", reconcile=lambda i: pytest.fail("reconciled")) == "ok"


def test_an_uncertain_step_is_reconciled_once_and_not_repeated(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    queue.enqueue("q", "t")
    first = context(queue, claim_one(queue))
    effects: list[str] = []
    crash_in(first, "charge", effects)

    second = context(queue, take_over(queue, conn, "w2"))
    intents: list[leaseq.Intent] = []

    def check(intent: leaseq.Intent) -> dict[str, str]:
        intents.append(intent)
        if intent.key not in effects:
            raise leaseq.NotDone
        return {"charged": intent.key}

    result = second.step("charge", lambda: pytest.fail("ran again"), reconcile=check)
    assert result == {"charged": effects[0]}
    [intent] = intents
    assert (intent.step, intent.attempt, intent.lease_token) == ("charge", 1, 1)
    assert effects == [f"job:{intent.job_id}:step:charge"]


def test_reconcile_saying_not_done_runs_the_function_again(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    queue.enqueue("q", "t")
    crash_in(context(queue, claim_one(queue)), "charge", [])
    second = context(queue, take_over(queue, conn, "w2"))

    def check(intent: leaseq.Intent) -> None:
        raise leaseq.NotDone

    assert second.step("charge", lambda: "paid", reconcile=check) == "paid"


def test_an_idempotent_step_runs_again_under_the_same_key(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    queue.enqueue("q", "t")
    first = context(queue, claim_one(queue))
    keys: list[str] = []
    crash_in(first, "put", keys, idempotent=True)
    second = context(queue, take_over(queue, conn, "w2"))
    assert second.step("put", lambda: keys.append(second.step_key) or "stored", idempotent=True)
    assert keys[0] == keys[1]


def test_without_reconcile_the_job_stops_uncertain_until_an_operator_settles_it(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    crash_in(context(queue, claim_one(queue)), "charge", [])
    attempt = take_over(queue, conn, "w2")
    second = context(queue, attempt)
    with pytest.raises(leaseq.StepUncertain, match="step 'charge' is uncertain") as raised:
        second.step("charge", lambda: pytest.fail("ran again"))
    queue.fail(attempt.lease, str(raised.value), retryable=False, error_code="StepUncertain")
    [found] = queue.uncertain_steps()
    assert (found.job_id, found.name, found.attempt) == (job_id, "charge", 1)

    with pytest.raises(leaseq.JobStateError, match="has no step 'other'"):
        queue.resolve_step(job_id, "other", result=1, actor="ops", reason="checked")
    with pytest.raises(leaseq.InvalidJob, match="reason"):
        queue.resolve_step(job_id, "charge", result=1, actor="ops", reason=" ")
    queue.resolve_step(job_id, "charge", result={"charged": "by hand"}, actor="ops", reason="bank")
    assert queue.get(job_id).status == "pending"
    assert queue.uncertain_steps() == []
    with pytest.raises(leaseq.JobStateError, match="not uncertain: it has a result"):
        queue.resolve_step(job_id, "charge", retry=True, actor="ops", reason="again")

    third = context(queue, claim_one(queue, "w3"))
    assert third.step("charge", lambda: pytest.fail("ran again")) == {"charged": "by hand"}
    [step] = queue.steps(job_id)
    assert (step.resolved_by, step.resolve_reason) == ("ops", "bank")


def test_a_retry_resolution_runs_the_step_again(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    stop_uncertain(queue, conn, context(queue, claim_one(queue)), "charge")
    queue.resolve_step(job_id, "charge", retry=True, actor="ops", reason="not in the ledger")
    third = context(queue, claim_one(queue, "w3"))
    assert third.step("charge", lambda: "paid") == "paid"


def test_the_asyncio_twin_lists_and_settles_an_uncertain_step(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn, database_url: str
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    stop_uncertain(queue, conn, context(queue, claim_one(queue)), "charge")

    async def main() -> list[leaseq.StepRecord]:
        async with AsyncConnectionPool(
            database_url, min_size=1, max_size=1, kwargs={"autocommit": True}
        ) as apool:
            aqueue = AsyncQueue(apool)
            assert await aqueue.uncertain_steps() == queue.uncertain_steps()
            with pytest.raises(leaseq.JobStateError, match="has no step 'other'"):
                await aqueue.resolve_step(job_id, "other", result=1, actor="ops", reason="x")
            with pytest.raises(leaseq.InvalidJob, match="reason"):
                await aqueue.resolve_step(job_id, "charge", result=1, actor="ops", reason="")
            await aqueue.resolve_step(job_id, "charge", result="paid", actor="ops", reason="ok")
            assert await aqueue.uncertain_steps() == []
            return await aqueue.steps(job_id)

    [step] = asyncio.run(main())
    assert step == queue.steps(job_id)[0]
    assert (step.result, step.resolved_by, step.resolve_reason) == ("paid", "ops", "ok")
    assert queue.get(job_id).status == "pending"


def test_a_stale_attempt_records_nothing_and_learns_it_lost_its_lease(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    stale = context(queue, claim_one(queue))
    current: list[JobContext] = []

    def slow() -> str:
        # While this attempt is inside its step, its job is reaped and claimed again.
        current.append(context(queue, take_over(queue, conn, "w2")))
        return "stale"

    with pytest.raises(Interrupted, match="lease lost"):
        stale.step("write", slow)
    assert stale.stop_reason is StopReason.LEASE_LOST
    [step] = queue.steps(job_id)
    assert (step.recorded, step.lease_token) == (False, 1)
    # A stale attempt cannot even start a step.
    with pytest.raises(Interrupted, match="lease lost"):
        context(queue, stale._job).step("other", lambda: pytest.fail("ran"))
    assert current[0].step("write", lambda: "fresh", idempotent=True) == "fresh"
    assert [s.result for s in queue.steps(job_id)] == ["fresh"]


def test_each_member_of_a_batch_has_its_own_steps(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    # A batch handler gets one ctx per job: the same step name is each job's own.
    ids = [queue.enqueue("q", "t", {"n": n}).job_id for n in (1, 2)]
    members = [context(queue, job) for job in queue.claim(["q"], "w1", limit=2)]
    assert [m.step("embed", lambda n: n * 10, m.payload["n"]) for m in members] == [10, 20]
    assert [[s.result for s in queue.steps(i)] for i in ids] == [[10], [20]]


def test_a_plain_step_refuses_an_async_function_and_leaves_no_intent(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    ctx = context(queue, claim_one(queue))

    async def call() -> str:
        return "never run"

    with pytest.raises(leaseq.InvalidJob, match=r"step 'call'.*await ctx.step_async"):
        ctx.step("call", call)
    # The intent was withdrawn: the step is neither recorded nor uncertain.
    [step] = queue.steps(job_id)
    assert (step.name, step.recorded, step.intended) == ("call", False, False)


def test_step_async_awaits_the_function_and_the_check(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    queue.enqueue("q", "t")
    first = context(queue, claim_one(queue))

    async def fetch(n: int) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"n": n}

    assert asyncio.run(first.step_async("fetch", fetch, 7)) == {"n": 7}
    effects: list[str] = []
    crash_in(first, "charge", effects)

    second = context(queue, take_over(queue, conn, "w2"))
    checked: list[str] = []

    async def check(intent: leaseq.Intent) -> dict[str, str]:
        await asyncio.sleep(0)
        checked.append(intent.key)
        if intent.key not in effects:
            raise leaseq.NotDone
        return {"charged": intent.key}

    async def charge_again() -> None:
        pytest.fail("the charge ran again")

    async def steps() -> tuple[object, object]:
        memo = await second.step_async("fetch", pytest.fail)  # recorded: not called
        charged = await second.step_async("charge", charge_again, reconcile=check)
        return memo, charged

    assert asyncio.run(steps()) == ({"n": 7}, {"charged": effects[0]})
    assert checked == effects


def test_a_step_whose_function_returns_none_is_recorded_and_not_run_again(
    queue: leaseq.Queue, conn: leaseq.core.db.Conn
) -> None:
    job_id = queue.enqueue("q", "t").job_id
    calls: list[str] = []
    first = context(queue, claim_one(queue))
    assert first.step("notify", lambda: calls.append("first")) is None
    second = context(queue, take_over(queue, conn, "w2"))
    assert second.step("notify", lambda: calls.append("second")) is None
    assert calls == ["first"]
    [step] = queue.steps(job_id)
    assert (step.name, step.recorded, step.result) == ("notify", True, None)
