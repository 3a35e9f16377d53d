"""LISTEN for wake-ups on its own connection; reconnect with backoff when it drops.

Notifications only make claims prompt. Correctness never depends on them: the dispatcher
polls anyway, so while this connection is down (or LISTEN is disabled) every job is still
drained, at the poll interval. A notification of a job claimable later (a durable sleep's
hand-back) arms a timer instead (:class:`~leaseq.runtime.wake_times.WakeTimes`), which wakes
the dispatcher at that time; a job whose wake this worker did not hear of (it handed back
before the worker started, or while this connection was down) is found by a poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection

from leaseq.core.backoff import Backoff
from leaseq.core.errors import LeaseqError
from leaseq.core.notifications import CHANNEL, Notifications, Subscription, Wakeup
from leaseq.runtime.health import Health
from leaseq.runtime.wake_times import WakeTimes

log = logging.getLogger("leaseq.listener")


class Listener:
    """Calls ``wake()`` for every notification of a job claimable now in one of ``queues``,
    at the wake time of each one claimable later in one of ``queues`` and of one of
    ``job_types``, and once after each (re)connect in case something was enqueued while it
    was away."""

    def __init__(
        self,
        conninfo: str,
        queues: Collection[str],
        wake: Callable[[], None],
        *,
        job_types: Collection[str],
        health: Health,
        stopping: threading.Event,
        check_every: float = 1.0,
    ) -> None:
        self.notifications = Notifications(conninfo)
        self.queues = frozenset(queues)
        self.job_types = frozenset(job_types)
        self.wake = wake
        # Kept across reconnects: a wake time heard stays true while the connection is down.
        self.wake_times = WakeTimes()
        self.health = health
        self.stopping = stopping
        self.check_every = check_every
        self.connected = threading.Event()

    def run(self) -> None:
        # Re-listening within a second of the database's return also wakes the dispatcher
        # (see below), so claiming resumes as fast as renewing; a try costs one connect.
        backoff = Backoff(0.25, 1.0)
        while not self.stopping.is_set():
            self.health.tick("listener")
            try:
                with self.notifications.subscribe() as subscription:
                    self.connected.set()
                    backoff.reset()
                    log.info("listening on channel %s", CHANNEL)
                    self.wake()
                    while not self.stopping.is_set():
                        self.health.tick("listener")
                        self._receive(subscription)
            except LeaseqError as exc:
                delay = backoff.next()
                log.warning(
                    "listener connection lost (%s); polling meanwhile, re-listening in %.1fs",
                    exc,
                    delay,
                )
                self.stopping.wait(delay)
            finally:
                self.connected.clear()

    def _receive(self, subscription: Subscription) -> None:
        """Deliver the notifications of up to ``check_every`` seconds, or until the next wake
        time, then wake the dispatcher if a wake time has come."""
        woken = False
        for wakeup in subscription.receive(self.wake_times.wait(self.check_every)):
            if not self._serves(wakeup):
                continue
            if wakeup.in_seconds > 0:
                self.wake_times.add(wakeup.in_seconds)
            elif not woken:
                woken = True
                self.wake()
        if self.wake_times.due() and not woken:
            self.wake()

    def _serves(self, wakeup: Wakeup) -> bool:
        """Whether the job a wake-up names is one this worker claims (a wake-up of a job
        claimable now names no type: any worker of its queue claims)."""
        if wakeup.queue not in self.queues:
            return False
        return wakeup.job_type is None or wakeup.job_type in self.job_types
