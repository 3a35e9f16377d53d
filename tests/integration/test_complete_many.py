"""Queue.complete_many: several completions in one statement, each fenced on its own."""

from datetime import timedelta

import leaseq


def test_complete_many_completes_each_held_lease(queue: leaseq.Queue) -> None:
    ids = [queue.enqueue("q", "t", idempotency_key=f"k{i}").job_id for i in range(3)]
    jobs = queue.claim(["q"], "w1", limit=3)
    answers = queue.complete_many([j.lease for j in jobs], [{"n": j.id} for j in jobs])
    assert [a.job_id for a in answers] == [j.id for j in jobs]
    assert all(isinstance(a, leaseq.Completed) and a.effect_written for a in answers)
    for job_id in ids:
        assert queue.get(job_id).status == "succeeded"
        [attempt] = queue.attempts(job_id)
        assert attempt.outcome == "succeeded"
    effect = queue.effect("k0")
    assert effect is not None
    assert effect.produced_by == "w1"


def test_complete_many_fences_only_the_stale_lease(queue: leaseq.Queue) -> None:
    for _ in range(2):
        queue.enqueue("q", "t")
    first, second = queue.claim(["q"], "w1", limit=2, lease_seconds=1)
    later = first.lease.started_at + timedelta(seconds=5)
    queue.reap(now=later)  # both leases expired; both jobs back to pending
    [again] = queue.claim(["q"], "w2", limit=1, now=later + timedelta(seconds=700))
    stale = second if again.id == first.id else first  # reaped, not reclaimed
    answers = queue.complete_many([stale.lease, again.lease], now=later + timedelta(seconds=701))
    assert isinstance(answers[0], leaseq.Fenced)
    assert isinstance(answers[1], leaseq.Completed)
    assert queue.get(again.id).status == "succeeded"


def test_complete_many_repeat_effect_is_a_no_op(queue: leaseq.Queue) -> None:
    queue.enqueue("q", "t", idempotency_key="invoice-1")
    queue.enqueue("q", "t", idempotency_key="invoice-1")
    jobs = queue.claim(["q"], "w1", limit=2)
    answers = queue.complete_many([j.lease for j in jobs])
    written = [a.effect_written for a in answers if isinstance(a, leaseq.Completed)]
    assert sorted(written) == [False, True]


def test_complete_many_sends_any_owner_and_mixed_results(queue: leaseq.Queue) -> None:
    # The arrays go as input literals (store._text_array): owners with the characters the
    # array syntax gives meaning to must still match their jobs' owners exactly (a mangled
    # one would be fenced).
    owners = ['w"1', "w\\2", "w,3", "{w4}", " NULL ", "w1"]
    claimed = []
    for owner in owners:
        queue.enqueue("q", "t")
        [job] = queue.claim(["q"], owner, limit=1)
        claimed.append(job)
    results = [None, {"n": 2}, None, [4], None, "six"]
    answers = queue.complete_many([j.lease for j in claimed], results)
    assert all(isinstance(a, leaseq.Completed) for a in answers)
    assert [queue.get(j.id).result for j in claimed] == results
    assert [a.worker for j in claimed for a in queue.attempts(j.id)] == owners
    # With every result None, the arrays of results, keys, progress and notes go as NULL.
    queue.enqueue("q", "t")
    [job] = queue.claim(["q"], "w1", limit=1)
    [answer] = queue.complete_many([job.lease])
    assert isinstance(answer, leaseq.Completed)
    assert queue.get(job.id).status == "succeeded"
