"""Flow control (``leaseq.FlowControl``): per-key concurrency limits, strict order per
aggregate, fair shares by weight.

::

    flow = leaseq.FlowControl(pool)
    flow.set_limit("inference", "tenant-42", max_running=4)   # at run time, no deploy
    flow.set_limit("inference", "tenant-*", max_running=8, weight=1)
    queue.enqueue("inference", "ocr", {...}, key="tenant-42")
    queue.enqueue("orders", "apply", {...}, ordering_key="order-17")

Guarantees (migration 11 says how):

* **A limit holds.** A limited key has one row per unit of its limit (a slot). The claim
  takes a free slot with ``FOR UPDATE SKIP LOCKED`` in the statement that leases the job and
  writes the holder (job, lease token) on it; the slot is given back only in the transaction
  that moves the job out of ``running`` (complete, fail, release, reap, cancel), and only if
  the slot's token is that attempt's, so a stale worker frees nothing. A job in retry backoff
  holds no slot. A lowered limit drains: running jobs finish, no new one starts past it.
  The reaper checks every held slot (:meth:`FlowControl.repair`, counted in
  ``leaseq_flow_repairs_total``; expected 0).
* **Keyless jobs pay nothing**: their claim reads no flow table.
* **Strict order per aggregate**: only the lowest unfinished sequence number of an
  ``ordering_key`` is claimable. A dead head blocks its aggregate (listed by
  :meth:`FlowControl.blocked`) until it is retried (``leaseq retry``) or skipped
  (:meth:`FlowControl.unblock`).
* **Fair shares**: keys with work are served in order of the seconds their jobs ran divided
  by their weight; a key back from idle starts level with the least-served active key.
  A key whose jobs ended without running (cancelled while pending) goes idle at the
  reaper's next pass (:meth:`FlowControl.settle`), and one whose jobs are all due later
  sleeps until shortly before the first is due, so claims do not walk them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg.rows import DictRow

from leaseq.core import validation
from leaseq.core._store.flow import FlowStore
from leaseq.core.db import Conn, Db, borrow, transaction
from leaseq.core.errors import InvalidJob
from leaseq.core.flow_models import (
    BlockedAggregate,
    FlowKeyStatus,
    FlowLimit,
    FlowQueueSummary,
    Keep,
    KeysSettled,
)
from leaseq.core.models import SILENT_AFTER_SECONDS

#: Slots one repair pass checks at most.
REPAIR_BATCH = 1000
#: Active keys per queue the reaper's sweep looks at, from the front of the turn order.
SETTLE_BATCH = 100


class FlowControl:
    """Limits and their state in one database (a pool or an autocommit connection)."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._store = FlowStore()

    def set_limit(
        self,
        queue: str,
        key: str,
        *,
        max_running: int | None = None,
        weight: float = 1.0,
        per_second: float | None = None,
        burst: float | None = None,
    ) -> int:
        """Set the limit of ``key`` (or a pattern with ``*``) in ``queue``: at most
        ``max_running`` of its jobs running at once (None: no limit), its fair-share
        ``weight``, and at most ``per_second`` starts a second with bursts of ``burst``
        (default 1; a token bucket taken in the claim, exact across workers). Applies at
        once to every key it governs (returned: how many are known)."""
        _check_limit(queue, key, max_running, weight, per_second, burst)
        with transaction(self._db, "set limit") as c:
            return self._set(c, queue, key, max_running, weight, per_second, burst)

    def update_limit(
        self,
        queue: str,
        key: str,
        *,
        max_running: int | Keep | None = Keep.KEEP,
        weight: float | Keep = Keep.KEEP,
        per_second: float | Keep | None = Keep.KEEP,
        burst: float | Keep | None = Keep.KEEP,
    ) -> int:
        """Change only the parts of ``key``'s limit that are given (``leaseq limits set``);
        the others keep their value (a new limit starts with none: no concurrency or rate
        limit, weight 1). ``max_running=None`` removes the concurrency limit,
        ``per_second=None`` the rate limit with its burst. Read and written in one
        transaction; returns how many keys it applies to, as :meth:`set_limit` does."""
        with transaction(self._db, "set limit") as c:
            current = next(
                (r for r in self._store.flow_limit_list(c, queue=queue) if r["key_pattern"] == key),
                None,
            )
            if isinstance(max_running, Keep):
                max_running = None if current is None else current["max_running"]
            if isinstance(weight, Keep):
                weight = 1.0 if current is None else current["weight"]
            if isinstance(per_second, Keep):
                per_second = None if current is None else current["per_second"]
            if isinstance(burst, Keep):
                burst = None if current is None or per_second is None else current["burst"]
            _check_limit(queue, key, max_running, weight, per_second, burst)
            return self._set(c, queue, key, max_running, weight, per_second, burst)

    def _set(
        self,
        c: Conn,
        queue: str,
        key: str,
        max_running: int | None,
        weight: float,
        per_second: float | None,
        burst: float | None,
    ) -> int:
        return self._store.flow_limit_set(
            c,
            queue=queue,
            pattern=key,
            max_running=max_running,
            weight=weight,
            per_second=per_second,
            burst=burst,
        )

    def pause(self, queue: str, key: str, until: datetime) -> datetime | None:
        """Claim none of ``key``'s jobs before ``until`` (a later pause wins). Returns the
        pause in force; None when the key has no unfinished job."""
        with transaction(self._db, "pause key") as c:
            return self._store.flow_pause(c, queue=queue, key=key, until=until)

    def resume(self, queue: str, key: str) -> bool:
        """End ``key``'s pause now (a handler's back-off); False when it had none."""
        validation.queue_name(queue)
        validation.flow_key("key", key)
        with transaction(self._db, "resume key") as c:
            return self._store.flow_resume(c, queue=queue, key=key)

    def remove_limit(self, queue: str, key: str) -> int:
        """Remove the limit set for exactly ``key`` (or pattern); the keys it governed take
        the next matching limit, or none. Returns how many keys were updated."""
        validation.queue_name(queue)
        validation.flow_key("key", key)
        with transaction(self._db, "remove limit") as c:
            return self._store.flow_limit_remove(c, queue=queue, pattern=key)

    def limits(self, queue: str | None = None) -> list[FlowLimit]:
        """The limits set, per queue and key pattern."""
        with borrow(self._db, "list limits") as c:
            rows = self._store.flow_limit_list(c, queue=queue)
        return [_limit(r) for r in rows]

    def status(
        self, queues: Sequence[str] | None = None, *, limit: int = 100, now: datetime | None = None
    ) -> list[FlowKeyStatus]:
        """Keys with unfinished jobs (saturated ones first): limit, running, ready, claimable,
        units held by silent workers, paused until."""
        with borrow(self._db, "flow status") as c:
            rows = self._store.flow_status(
                c, queues=queues, limit=limit, live_seconds=SILENT_AFTER_SECONDS, now=now
            )
        return [
            FlowKeyStatus(
                queue=r["queue"],
                key=r["key"],
                max_running=r["max_running"],
                weight=r["weight"],
                vtime=r["vtime"],
                running=r["running"],
                ready=r["ready"],
                saturated=r["saturated"],
                claimable=r["claimable"],
                held_silent=r["held_silent"],
                paused_until=r["paused_until"],
            )
            for r in rows
        ]

    def blocked(
        self, queues: Sequence[str] | None = None, *, limit: int = 100
    ) -> list[BlockedAggregate]:
        """Aggregates whose head is dead, with the head and how many jobs wait behind it."""
        with borrow(self._db, "blocked aggregates") as c:
            rows = self._store.flow_blocked(c, queues=queues, limit=limit)
        return [
            BlockedAggregate(
                r["queue"], r["ordering_key"], r["head"], r["blocked_at"], r["waiting"]
            )
            for r in rows
        ]

    def unblock(self, queue: str, ordering_key: str) -> int | None:
        """Skip the dead head of a blocked aggregate; returns the new head's id, if any."""
        with transaction(self._db, "unblock") as c:
            return self._store.flow_unblock(c, queue=queue, ordering_key=ordering_key)

    def summary(
        self, queues: Sequence[str] | None = None, *, now: datetime | None = None
    ) -> list[FlowQueueSummary]:
        """Per queue: jobs workers could claim now (keyless ready, plus per key the smaller
        of its ready jobs and free units), saturated keys, blocked aggregates."""
        with borrow(self._db, "flow summary") as c:
            rows = self._store.flow_queue_summary(c, queues=queues, now=now)
        return [
            FlowQueueSummary(
                r["queue"],
                int(r["claimable"]),
                int(r["saturated_keys"]),
                int(r["blocked_aggregates"]),
            )
            for r in rows
        ]

    def repair(self, *, batch: int = REPAIR_BATCH) -> dict[str, int]:
        """The reaper's check: free slots whose holder is not a running attempt with the same
        token. Returns the slots freed per queue (expected: none)."""
        with transaction(self._db, "repair flow slots") as c:
            rows = self._store.flow_repair(c, batch=batch)
        return {r["queue"]: int(r["repaired"]) for r in rows}

    def settle(self, *, ahead: float, batch: int = SETTLE_BATCH) -> dict[str, KeysSettled]:
        """The reaper's sweep of the keys claims walk first: wake the sleeping keys whose next
        job is due within ``ahead`` seconds; of each queue's first ``batch`` keys in turn,
        deactivate those with no pending job and none running (their jobs were cancelled
        before they ran), and put to sleep those with none running and no job due within
        ``2 * ahead`` seconds (delayed, sleeping, waiting for a signal, backing off), until
        their first job is due. Returns what it did per queue."""
        validation.non_negative("ahead", ahead)
        with transaction(self._db, "settle flow keys") as c:
            rows = self._store.flow_settle(c, batch=batch, ahead=ahead)
        return {
            r["queue"]: KeysSettled(int(r["settled"]), int(r["slept"]), int(r["woken"]))
            for r in rows
        }

    def repairs_total(self) -> dict[str, int]:
        """Slots repaired so far, per queue."""
        with borrow(self._db, "read flow repairs") as c:
            rows = self._store.flow_repairs_total(c)
        return {r["queue"]: int(r["repaired"]) for r in rows}


def _check_limit(
    queue: str,
    key: str,
    max_running: int | None,
    weight: float,
    per_second: float | None,
    burst: float | None,
) -> None:
    validation.queue_name(queue)
    validation.flow_key("key", key)
    if max_running is not None and not 0 <= max_running <= 10000:
        raise InvalidJob("max_running", f"must be in [0, 10000], got {max_running}")
    if not weight > 0:
        raise InvalidJob("weight", f"must be positive, got {weight}")
    if per_second is not None and not per_second > 0:
        raise InvalidJob("per_second", f"must be positive, got {per_second}")
    if burst is not None and (per_second is None or not burst >= 1):
        raise InvalidJob("burst", "needs per_second, and must be at least 1")


def _limit(r: DictRow) -> FlowLimit:
    return FlowLimit(
        r["queue"],
        r["key_pattern"],
        r["max_running"],
        r["weight"],
        r["updated_at"],
        r["per_second"],
        r["burst"],
    )
