"""A worker's offer to lead: where no operator and no ``leaseq reaper`` runs, the workers
elect a leader among themselves for the leader's duties, so ``leaseq worker`` alone is a
complete system for a small deployment.

It is the operator's own :class:`~leaseq.leader.reaper.Reaper` (the same leader lease in
``leaseq.leader_leases``, the same pass lock, the same duties: reaping, flow-control repair,
schedules, history, retention, vacuum), held under this worker's id. Whoever holds the lease
leads, an operator replica, a ``leaseq reaper`` or a worker; the others stand by, and take
over within the lease's length plus one pass when it lapses. But a worker never takes the
lease from a database where an operator or a ``leaseq reaper`` has led (their lease stays on
record when they stop, see ``leader_acquire``): there the operator's leader also scales the
WorkerPools, and a worker holding the lease would freeze them. The duties need the operator's
database privileges: a worker whose role lacks them logs so once and stops offering.
"""

from __future__ import annotations

from leaseq import config
from leaseq.core.db import Db
from leaseq.core.flow import FlowControl
from leaseq.core.history import History
from leaseq.core.leadership import Leadership
from leaseq.core.models import LeaderKind
from leaseq.core.queue import Queue
from leaseq.core.schedules import Schedules
from leaseq.core.workers import Workers
from leaseq.leader.history import HistoryDuty
from leaseq.leader.reaper import LeaderLease, Reaper

#: The `leaseq reaper` defaults: a pass every 5 s, a lease of 15 s (a standby takes over
#: within 20 s of its leader's death), vacuum after 2000 dead row versions.
PASS_SECONDS = 5.0
LEASE_TTL_SECONDS = 15.0
VACUUM_DEAD_TUPLES = 2000


def worker_leader(db: Db, worker_id: str) -> Reaper:
    """The duties this worker runs while it holds the leader lease (start it with
    :meth:`~leaseq.leader.reaper.Reaper.start`; ``stop`` gives the lease up)."""
    return Reaper(
        LeaderLease(Leadership(db), worker_id, LEASE_TTL_SECONDS, kind=LeaderKind.WORKER),
        Queue(db),
        Workers(db),
        PASS_SECONDS,
        vacuum_dead_tuples=VACUUM_DEAD_TUPLES,
        history=HistoryDuty.for_lease(History(db), config.HOT_RETENTION.default, LEASE_TTL_SECONDS),
        schedules=Schedules(db),
        flow=FlowControl(db),
        stop_when_refused=True,
    )
