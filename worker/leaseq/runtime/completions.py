"""Group commit for successful attempts: results that arrive within a short window are
completed together, by one ``complete_many`` statement and one commit.

Handlers hand their results in with :meth:`Completions.put`; one thread delivers them. It
takes whatever is waiting, and while other handlers are still running it waits up to
``window`` seconds for their results to join (a worker whose every handler has reported
flushes at once, so one slot never waits). A result that nothing could join is delivered by
the thread that hands it in, and the freed slots are refilled there too. Only after the
statement has committed does the worker act on a success (metrics, the log line, freeing
the slot for the next claim): a result is durable before anything depends on it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from leaseq.runtime.inflight import InFlight
from leaseq.runtime.outcomes import Settler
from leaseq.runtime.settlement import Done, Settlement

log = logging.getLogger("leaseq.worker")

#: How long the first result of a group waits for others while handlers are still running.
COMPLETE_WINDOW_SECONDS = 0.002


class Completions:
    """The grouping loop; run :meth:`run` in its own thread, stop it with :meth:`close`."""

    def __init__(
        self,
        settlement: Settlement,
        *,
        running: Callable[[], int],
        finished: Callable[[list[InFlight]], None],
        after: Callable[[], None],
        window: float = COMPLETE_WINDOW_SECONDS,
    ) -> None:
        """``running()``: how many handlers have not reported yet (results that may still
        join a group); ``finished(attempts)``: called once attempts are settled (or dropped);
        ``after()``: called after each group (the worker claims for the freed slots)."""
        self.settlement = settlement
        self.running = running
        self.finished = finished
        self.after = after
        self.window = window
        self._waiting: queue.SimpleQueue[list[Done] | None] = queue.SimpleQueue()
        # Held while a group is delivered (and its slots refilled).
        self._busy = threading.Lock()

    def put(self, done: list[Done]) -> None:
        """Hand in successful attempts (results validated, final progress): they are completed
        in the same group (a batch's successes: one statement). When no other result could
        join them (no handler still running, none waiting, no group under way), the caller's
        thread delivers them at once: a slot that completes its attempt and refills itself
        needs no hand-off to another thread and back."""
        if self.running() == 0 and self._waiting.empty() and self._busy.acquire(blocking=False):
            try:
                self._deliver_and_refill(list(done))
            finally:
                self._busy.release()
            return
        self._waiting.put(done)

    def run(self) -> None:
        """Deliver groups until :meth:`close`; what was queued before it is still delivered."""
        while True:
            first = self._waiting.get()
            if first is None:
                return
            group = list(first)
            closing = self._gather(group)
            with self._busy:
                if closing:
                    self._deliver_logged(group)
                    return
                self._deliver_and_refill(group)

    def _deliver_and_refill(self, group: list[Done]) -> None:
        self._deliver_logged(group)
        self.after()

    def _deliver_logged(self, group: list[Done]) -> None:
        try:
            self._deliver(group)
        except Exception:
            # A bug here must not stop completions for good: the leases of this group
            # run out and the reaper hands the jobs to another attempt.
            log.exception("error completing %d attempt(s); continuing", len(group))

    def _gather(self, group: list[Done]) -> bool:
        """Add what is waiting, and what arrives within the window while handlers run;
        True if :meth:`close` was called meanwhile."""
        deadline = time.monotonic() + self.window
        while True:
            try:
                item = self._waiting.get_nowait()
            except queue.Empty:
                left = deadline - time.monotonic()
                if left <= 0 or self.running() == 0:
                    return False
                try:
                    item = self._waiting.get(timeout=left)
                except queue.Empty:
                    return False
            if item is None:
                return True
            group.extend(item)

    def _deliver(self, group: list[Done]) -> None:
        taken = []
        for done in group:
            if done.attempt.take(Settler.HANDLER):
                taken.append(done)
            else:
                log.info(
                    "attempt already given up (%s); result not reported",
                    done.attempt.settled_by,
                    extra=done.attempt.fields(),
                )
                self.finished([done.attempt])
        try:
            self.settlement.complete(taken)
        finally:
            self.finished([done.attempt for done in taken])

    def close(self) -> None:
        """Stop the loop once what is queued now has been delivered."""
        self._waiting.put(None)

    def start(self) -> threading.Thread:
        """Run the loop in a daemon thread."""
        thread = threading.Thread(target=self.run, name="leaseq-completions", daemon=True)
        thread.start()
        return thread
