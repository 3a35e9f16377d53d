"""Wake-ups: ``NOTIFY leaseq_jobs, '<queue>'`` is sent when a job becomes ready, and
``'<queue> <seconds> <job type>'`` when a job will be ready in that many seconds (a durable
sleep's hand-back: the seconds are database time, from the statement's now to the job's run
time); a worker LISTENs on a dedicated connection to claim promptly instead of at its next
poll. Queue names hold no space (leaseq.core.validation.QUEUE_NAME), so the first space ends
the queue; a job type may hold spaces, so it comes last."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from leaseq.core._store.store import Store
from leaseq.core.db import Conn, connect
from leaseq.core.errors import translate

CHANNEL = "leaseq_jobs"


@dataclass(frozen=True)
class Wakeup:
    """One notification: a job of ``job_type`` in ``queue`` is claimable ``in_seconds`` from
    when it was sent (0 and no type: claimable now, of whatever type)."""

    queue: str
    in_seconds: float = 0.0
    job_type: str | None = None


def parse(payload: str) -> Wakeup:
    """The wake-up a payload says; a payload of no known form (or an unusable number of
    seconds) is taken as its whole text naming a queue, which no worker serves, so a
    stranger's NOTIFY on the channel costs nothing."""
    queue, _, rest = payload.partition(" ")
    if not rest:
        return Wakeup(queue)
    seconds, _, job_type = rest.partition(" ")
    try:
        in_seconds = float(seconds)
    except ValueError:
        return Wakeup(payload)
    if not math.isfinite(in_seconds) or not job_type:
        return Wakeup(payload)
    return Wakeup(queue, max(0.0, in_seconds), job_type)


class Subscription:
    """One LISTENing connection; :meth:`receive` returns the wake-ups notifications say."""

    def __init__(self, conn: Conn, conninfo: str) -> None:
        self._conn = conn
        self._conninfo = conninfo

    def receive(self, timeout: float) -> list[Wakeup]:
        """The wake-ups of the first batch of notifications to arrive within ``timeout``
        seconds (empty when none did): it returns as soon as one arrives, so the caller can
        re-arm a timer at once. Raises a leaseq error when the connection is lost."""
        try:
            # stop_after ends the generator between batches: breaking out of one mid-batch
            # would drop the rest of that batch.
            notes = self._conn.notifies(timeout=timeout, stop_after=1)
            return [parse(note.payload) for note in notes]
        except psycopg.Error as exc:
            raise translate(exc, action="listen", conninfo=self._conninfo) from exc


class Notifications:
    """Subscriptions to wake-ups, each on a connection of its own to ``conninfo``."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._store = Store()

    @contextmanager
    def subscribe(self) -> Iterator[Subscription]:
        """Open a dedicated autocommit connection, LISTEN on it, and close it after the block."""
        with connect(self._conninfo, action="listen") as conn:
            self._store.worker_listen(conn)
            yield Subscription(conn, self._conninfo)
