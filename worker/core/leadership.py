"""Leadership: a named leader lease with a term, in database time, and the reaper's pass lock.

The lease decides *who* leads (visible, survives reconnects, lapses by itself); the lock, a
transaction-scoped advisory lock, makes two passes that both believe they lead impossible to
overlap (see :mod:`leaseq.operator.reaper`).
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
        """Give the lease up so another holder takes it at once; False if not held in ``term``."""
        with borrow(self._db, "release reaper lease") as c:
            return self._store.leader_release(c, name=name, holder=holder, term=term)

    @contextmanager
    def reap_pass(self) -> Iterator[Conn | None]:
        """A connection inside a transaction that holds the reaper's pass lock, or None when
        another pass holds it. What runs on the connection (``Queue.reap(conn=...)``) commits
        with the block, and the lock ends with that transaction."""
        with transaction(self._db, "reap") as c:
            yield c if self._store.leader_reap_lock(c) else None
