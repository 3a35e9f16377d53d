"""Leadership: a named leader lease with a term, in database time, and the reaper's pass lock.

The lease decides *who* leads (visible, survives reconnects, lapses by itself); the lock, a
transaction-scoped advisory lock, makes two passes that both believe they lead impossible to
overlap (see :mod:`leaseq.leader.reaper`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from leaseq.core._store.store import Store
from leaseq.core.db import Conn, Db, borrow, transaction
from leaseq.core.models import LeaderTerm


class Leadership:
    """Leader leases over one connection or a pool; each call is one statement."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._store = Store()

    def acquire(
        self, name: str, holder: str, *, term: int, ttl: float, now: datetime | None = None
    ) -> LeaderTerm | None:
        """Take the lease ``name`` (when free or lapsed) or renew it (only while ``term`` is
        still its term) for ``ttl`` seconds; None when another holder has it."""
        with borrow(self._db, "renew reaper lease") as c:
            return self._store.leader_acquire(
                c, name=name, holder=holder, term=term, ttl=ttl, now=now
            )

    def release(self, name: str, holder: str, *, term: int) -> bool:
        """Give the lease up so another holder takes it at once, in a new term (the row stays,
        lapsed, so terms only grow); False if not held in ``term``."""
        with borrow(self._db, "release reaper lease") as c:
            return self._store.leader_release(c, name=name, holder=holder, term=term)

    @contextmanager
    def reap_pass(
        self, name: str, holder: str, term: int, *, ttl: float, now: datetime | None = None
    ) -> Iterator[Conn | None]:
        """A connection inside a transaction that holds the reaper's pass lock, or None when
        another pass holds it or ``holder`` no longer leads ``name`` in ``term`` (a leader
        that woke from a pause after a takeover must not act). What runs on the connection
        (``Queue.reap(conn=...)``) commits with the block, and the lock ends with it.

        The transaction is bounded by ``ttl`` seconds (idle in transaction, each statement,
        each lock wait): a reaper frozen mid-pass (SIGSTOP, a hung node) loses its session,
        and with it the lock, within a lease's length, so another replica can reap."""
        with transaction(self._db, "reap") as c:
            self._store.leader_pass_bounds(c, seconds=ttl)
            leading = self._store.leader_reap_lock(c, name=name, holder=holder, term=term, now=now)
            yield c if leading else None
