"""Noticing that a worker reconnected to another primary (a failover).

Every new connection of the worker's pool asks the server who it is (the cluster's system
identifier and failover epoch, :meth:`leaseq.Queue.server_identity`). The first answer is
remembered; a later one that differs means this connection reached another primary than the
leases in flight were taken on, whose last commits may never have reached it. The runtime's
``moved`` callback then voids those leases, before the new connection is first used. The
claims' tokens already make every write of a voided lease be refused on the new primary
(docs/operations/failover.md); this is how the worker learns it at once instead of at its
next heartbeat. A pooler (PgBouncer) hides its own reconnections: behind one, the refusal is
what tells.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from leaseq.core.db import Conn
from leaseq.core.errors import SchemaNotReady
from leaseq.core.queue import Queue

Identity = tuple[str, int | None]


class ServerWatch:
    """Calls ``moved(description)`` in the connecting thread when a new connection reached a
    primary other than the last one seen. A standby (no epoch) is not compared."""

    def __init__(self, moved: Callable[[str], None]) -> None:
        self._moved = moved
        self._lock = threading.Lock()
        self._known: Identity | None = None

    def check(self, conn: Conn) -> None:
        """Identify the server ``conn`` reached (a pool's ``configure`` hook). Before the
        schema exists (a worker waiting for `leaseq migrate`) there is nothing to compare and
        no lease to void: the connection is used as it is."""
        try:
            identity = Queue.server_identity(conn)
        except SchemaNotReady:
            return
        if identity[1] is None:
            return
        with self._lock:
            before, self._known = self._known, identity
        if before is not None and before != identity:
            self._moved(describe(before, identity))


def describe(before: Identity, after: Identity) -> str:
    """What changed between two primaries, in words."""
    if before[0] != after[0]:
        return f"another cluster (system identifier {before[0]}, now {after[0]})"
    return f"a promoted standby (failover epoch {before[1]}, now {after[1]})"
