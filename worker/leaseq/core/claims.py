"""The claim statements of one claim call, on its connection, and the plan that runs them.

:meth:`leaseq.Queue.claim` checks a call, borrows one connection, recovers the rows of a
call whose answer was lost, then hands a :class:`Claims` and the call's limit to a plan: a
function that runs the statements it chooses, in its order, and returns the jobs they
leased. The statements only run and answer (jobs, and what they found of the queues' flow
control); the choice is the plan's. A worker's plan remembers what its claims found
(:class:`leaseq.runtime.claims.ClaimPlanner`); :func:`keyless_then_keyed`, the plan of a
call given none, remembers nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from leaseq.core._store.store import Store
from leaseq.core.db import Conn
from leaseq.core.models import ClaimedJob, ClaimRequest, OpenClaim, SlotsClaim


class Claims:
    """The four claim statements, each for up to ``limit`` jobs of one call's request, on
    the call's connection. Each returns what its statement leased (and answered); none
    chooses another."""

    def __init__(self, store: Store, conn: Conn, request: ClaimRequest) -> None:
        self._store = store
        self._conn = conn
        self._request = request

    def keyless(self, limit: int) -> list[ClaimedJob]:
        """job_claim: keyless jobs, best priority first."""
        return self._store.job_claim(self._conn, self._request, limit)

    def keyed_open(self, limit: int) -> OpenClaim:
        """job_claim_keyed_open: keyed jobs of queues with no limit or rate set; none, and
        ``limited``, when the queues have one."""
        return self._store.job_claim_keyed_open(self._conn, self._request, limit)

    def keyed_slots(self, limit: int) -> SlotsClaim:
        """job_claim_keyed_slots: keyed jobs of queues with no rate set, each key within its
        limit; none, and ``rated``, when the queues have a rate."""
        return self._store.job_claim_keyed_slots(self._conn, self._request, limit)

    def keyed(self, limit: int) -> list[ClaimedJob]:
        """job_claim_keyed: keyed jobs, each key within its limit and rate."""
        return self._store.job_claim_keyed(self._conn, self._request, limit)


#: A plan: given the statements of one call and its limit, the jobs leased (at most limit).
ClaimPlan = Callable[[Claims, int], list[ClaimedJob]]


def keyless_then_keyed(claims: Claims, limit: int) -> list[ClaimedJob]:
    """Keyless jobs by job_claim, then, for the rest of the batch, keyed ones by
    job_claim_keyed, the statement that keeps every limit and rate whatever the queues set.
    It holds no state: each call runs the same statements in the same order."""
    got = claims.keyless(limit)
    if len(got) < limit:
        got += claims.keyed(limit - len(got))
    return got
