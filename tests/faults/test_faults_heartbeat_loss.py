"""Seed 001's crash test 5: a worker loses its heartbeats while its handler keeps working.

The largest duplicate-execution window is the lease plus the reap interval: the job's next
execution starts no earlier than the lease's end (fencing) and no later than lease + reap
interval (+ one claim poll) after the last heartbeat; the stale execution is told to stop
when its lease runs out locally, so the two overlap by at most a renewal's round trip."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import leaseq
from support.polling import wait_for
from support.proxy import CuttableProxy
from support.workers import WorkerProcess

pytestmark = pytest.mark.faults

LEASE = 2.0
HEARTBEAT = 0.4
REAP_INTERVAL = 0.5
POLL = 0.3
# Scheduling on a loaded 2-core CI machine: the bounds below hold with this much to spare.
SLACK = 2.0


@pytest.fixture
def proxy(database_url: str) -> Iterator[CuttableProxy]:
    p = CuttableProxy(database_url)
    yield p
    p.close()


def stamp(folder: Path, token: int, what: str) -> float | None:
    path = folder / f"{token}.{what}"
    return float(path.read_text()) if path.exists() and path.read_text() else None


def test_lost_heartbeats_bound_the_duplicate_execution_window(
    database_url: str,
    queue: leaseq.Queue,
    proxy: CuttableProxy,
    tmp_path: Path,
    spawn_on: Callable[..., WorkerProcess],
    reaper_on: Callable[..., object],
) -> None:
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    reaper_on(database_url, REAP_INTERVAL)
    spawn_on(proxy.url, "w-cut", lease=LEASE, heartbeat=HEARTBEAT, poll=POLL)
    job = queue.enqueue("q", "stamp", {"dir": str(stamps), "seconds": 60}).job_id
    wait_for(lambda: stamp(stamps, 1, "start"), "the first execution to start")
    spawn_on(database_url, "w-ok", lease=LEASE, heartbeat=HEARTBEAT, poll=POLL)

    def renewed() -> bool:
        record = queue.get(job)
        return bool(
            record.heartbeat_at and record.started_at and record.heartbeat_at > record.started_at
        )

    wait_for(renewed, "a renewal to go through before the cut")
    cut = time.time()
    proxy.cut()
    second = wait_for(lambda: stamp(stamps, 2, "start"), "the second execution", 30)
    stale_stop = wait_for(lambda: stamp(stamps, 1, "stop"), "the stale execution to stop", 30)
    window = second - cut
    overlap = stale_stop - second
    print(f"duplicate-execution window {window:.2f}s (bound {LEASE + REAP_INTERVAL + POLL}s), "
          f"stale execution stopped {overlap:+.2f}s after the new one started")  # fmt: skip
    # Fencing: the new execution never starts before the lease could have expired.
    assert window >= LEASE - HEARTBEAT
    # Liveness: the job is back within lease + reap interval (+ one poll).
    assert window <= LEASE + REAP_INTERVAL + POLL + SLACK
    # The stale execution is told to stop by its own lease, not much after the new start.
    assert overlap <= SLACK
    assert queue.get(job).lease_owner == "w-ok"
    attempts = queue.attempts(job)
    assert [a.outcome for a in attempts] == ["lease_expired"]
    assert attempts[0].worker == "w-cut"
