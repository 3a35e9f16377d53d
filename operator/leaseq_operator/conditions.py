"""WorkerPool status conditions, Kubernetes style: one entry per type, with a transition time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

SPEC_VALID = "SpecValid"
DATABASE_REACHABLE = "DatabaseReachable"
TARGET_FOUND = "TargetFound"
#: The pods' safe-to-evict and deletion-cost annotations are written; False (with the API
#: server's message) while a patch fails. Scaling goes on either way.
PODS_ANNOTATED = "PodsAnnotated"
#: Every pod of the pool's Deployment found a node; False with the scheduler's message while
#: some cannot be scheduled (e.g. no GPU node), however long they wait.
PODS_SCHEDULED = "PodsScheduled"
#: An operator replica holds the leader lease, so the pool is scaled; False while a worker
#: (``leaseq worker --lead true``) or a ``leaseq reaper`` holds it: no replica scales then.
LEADER_LEASE = "LeaderLease"


@dataclass(frozen=True)
class Condition:
    type: str
    ok: bool
    reason: str
    message: str

    @property
    def status(self) -> str:
        return "True" if self.ok else "False"


def timestamp(moment: datetime | None = None) -> str:
    """RFC 3339 in UTC, second precision, as Kubernetes writes times."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge(
    existing: Sequence[Mapping[str, Any]], updates: Sequence[Condition], now: datetime | None = None
) -> tuple[list[dict[str, Any]], list[Condition]]:
    """The conditions list with ``updates`` applied, and the updates whose status changed.

    lastTransitionTime moves only when a condition's status changes; other types are kept.
    """
    merged = {str(c.get("type")): dict(c) for c in existing if c.get("type")}
    changed = []
    for update in updates:
        before = merged.get(update.type)
        flipped = before is None or before.get("status") != update.status
        if flipped:
            changed.append(update)
        merged[update.type] = {
            "type": update.type,
            "status": update.status,
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": timestamp(now)
            if flipped or before is None
            else before.get("lastTransitionTime", timestamp(now)),
        }
    return [merged[k] for k in sorted(merged)], changed
