"""A deployment's tenants (``leaseq.QueueRoles``): which database roles may use a queue.

::

    roles = leaseq.QueueRoles(owner_conn)      # the owner of leaseq's tables
    roles.give("invoices", QueueUse.WORKER, ["team_a_workers"])
    roles.give("invoices", QueueUse.PRODUCER, ["team_a_apps"])

A queue given to no role as a component is open to every role of that component, so a
single-team install names none. Given to roles, it is open only to logins that are members
of one of them: a worker login claims from it and declares code schedules into it only
then, a producer login enqueues into it only then, and a fan-out enqueues into it only for
a job whose producer may. The database decides (definitions/tenants.sql), for any client.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from leaseq.core import validation
from leaseq.core._store.tenants import TenantStore
from leaseq.core.db import Db, borrow, transaction


class QueueUse(enum.StrEnum):
    """What a role given a queue may do with it."""

    #: Claim its jobs and declare code schedules into it.
    WORKER = "worker"
    #: Enqueue into it (a fan-out of its jobs included).
    PRODUCER = "producer"


@dataclass(frozen=True)
class QueueRole:
    """One role a queue is given to, as one component."""

    queue: str
    use: QueueUse
    role: str


class QueueRoles:
    """Which roles may use which queue, in one database; changed only by the owner of
    leaseq's tables (other roles get the database's refusal)."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._store = TenantStore()

    def give(self, queue: str, use: QueueUse, roles: Sequence[str]) -> list[str]:
        """Give ``queue`` to ``roles`` for ``use``, replacing the roles it had for it (an
        empty list opens it to every role again), in one transaction; returns the roles it
        has now. A role that does not exist is refused, naming it, and nothing changes."""
        validation.queue_name(queue)
        with transaction(self._db, "give queue") as c:
            return self._store.queue_roles_set(
                c, queue=queue, component=QueueUse(use).value, roles=roles
            )

    def list(self) -> list[QueueRole]:
        """Every queue given to roles, by queue, use and role."""
        with borrow(self._db, "show queue roles") as c:
            rows = self._store.queue_roles_list(c)
        return [QueueRole(r["queue"], QueueUse(r["component"]), r["role_name"]) for r in rows]
