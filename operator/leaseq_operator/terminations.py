"""Which worker containers the kubelet saw terminate, read from a pod, as a pure function.

A worker's lease is the bound on how long its jobs wait after a crash, because nothing else
can tell that it stopped. On Kubernetes the kubelet can: it reports a container that exited
(OOMKilled, an error, a SIGKILL) in ``status.containerStatuses[]`` as ``state.terminated``
(while the restart is pending, or for good in a pod whose phase is Failed or Succeeded) and,
once the container restarted, as ``lastState.terminated``, each with ``finishedAt`` by the
node's clock. A container that terminated never runs again (a restart is a new container),
so every worker process that started in the pod before that moment has stopped, and the
operator ends its leases at once (:meth:`leaseq.leader.reaper.Reaper.reclaim`); a worker
registers its start by the same clock (``leaseq.workers.boot_at``).

Nothing but such a report counts: a pod deleted while its statuses still say ``running`` (a
force delete, or a node that stopped reporting: its pods keep their last statuses while the
node's Ready condition is Unknown) may still run somewhere, and its jobs wait for their
leases as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: The worker's own container: the one the chart (and any Deployment the docs describe) gives
#: the pod's name through the downward API, which the worker registers as its pod.
POD_NAME_ENV = "LEASEQ_POD_NAME"


@dataclass(frozen=True)
class Termination:
    """The pod's worker container terminated at ``finished_at`` (the node's clock)."""

    namespace: str
    pod: str
    uid: str
    node: str
    finished_at: datetime
    reason: str  # the kubelet's reason: OOMKilled, Error, Completed, ...
    exit_code: int | None

    @property
    def key(self) -> tuple[str, datetime]:
        """The same termination, however many events repeat it."""
        return (self.uid, self.finished_at)


def _worker_container(spec: Mapping[str, Any]) -> str | None:
    """The name of the pod's one container that sets :data:`POD_NAME_ENV` (None if none or
    several do: which of several held a lease cannot be told from the registry)."""
    names = [
        str(c.get("name"))
        for c in spec.get("containers") or []
        if any(e.get("name") == POD_NAME_ENV for e in c.get("env") or [])
    ]
    return names[0] if len(names) == 1 else None


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def terminated(pod: Mapping[str, Any]) -> Termination | None:
    """The latest termination of ``pod``'s worker container the kubelet reported, or None:
    no worker container, no node, or no terminated state with a ``finishedAt``.

    ``state.terminated`` (the container is dead now) is newer than ``lastState.terminated``
    (an earlier container; the current one started after it), so it wins when both are set.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    container = _worker_container(spec)
    if not node or container is None:
        return None
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    status = next((s for s in statuses if s.get("name") == container), None)
    if status is None:
        return None
    for part in ("state", "lastState"):
        ended = (status.get(part) or {}).get("terminated")
        if not ended:
            continue
        finished_at = _parse_time(ended.get("finishedAt"))
        if finished_at is None:
            continue
        code = ended.get("exitCode")
        return Termination(
            namespace=str(meta.get("namespace") or ""),
            pod=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            node=str(node),
            finished_at=finished_at,
            reason=str(ended.get("reason") or "Terminated"),
            exit_code=code if isinstance(code, int) else None,
        )
    return None
