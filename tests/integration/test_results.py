"""Producers wait for results: ``result()`` / ``wait_any`` / ``as_completed`` on the sync
face (:class:`leaseq.Queue`) and the asyncio face (:class:`leaseq.aio.AsyncQueue`), run by
the same cases. The notification is only a wake-up; every case finishes jobs through the real
worker-side statements (claim, then complete / fail / cancel)."""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import leaseq
from leaseq.aio import AsyncQueue
from leaseq.core import waiters
from leaseq.core._store.store import Store
from support.polling import wait_for

# A poll far longer than any case's timeout: a missed wake-up then fails the case with
# ResultTimeout instead of being rescued by the safety poll.
NO_POLL = 3600.0
#: How long a waiter with the poll off may wait. At its timeout a waiter reads once more, which
#: would rescue a lost wake-up; :meth:`Face.woken` fails a result that came only from there.
WAKE_TIMEOUT = 20.0


class Face:
    """One face of the producer API, called synchronously (async calls run on one loop)."""

    def __init__(self, kind: str, database_url: str) -> None:
        self.kind = kind
        self.url = database_url
        self._sync_pool: leaseq.Pool | None = None
        self._runner: asyncio.Runner | None = None
        self._apool: AsyncConnectionPool[Any] | None = None
        if kind == "sync":
            self._sync_pool = leaseq.open_pool(database_url, max_size=20)
            self.queue: Any = leaseq.Queue(self._sync_pool)
        else:
            self._runner = asyncio.Runner()
            self._apool = AsyncConnectionPool(
                database_url, min_size=1, max_size=20, open=False, kwargs={"autocommit": True}
            )
            self._runner.run(self._apool.open())
            self.queue = AsyncQueue(self._apool)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        value = getattr(self.queue, name)(*args, **kwargs)
        if self._runner is not None:
            # The caller's context, as asyncio.run would take it (the handler flag is in it).
            return self._runner.run(value, context=contextvars.copy_context())
        return value

    def woken(self, name: str, *args: Any) -> Any:
        """``name(*args)`` with the poll off, failing unless the answer came before its
        timeout: only a wake-up (a notification, or a reconnect's wake) can bring it then."""
        started = time.monotonic()
        value = self.call(name, *args, timeout=WAKE_TIMEOUT, poll=NO_POLL)
        waited = time.monotonic() - started
        assert waited < WAKE_TIMEOUT, "answered by the read at the timeout: no wake-up came"
        return value

    def enqueue_in_transaction(self, *, commit: bool) -> tuple[int, bool]:
        """Enqueue through a connection of this face's kind inside its open transaction, then
        commit or roll back; the job id, and whether another session saw it before the end."""
        if self._runner is None:
            with psycopg.connect(self.url) as c:
                job = self.queue.enqueue("q", "t", conn=c)
                seen = _exists(self.url, job.job_id)
                c.commit() if commit else c.rollback()
            return job.job_id, seen

        async def run() -> tuple[int, bool]:
            async with await psycopg.AsyncConnection.connect(self.url) as c:
                job = await self.queue.enqueue("q", "t", conn=c)
                seen = _exists(self.url, job.job_id)
                await (c.commit() if commit else c.rollback())
            return job.job_id, seen

        return self._runner.run(run())

    def listener(self) -> Any:
        if self._runner is not None:

            async def get() -> Any:
                return waiters.shared_async_listener(self._apool.conninfo)  # type: ignore[union-attr]

            return self._runner.run(get())
        return waiters.shared_listener(self.queue._conninfo())

    def wait_for(self, check: Any, what: str) -> None:
        """Poll ``check`` until true, with this face's event loop running meanwhile (an
        asyncio listener only moves while its loop runs)."""
        if self._runner is None:
            wait_for(check, what)
            return

        async def poll() -> None:
            await asyncio.to_thread(wait_for, check, what)

        self._runner.run(poll())

    def close(self) -> None:
        if self._runner is not None:
            assert self._apool is not None
            listener = self.listener()
            self._runner.run(listener.close())
            self._runner.run(self._apool.close())
            self._runner.close()
        if self._sync_pool is not None:
            waiters.shared_listener(self.queue._conninfo()).close()
            self._sync_pool.close()


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest, database_url: str) -> Iterator[Face]:
    f = Face(request.param, database_url)
    try:
        yield f
    finally:
        f.close()


def run_job(queue: leaseq.Queue, result: Any = None, *, fail: str | None = None) -> int:
    """Claim the next job of queue q and complete it with ``result`` (or fail it
    permanently with ``fail``); its id."""
    (job,) = queue.claim(["q"], "w1")
    if fail is not None:
        queue.fail(job.lease, error=fail, error_code="BAD_INPUT", retryable=False)
    else:
        queue.complete(job.lease, result)
    return job.id


def test_result_returns_the_stored_result(face: Face, queue: leaseq.Queue) -> None:
    job = face.call("enqueue", "q", "t", {"n": 1})
    run_job(queue, {"text": "hello"})
    assert face.call("result", job.job_id, timeout=30, poll=NO_POLL) == {"text": "hello"}


def test_result_wakes_on_completion_after_the_first_read(face: Face, queue: leaseq.Queue) -> None:
    job = face.call("enqueue", "q", "t")
    listener = face.listener()
    # The worker finishes once the waiter has read the row and waits (registered, flagged).
    done = threading.Thread(
        target=lambda: (
            wait_for(lambda: listener.waiters == 1 and queue.get(job.job_id), "a waiter"),
            wait_for(lambda: _flagged(face.url, job.job_id), "the job flagged"),
            run_job(queue, 7),
        )
    )
    done.start()
    try:
        assert face.woken("result", job.job_id) == 7
    finally:
        done.join()


def _flagged(url: str, job_id: int) -> bool:
    with psycopg.connect(url) as c:
        row = c.execute("SELECT notify_done FROM leaseq.jobs WHERE id = %s", (job_id,)).fetchone()
    return bool(row and row[0])


def test_dead_and_cancelled_jobs_raise_typed_errors(face: Face, queue: leaseq.Queue) -> None:
    dead = face.call("enqueue", "q", "t", max_attempts=1)
    run_job(queue, fail="page 3 is not an image")
    with pytest.raises(leaseq.JobDead) as raised:
        face.call("result", dead.job_id, timeout=30, poll=NO_POLL)
    assert raised.value.last_error == "page 3 is not an image"
    assert raised.value.error_code == "BAD_INPUT"
    assert raised.value.attempts == 1
    # It names commands that exist (it said `leaseq show`).
    assert f"see `leaseq jobs show {dead.job_id}` for its attempts" in str(raised.value)
    assert f"`leaseq retry {dead.job_id}` to run it again" in str(raised.value)
    gone = face.call("enqueue", "q", "t")
    queue.cancel(gone.job_id, reason="user gave up")
    with pytest.raises(leaseq.JobCancelled, match="user gave up"):
        face.call("result", gone.job_id, timeout=30, poll=NO_POLL)


def test_timeout_raises_and_the_job_keeps_running_unless_asked(
    face: Face, queue: leaseq.Queue
) -> None:
    job = face.call("enqueue", "q", "t")
    with pytest.raises(leaseq.ResultTimeout) as raised:
        face.call("result", job.job_id, timeout=0, poll=NO_POLL)
    assert raised.value.cancelled is False
    assert queue.get(job.job_id).status == leaseq.JobStatus.PENDING
    with pytest.raises(leaseq.ResultTimeout) as raised:
        face.call("result", job.job_id, timeout=0, cancel_on_timeout=True, poll=NO_POLL)
    assert raised.value.cancelled is True
    assert queue.get(job.job_id).status == leaseq.JobStatus.CANCELLED


def test_unknown_job_is_not_found(face: Face) -> None:
    with pytest.raises(leaseq.JobNotFound):
        face.call("result", 987654, timeout=1)


def test_wait_any_returns_the_first_finished(face: Face, queue: leaseq.Queue) -> None:
    first = face.call("enqueue", "q", "t", priority=1)
    second = face.call("enqueue", "q", "t", priority=2)
    run_job(queue, "one")
    found = face.woken("wait_any", [second.job_id, first.job_id])
    assert (found.job_id, found.result) == (first.job_id, "one")


def test_as_completed_yields_each_job_as_it_finishes(queue: leaseq.Queue, pool: Any) -> None:
    waiting = leaseq.Queue(pool)
    ids = [queue.enqueue("q", "t", i, priority=i).job_id for i in range(3)]
    seen = []
    run_job(queue, "x")
    started = time.monotonic()
    for outcome in waiting.as_completed(ids, timeout=WAKE_TIMEOUT, poll=NO_POLL):
        seen.append(outcome.job_id)
        if len(seen) < len(ids):
            run_job(queue, "x")
    assert seen == ids
    # Each later job was woken for, not read at the timeout (see Face.woken).
    assert time.monotonic() - started < WAKE_TIMEOUT


def test_a_completion_racing_the_first_read_is_never_missed(
    face: Face, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job completes right after the waiter subscribed, at a random moment around its
    flag and first read; with no safety poll to rescue it, every round must still return."""
    real_sync, real_async = Store.job_watch, waiters.AsyncStore.job_watch
    worker: list[threading.Thread] = []
    armed: list[bool] = []  # set while result() runs (enqueue(wait=True) flags through it too)

    def finish_soon() -> None:
        if not armed:
            return
        armed.clear()
        delay = random.uniform(0, 0.004)
        worker.append(threading.Timer(delay, run_job, (queue, "raced")))
        worker[-1].start()

    def watch_sync(self: Store, conn: Any, ids: Any) -> list[int]:
        finish_soon()
        return real_sync(self, conn, ids)

    async def watch_async(self: Any, conn: Any, ids: Any) -> list[int]:
        finish_soon()
        return await real_async(self, conn, ids)

    monkeypatch.setattr(Store, "job_watch", watch_sync)
    monkeypatch.setattr(waiters.AsyncStore, "job_watch", watch_async)
    for _ in range(100):
        job = face.call("enqueue", "q", "t", wait=True)
        armed.append(True)
        assert face.woken("result", job.job_id) == "raced"
        worker[-1].join()


def test_waiting_inside_a_handler_is_refused(face: Face) -> None:
    job = face.call("enqueue", "q", "t")
    with waiters.handler_running(), pytest.raises(leaseq.WaitInHandler, match="deadlock"):
        face.call("result", job.job_id, timeout=1)


def _listening(url: str) -> list[int]:
    with psycopg.connect(url) as c:
        rows = c.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query = 'LISTEN leaseq_done' AND pid <> pg_backend_pid()"
        ).fetchall()
    return [r[0] for r in rows]


def _finish_once_waited(listener: Any, queue: leaseq.Queue, result: int) -> None:
    wait_for(lambda: listener.waiters == 1, "the waiter")
    run_job(queue, result)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_idle_listener_closes_its_connection_and_the_next_waiter_opens_one(
    database_url: str, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Nobody waiting for a while: the listening connection goes (a producer that stopped
    waiting holds none); a later waiter subscribes again and is still woken."""
    monkeypatch.setattr(waiters, "IDLE_CLOSE_SECONDS", 0.2)
    face = Face(kind, database_url)
    try:
        for n in range(2):
            job = face.call("enqueue", "q", "t", wait=True)
            listener = face.listener()
            finisher = threading.Thread(target=_finish_once_waited, args=(listener, queue, n))
            finisher.start()
            try:
                assert face.woken("result", job.job_id) == n
            finally:
                finisher.join()
            face.wait_for(lambda: not _listening(database_url), "the idle listener closed")
    finally:
        face.close()


def test_a_thousand_waiters_share_one_listening_connection(
    database_url: str, queue: leaseq.Queue
) -> None:
    ids = [s.job_id for s in queue.enqueue_many([leaseq.JobSpec("q", "t", i) for i in range(1000)])]

    async def main() -> list[Any]:
        async with AsyncConnectionPool(
            database_url, max_size=10, kwargs={"autocommit": True}
        ) as apool:
            aq = AsyncQueue(apool)
            listener = waiters.shared_async_listener(apool.conninfo)
            tasks = [asyncio.create_task(aq.result(i, timeout=60, poll=NO_POLL)) for i in ids]
            while listener.waiters < len(ids) or not _all_flagged(database_url):
                await asyncio.sleep(0.05)  # polling a condition, as wait_for does
            assert len(_listening(database_url)) == 1
            while True:
                jobs = queue.claim(["q"], "w1", limit=100)
                if not jobs:
                    break
                queue.complete_many([j.lease for j in jobs], [j.payload for j in jobs])
            results = await asyncio.gather(*tasks)
            await listener.close()
            return results

    assert asyncio.run(main()) == list(range(1000))


def _all_flagged(url: str) -> bool:
    with psycopg.connect(url) as c:
        row = c.execute("SELECT bool_and(j.notify_done) FROM leaseq.jobs j").fetchone()
    return bool(row and row[0])


def test_a_completion_while_the_listener_is_away_wakes_its_waiter_on_reconnect(
    face: Face, queue: leaseq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listening connection is killed and the job finishes before it is back: that
    notification went to nobody, so only the reconnect's wake of every waiter can return the
    result. The poll is off (a reconnect that wakes nobody fails with ResultTimeout) and the
    reconnect is held until the job has finished (so it cannot be the completion's own
    notification that wakes the waiter)."""
    finished = threading.Event()
    real_connect, real_aconnect = waiters.connect, waiters.aconnect

    def connect_after_finish(*args: Any, **kwargs: Any) -> Any:
        finished.wait(30)
        return real_connect(*args, **kwargs)

    async def aconnect_after_finish(*args: Any, **kwargs: Any) -> Any:
        await asyncio.to_thread(finished.wait, 30)
        return await real_aconnect(*args, **kwargs)

    job = face.call("enqueue", "q", "t")
    listener = face.listener()
    box: dict[str, Any] = {}

    def kill_then_finish() -> None:
        (pid,) = wait_for(lambda: _listening(face.url), "the listening connection")
        wait_for(lambda: listener.waiters == 1, "the waiter")
        subscriptions = listener.subscriptions
        # From here on the listener reconnects only once the job has finished.
        monkeypatch.setattr(waiters, "connect", connect_after_finish)
        monkeypatch.setattr(waiters, "aconnect", aconnect_after_finish)
        with psycopg.connect(face.url, autocommit=True) as c:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: pid not in _listening(face.url), "the listener gone")
        box["finished"] = run_job(queue, "still here")
        box["subscriptions"] = (subscriptions, listener.subscriptions)
        finished.set()

    killer = threading.Thread(target=kill_then_finish)
    killer.start()
    try:
        assert face.woken("result", job.job_id) == "still here"
    finally:
        finished.set()
        killer.join()
    assert box["finished"] == job.job_id
    # Not resubscribed while the job finished: the completion's notification was lost.
    before, at_finish = box["subscriptions"]
    assert at_finish == before
    assert listener.subscriptions == before + 1


def _lock_waiters(url: str) -> int:
    """How many backends wait for a row lock (a completion waiting for a flag, or back)."""
    with psycopg.connect(url) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def _watch(url: str, job_id: int) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        Store().job_watch(c, [job_id])


@pytest.mark.parametrize("first", ["flag", "completion"])
def test_a_flag_and_a_completion_racing_are_ordered_by_the_row_lock(
    database_url: str, queue: leaseq.Queue, first: str
) -> None:
    """Whichever commits first, the waiter learns of the completion: a flag first makes the
    completion notify; a completion first leaves the flag nothing to update, and the read
    that follows sees the job finished."""
    job = queue.enqueue("q", "t")
    (claimed,) = queue.claim(["q"], "w1")
    store = Store()
    with (
        psycopg.connect(database_url) as holder,
        psycopg.connect(database_url, autocommit=True) as listening,
    ):
        listening.execute("LISTEN leaseq_done")
        if first == "flag":
            store.job_watch(holder, [job.job_id])  # its transaction stays open
            other = threading.Thread(target=lambda: queue.complete(claimed.lease, "done"))
        else:
            store.job_complete(
                holder,
                [claimed.lease],
                results=["done"],
                effect_keys=[None],
                progresses=[None],
                notes=[None],
            )  # its transaction stays open
            other = threading.Thread(target=lambda: _watch(database_url, job.job_id))
        other.start()
        wait_for(lambda: _lock_waiters(database_url) == 1, "the other side waiting")
        holder.commit()
        other.join()
        notices = list(listening.notifies(timeout=30, stop_after=1)) if first == "flag" else []
        outcome = store.job_outcomes(holder, [job.job_id])[job.job_id]
    assert outcome.finished and outcome.result == "done"
    if first == "flag":
        assert [n.payload for n in notices] == [str(job.job_id)]


def test_a_completion_in_flight_while_flagging_is_waited_out(
    face: Face, queue: leaseq.Queue, database_url: str
) -> None:
    """The job finishes in a transaction that has not committed when the waiter flags it:
    the flag waits for that transaction's row lock, then the read sees the result."""
    job = face.call("enqueue", "q", "t")
    (claimed,) = queue.claim(["q"], "w1")
    with psycopg.connect(database_url) as finishing:
        leaseq.Queue(finishing).complete(claimed.lease, "late")  # not committed yet

        def commit_once_waited_for() -> None:
            wait_for(lambda: _lock_waiters(database_url) == 1, "the waiter waiting")
            finishing.commit()

        committer = threading.Thread(target=commit_once_waited_for)
        committer.start()
        try:
            assert face.woken("result", job.job_id) == "late"
        finally:
            committer.join()


def _exists(url: str, job_id: int) -> bool:
    with psycopg.connect(url) as c:
        return (
            c.execute("SELECT 1 FROM leaseq.jobs WHERE id = %s", (job_id,)).fetchone() is not None
        )


def test_enqueue_many_writes_all_or_none(face: Face, queue: leaseq.Queue) -> None:
    made = face.call(
        "enqueue_many",
        [leaseq.JobSpec("q", "t", {"n": n}, priority=n) for n in range(3)]
        + [leaseq.JobSpec("q", "t", dedup_key="once"), leaseq.JobSpec("q", "t", dedup_key="once")],
    )
    assert [m.created for m in made] == [True, True, True, True, False]
    assert made[3].job_id == made[4].job_id
    assert [queue.get(m.job_id).payload for m in made[:3]] == [{"n": 0}, {"n": 1}, {"n": 2}]
    # The second job passes validation but PostgreSQL refuses it (its available_at would be
    # out of range): the first, already inserted in the same transaction, goes too.
    with pytest.raises(leaseq.LeaseqError):
        face.call("enqueue_many", [leaseq.JobSpec("q", "t"), leaseq.JobSpec("q", "t", delay=1e300)])
    assert [s.ready for s in queue.stats()] == [4]
    assert face.call("enqueue_many", []) == []


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_enqueue_joins_the_callers_transaction(
    face: Face, queue: leaseq.Queue, commit: bool
) -> None:
    job_id, seen_before = face.enqueue_in_transaction(commit=commit)
    assert not seen_before
    assert _exists(face.url, job_id) is commit


def test_get_and_retry_dead(face: Face, queue: leaseq.Queue) -> None:
    job = face.call("enqueue", "q", "t", {"doc": 1}, max_attempts=1)
    record = face.call("get", job.job_id)
    assert (record.status, record.payload, record.max_attempts) == ("pending", {"doc": 1}, 1)
    with pytest.raises(leaseq.JobStateError, match="only dead jobs can be retried"):
        face.call("retry_dead", job.job_id)
    run_job(queue, fail="bad page")
    assert face.call("get", job.job_id).status == "dead"
    assert face.call("retry_dead", job.job_id, attempts=2) == 3
    record = face.call("get", job.job_id)
    assert (record.status, record.max_attempts) == ("pending", 3)
    assert run_job(queue, "ok") == job.job_id
    assert face.call("result", job.job_id, timeout=30) == "ok"
    with pytest.raises(leaseq.JobNotFound):
        face.call("get", 10**9)
    with pytest.raises(leaseq.JobNotFound):
        face.call("retry_dead", 10**9)


@pytest.mark.parametrize("wait", [False, True])
def test_only_a_flagged_job_runs_the_completion_trigger(
    database_url: str, queue: leaseq.Queue, wait: bool
) -> None:
    """An unwatched job's completion calls no function (the trigger's WHEN reads the flag);
    a job enqueued with wait=True calls the status trigger's function once."""
    job = queue.enqueue("q", "t", wait=wait)
    (claimed,) = queue.claim(["q"], "w1")
    with psycopg.connect(database_url) as c:
        c.execute("SET track_functions = 'pl'")
        Store().job_complete(
            c, [claimed.lease], results=[1], effect_keys=[None], progresses=[None], notes=[None]
        )
        row = c.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
            " WHERE schemaname = 'leaseq' AND funcname = 'jobs_on_status'"
        ).fetchone()
    assert row is not None
    assert int(row[0]) == (1 if wait else 0)
    assert queue.get(job.job_id).status == leaseq.JobStatus.SUCCEEDED


def test_both_faces_enqueue_flow_keys(face: Face) -> None:
    """The asyncio face takes key and ordering_key as the sync face does."""
    job = face.call("enqueue", "q", "t", key="tenant-42", ordering_key="order-17")
    with psycopg.connect(face.url) as c:
        row = c.execute("SELECT key, ordering_key FROM leaseq.jobs WHERE id = %s", (job.job_id,))
        assert row.fetchone() == ("tenant-42", "order-17")
