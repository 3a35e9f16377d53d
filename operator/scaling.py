"""The scaling policy: how many worker replicas a WorkerPool wants, as a pure function.

Demand is ready + due-soon + running jobs, so busy workers are never counted as spare (a
metric of the backlog alone scales busy workers away). The stabilization follows the
Kubernetes HPA: every reading leaves a recommendation with its timestamp; the pool scales up
only to the *least* any reading within the up-window asked for (window 0: at once), and down
only to the *most* any reading within the down-window asked for, so a backlog that flaps
inside the window never shrinks the pool. Readings are taken with one clock chosen by the
caller (seconds); nothing here reads a clock or does I/O.

Guarantees of :func:`decide`:

* with fresh data, the result is within [minReplicas, maxReplicas], except that it never drops
  below the replicas the running jobs need (``ceil(running / jobsPerReplica)``) unless the pool
  is already smaller: running jobs outrank a lowered maxReplicas, the pool shrinks as they end;
* zero only when minReplicas is 0 and nothing is ready, due soon or running;
* without a reading (``demand=None``, the database could not be read) the current count is
  held and recorded, so the down-window restarts once readings resume;
* an empty history counts the current replicas as recommended now, so a restarted operator
  (or a new WorkerPool) waits a full window before shrinking what it found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from leaseq.operator.spec import PoolSpec


@dataclass(frozen=True)
class Demand:
    """Jobs in a pool's queues at one reading."""

    ready: int
    scheduled_soon: int
    running: int

    @property
    def jobs(self) -> int:
        return self.ready + self.scheduled_soon + self.running


@dataclass(frozen=True)
class Recommendation:
    """What one reading asked for, clamped to the spec, at time ``at`` (seconds)."""

    at: float
    replicas: int


@dataclass(frozen=True)
class Decision:
    """The policy's answer: ``desired`` replicas, why, and the history to pass next time."""

    desired: int
    recommended: int
    floor: int
    reason: str
    history: tuple[Recommendation, ...]


def replicas_for(jobs: int, jobs_per_replica: int) -> int:
    """Replicas that run ``jobs`` jobs at once: ``ceil(jobs / jobs_per_replica)``."""
    return math.ceil(max(jobs, 0) / jobs_per_replica)


def _clamp(value: int, spec: PoolSpec) -> int:
    return min(max(value, spec.min_replicas), spec.max_replicas)


def _within(history: Sequence[Recommendation], now: float, window: float) -> list[int]:
    return [r.replicas for r in history if r.at > now - window]


def decide(
    demand: Demand | None,
    current: int,
    history: Sequence[Recommendation],
    spec: PoolSpec,
    now: float,
) -> Decision:
    """Desired replicas for ``demand`` given the ``current`` count and earlier recommendations.

    ``history`` is what the previous Decision returned (empty at first); entries older than
    both windows are dropped from the returned history.
    """
    keep = max(spec.scale_up_seconds, spec.scale_down_seconds)
    past = [r for r in history if r.at > now - keep] or [Recommendation(now, current)]
    if demand is None:
        return Decision(
            desired=current,
            recommended=current,
            floor=0,
            reason=f"holding {current} replicas: no queue depth reading",
            history=(*past, Recommendation(now, current)),
        )
    recommended = _clamp(replicas_for(demand.jobs, spec.jobs_per_replica), spec)
    up_to = min([recommended, *_within(past, now, spec.scale_up_seconds)])
    down_to = max([recommended, *_within(past, now, spec.scale_down_seconds)])
    if current < up_to:
        target, why = up_to, "scale up"
    elif current > down_to:
        target, why = down_to, "scale down"
    else:
        target, why = current, "hold"
    target = _clamp(target, spec)
    floor = replicas_for(demand.running, spec.jobs_per_replica)
    if target < min(current, floor):
        target, why = min(current, floor), "hold for running jobs"
    reason = (
        f"{why}: {demand.ready} ready, {demand.scheduled_soon} due soon, {demand.running} running"
        f" at {spec.jobs_per_replica} per replica ask for {recommended}"
        f" (bounds {spec.min_replicas}..{spec.max_replicas})"
    )
    return Decision(
        desired=target,
        recommended=recommended,
        floor=floor,
        reason=reason,
        history=(*past, Recommendation(now, recommended)),
    )
