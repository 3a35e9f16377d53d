"""No hot polling (issue 20): a real ``leaseq worker`` whose only work is a key saturated by a
unit the test holds claims once per wake-up plus its idle-backoff ticks, never in a loop; and
the unit's release wakes it, so it runs the key's next job without waiting for its poll.

The bound comes from the dispatcher (leaseq/runtime/dispatcher.py, ``_dispatch``): after a claim
that comes up empty it waits ``idle.next()`` on its wake event, which LISTEN notifications
set. ``idle`` is ``Backoff(0.5, poll_seconds)``: it is reset only by a claim that got a job,
so here its step doubles on every claim, and a delay is at least half its step. Over a
window of ``elapsed`` seconds the timeouts (poll ticks) are therefore at most
``log2(4 * elapsed + 1)`` (their delays are at least 0.25, 0.5, 1, ... and sum to at most
``elapsed``); every other claim ends a wait a wake-up cut short. That is a bound on how
many claims may happen, derived from the elapsed time, not a claim about speed: a worker
that re-claimed after an empty claim would make thousands in that window.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest

import leaseq
from support.polling import wait_for
from support.workers import WorkerProcess

pytestmark = pytest.mark.faults

#: Far longer than the test: any prompt claim in it came from a wake-up.
POLL_SECONDS = 3600.0
#: Wake-ups the test causes. With more than log2(POLL_SECONDS / 0.5) = 13 claims behind it,
#: the worker's idle step sits at its cap, so its next tick is at least 1,800 s away and
#: the prompt run in part (b) can only come from the release's notification.
WAKEUPS = 14


def claims(worker: WorkerProcess) -> int:
    return int(worker.metric("leaseq_claim_latency_seconds_count"))


def test_saturated_key_waits_for_wakeups_and_its_release_wakes_the_worker(
    database_url: str,
    conn: leaseq.core.db.Conn,
    spawn_on: Callable[..., WorkerProcess],
) -> None:
    flow = leaseq.FlowControl(conn)
    flow.set_limit("q", "hot", max_running=1)
    queue = leaseq.Queue(conn)
    held_id = queue.enqueue("q", "step", {"seconds": 0.05}, key="hot").job_id
    (held,) = queue.claim(["q"], "the-test", limit=1, lease_seconds=3600)
    assert held.id == held_id
    waiting = [queue.enqueue("q", "step", {"seconds": 0.05}, key="hot").job_id for _ in range(2)]

    worker = spawn_on(database_url, "w", concurrency=2, lease=30.0, poll=POLL_SECONDS)
    # Its first claim (at start; the listener's connect wakes one more) came up empty.
    wait_for(lambda: claims(worker) >= 1, "the worker's first claim")

    # (a) Every wake-up is an enqueue of the saturated key: it notifies, frees nothing.
    start = time.monotonic()
    before = claims(worker)
    for _ in range(WAKEUPS):
        seen = claims(worker)
        waiting.append(queue.enqueue("q", "step", {"seconds": 0.05}, key="hot").job_id)
        wait_for(lambda seen=seen: claims(worker) > seen, "the worker to claim on the wake-up")
    grown = claims(worker) - before
    elapsed = time.monotonic() - start
    ticks = math.floor(math.log2(4 * elapsed + 1))
    # Per wake-up one claim; +2: a claim in progress at `before`, the listener's connect wake.
    allowed = WAKEUPS + 2 + ticks
    print(f"claims {grown} for {WAKEUPS} wake-ups in {elapsed:.2f}s, allowed {allowed}")
    assert WAKEUPS <= grown <= allowed, (grown, allowed, elapsed)
    assert all(queue.get(i).status == "pending" for i in waiting)

    # (b) Freeing the unit (the test completes its job) notifies: the worker, whose next
    # poll tick is at least POLL_SECONDS / 2 away, claims and runs a job of the key.
    assert isinstance(queue.complete(held.lease), leaseq.Completed)
    wait_for(
        lambda: any(queue.get(i).status == "succeeded" for i in waiting),
        "a job of the key to run after its unit was freed",
        timeout=60,
    )
