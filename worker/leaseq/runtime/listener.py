"""LISTEN for wake-ups on its own connection; reconnect with backoff when it drops.

Notifications only make claims prompt. Correctness never depends on them: the dispatcher
polls anyway, so while this connection is down (or LISTEN is disabled) every job is still
drained, at the poll interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection

from leaseq.core.backoff import Backoff
from leaseq.core.errors import LeaseqError
from leaseq.core.notifications import CHANNEL, Notifications, Subscription
from leaseq.runtime.health import Health

log = logging.getLogger("leaseq.listener")


class Listener:
    """Calls ``wake()`` for every notification naming one of ``queues``, and once after each
    (re)connect in case something was enqueued while it was away."""

    def __init__(
        self,
        conninfo: str,
        queues: Collection[str],
        wake: Callable[[], None],
        *,
        health: Health,
        stopping: threading.Event,
        check_every: float = 1.0,
    ) -> None:
        self.notifications = Notifications(conninfo)
        self.queues = frozenset(queues)
        self.wake = wake
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
        """Deliver notifications for up to ``check_every`` seconds."""
        for queue in subscription.receive(self.check_every):
            if queue in self.queues:
                self.wake()
