"""Scale-down protection: which worker pods the ReplicaSet should delete first, as pure functions.

Kubernetes deletes the pods with the lowest ``controller.kubernetes.io/pod-deletion-cost``
first among otherwise equal pods (same phase and readiness), so before shrinking the operator
marks idle pods cheap and busy ones expensive: more jobs in flight and older in-flight work
cost more. The annotation is best-effort (the ReplicaSet controller may act on a stale view,
and it prefers unready pods whatever their cost), so a scale-down is also limited to the
replicas that are not busy: a busy worker is never the one that has to go.

The cluster autoscaler drains nodes on its own schedule, whatever the replicas: each pod's
``cluster-autoscaler.kubernetes.io/safe-to-evict`` is kept in step with its busyness on every
tick. "false" while it runs jobs (the autoscaler never removes a node under busy workers,
e.g. a GPU node in the middle of inference); "true" when idle, so a node whose workers are
idle can go even though their pods use local storage (the /tmp emptyDir), which the
autoscaler otherwise refuses to evict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from leaseq.core.models import WorkerRecord

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"

# The cost orders pods by jobs in flight first, then by the age of the oldest one in whole
# minutes (so a pod's cost changes at most once a minute and patches stay rare), within the
# annotation's int32 range.
_JOB_WEIGHT = 100_000
_MAX_AGE_MINUTES = _JOB_WEIGHT - 1
_MAX_COST = 2**31 - 1


@dataclass(frozen=True)
class PodLoad:
    """Running jobs of the workers in one pod, from the workers table."""

    pod: str
    running: int = 0
    oldest_running_age: float | None = None

    @property
    def idle(self) -> bool:
        return self.running == 0


def pod_loads(pods: Iterable[str], workers: Sequence[WorkerRecord]) -> dict[str, PodLoad]:
    """Load of each pod in ``pods``; a pod without a registered worker is idle."""
    loads = {pod: PodLoad(pod) for pod in pods}
    for worker in workers:
        load = loads.get(worker.pod or "")
        if load is None:
            continue
        ages = [a for a in (load.oldest_running_age, worker.oldest_running_age) if a is not None]
        loads[load.pod] = PodLoad(
            load.pod, load.running + worker.running, max(ages) if ages else None
        )
    return loads


def deletion_cost(load: PodLoad) -> int:
    """0 for an idle pod; otherwise higher for more jobs in flight, then for older work."""
    if load.idle:
        return 0
    minutes = min(int((load.oldest_running_age or 0.0) // 60), _MAX_AGE_MINUTES)
    return min(load.running * _JOB_WEIGHT + minutes + 1, _MAX_COST)


def safe_to_evict(load: PodLoad) -> str:
    """ "true" for an idle pod, "false" for a busy one."""
    return "true" if load.idle else "false"


def _changes(
    loads: Mapping[str, PodLoad],
    annotations: Mapping[str, Mapping[str, str]],
    key: str,
    value_of: Callable[[PodLoad], str],
) -> dict[str, str]:
    changes = {}
    for pod, load in loads.items():
        value = value_of(load)
        if annotations.get(pod, {}).get(key) != value:
            changes[pod] = value
    return changes


def cost_changes(
    loads: Mapping[str, PodLoad], annotations: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """The deletion-cost annotation values to write: only pods whose value differs."""
    return _changes(loads, annotations, DELETION_COST, lambda load: str(deletion_cost(load)))


def eviction_changes(
    loads: Mapping[str, PodLoad], annotations: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """The safe-to-evict annotation values to write: only pods whose value differs."""
    return _changes(loads, annotations, SAFE_TO_EVICT, safe_to_evict)


def limit_scale_down(current: int, desired: int, busy: int) -> int:
    """``desired``, raised so that a scale-down never needs a busy pod to go: at most the
    replicas that are not busy (idle pods, and replicas whose pod does not exist yet) go."""
    if desired >= current:
        return desired
    return max(desired, min(current, busy))
