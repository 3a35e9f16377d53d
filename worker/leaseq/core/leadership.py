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
from leaseq.core.models import LeaderKind, LeaderTerm, LeaseHolder


class Leadership:
    """Leader leases over one connection or a pool; each call is one statement."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._store = Store()

    def acquire(
        self,
        name: str,
        holder: str,
        *,
        term: int,
        ttl: float,
        kind: LeaderKind = LeaderKind.OPERATOR,
        now: datetime | None = None,
    ) -> LeaderTerm | None:
        """Take the lease ``name`` (when free or lapsed) or renew it (only while ``term`` is
        still its term) for ``ttl`` seconds, as a holder of ``kind``; None when another
        holder has it, and for a worker also when an operator or reaper held it last."""
        with borrow(self._db, "renew reaper lease") as c:
            return self._store.leader_acquire(
                c, name=name, holder=holder, term=term, ttl=ttl, kind=kind, now=now
            )

    def holder(self, name: str, now: datetime | None = None) -> LeaseHolder | None:
        """Who holds the lease ``name``, or held it last (``live`` says which); None when
        nobody does and no operator or reaper ever held it."""
        with borrow(self._db, "read reaper lease") as c:
            return self._store.leader_holder(c, name=name, now=now)

    def release(self, name: str, holder: str, *, term: int) -> bool:
        """Give the lease up so another holder takes it at once, in a new term (the row stays,
        lapsed, so terms only grow, and an operator's or reaper's keeps workers yielding);
        False if not held in ``term``."""
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
