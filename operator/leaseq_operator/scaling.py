"""The scaling policy: how many worker replicas a WorkerPool wants, as a pure function.

Demand is ready + due-soon + running jobs, so busy workers are never counted as spare (a
metric of the backlog alone scales busy workers away). Jobs known ahead (delayed jobs, retries
in backoff, each schedule's next slot) count twice over, by when they are due:

* due within the lead time plus one poll (:func:`soon_seconds`, the lead from
  :func:`lead_seconds`) they are *due soon*, demand like ready jobs: a pool at zero scales up
  that long before a schedule's slot, and the slot's job starts on a warm pod;
* due within the scale-down window (:func:`coming_seconds`) they are *coming*: they add no
  replica, but the pool keeps the replicas they need. An idle pod is kept when its next job
  comes sooner than the window would let it go anyway; a job due later lets the pool shrink
  (to zero with minReplicas 0) and brings it back up by the lead time.

The stabilization follows the Kubernetes HPA: every reading leaves a recommendation with its
timestamp; the pool scales up only to the *least* any reading within the up-window asked for
(window 0: at once), and down only to the *most* any reading within the down-window asked
for, so a backlog that flaps inside the window never shrinks the pool. Readings are taken
with one clock chosen by the caller (seconds); nothing here reads a clock or does I/O.

Two ways to ask for replicas (``spec.scaleOn``):

* **Jobs** (the default): ``ceil((ready + due soon + running) / jobsPerReplica)``.
* **Work**: the estimated work-seconds (each job counted at its type's recent mean run time,
  see :func:`work_seconds`) against a time budget, with pod start-up taken into account, see
  :func:`work_replicas`. It never asks for more than Jobs would: no pod without a job for it.

Guarantees of :func:`decide`:

* with fresh data, the result is within [minReplicas, maxReplicas], except that it never drops
  below the replicas the running jobs need (``ceil(running / jobsPerReplica)``) unless the pool
  is already smaller: running jobs outrank a lowered maxReplicas, the pool shrinks as they end;
* it never shrinks below the replicas its coming jobs need (``ceil(coming / jobsPerReplica)``,
  within the bounds), and coming jobs never make it grow;
* zero only when minReplicas is 0 and nothing is ready, due soon or running, and nothing is
  coming while replicas are up;
* without a reading (``demand=None``, the database could not be read) the current count is
  held and recorded, so the down-window restarts once readings resume;
* an empty history counts the current replicas as recommended now, so a restarted operator
  (or a new WorkerPool) waits a full window before shrinking what it found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from leaseq.core.models import JobTypeWork, UnservedWork
from leaseq_operator.spec import PoolSpec, ScaleOn, WorkTarget


@dataclass(frozen=True)
class Work:
    """What a pool that scales on work knows at one reading, besides the job counts.

    ``loading`` holds, for each of the Deployment's pods whose worker is still running
    ``on_startup``, how long it has been loading; ``active`` counts pods whose worker takes
    work. Pods counted in neither (not scheduled, not registered yet) are assumed to need the
    whole start-up time.
    """

    seconds: float
    oldest_ready_age: float
    active: int = 0
    loading: tuple[float, ...] = ()
    reported_startup_seconds: float | None = None  # mean model load time workers reported


@dataclass(frozen=True)
class Demand:
    """Jobs in a pool's queues at one reading (and their work, for pools that scale on it).

    ``scheduled_soon`` counts the jobs due within :func:`soon_seconds` (delayed jobs and the
    schedules' next slots); ``coming`` those due within :func:`coming_seconds`, the due-soon
    ones included."""

    ready: int
    scheduled_soon: int
    running: int
    work: Work | None = None
    coming: int = 0

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


def servable(loads: Sequence[JobTypeWork], unserved: Sequence[UnservedWork]) -> list[JobTypeWork]:
    """``loads`` without the ready jobs that no live worker of their queue serves: a pool
    whose live workers all lack a job type cannot do that work, however many replicas it
    has. A queue without live workers has no unserved rows (what its image serves is not
    known then), so its work is all counted: a pool scaled to zero still scales up."""
    cannot: dict[str, int] = {}
    for row in unserved:
        cannot[row.job_type] = cannot.get(row.job_type, 0) + row.ready
    return [replace(t, ready=max(0, t.ready - cannot.get(t.job_type, 0))) for t in loads]


def work_seconds(loads: Sequence[JobTypeWork], default_job_seconds: float) -> float:
    """Estimated work-seconds: every ready, due-soon and running job at its type's recent
    mean run time (``default_job_seconds`` for a type with none). A running job counts a whole
    run: how far along it is is not known, so the estimate errs towards more capacity."""
    return sum(
        (t.ready + t.scheduled_soon + t.running)
        * (t.mean_seconds if t.mean_seconds is not None else default_job_seconds)
        for t in loads
    )


def startup_seconds(spec: PoolSpec, reported: float | None) -> float:
    """Seconds a new pod is expected to need before it takes work: the larger of the spec's
    estimate and the mean start-up (model load) the pool's workers ``reported``."""
    return max(spec.work.startup_seconds, reported or 0.0)


def lead_seconds(spec: PoolSpec, reported: float | None) -> float:
    """How long before a known job is due the pool scales up for it: ``scaleAheadSeconds``,
    or by default the pool's start-up time (:func:`startup_seconds`)."""
    if spec.scale_ahead_seconds is not None:
        return spec.scale_ahead_seconds
    return startup_seconds(spec, reported)


def soon_seconds(spec: PoolSpec, lead: float) -> float:
    """Jobs due within this many seconds are demand now: the lead time, plus one poll (the
    next reading may come that much later)."""
    return lead + spec.poll_seconds


def coming_seconds(spec: PoolSpec, lead: float) -> float:
    """Jobs due within this many seconds keep the replicas they need: the scale-down
    window, and at least the due-soon horizon."""
    return max(spec.scale_down_seconds, soon_seconds(spec, lead))


def with_slots(loads: Sequence[JobTypeWork], job_types: Sequence[str]) -> list[JobTypeWork]:
    """``loads`` with one due-soon job more per entry of ``job_types`` (the job types of the
    schedules' slots due soon), so their work is estimated like that of delayed jobs."""
    extra: dict[str, int] = {}
    for job_type in job_types:
        extra[job_type] = extra.get(job_type, 0) + 1
    merged = [replace(t, scheduled_soon=t.scheduled_soon + extra.pop(t.job_type, 0)) for t in loads]
    merged += [JobTypeWork(t, 0, n, 0, None, 0) for t, n in sorted(extra.items())]
    return merged


def budget_seconds(work: Work, spec: PoolSpec) -> float:
    """Seconds left to do the work in: the drain target, or what the oldest ready job has
    left of its age target (can be 0 or less: the target is already missed)."""
    if spec.work.target is WorkTarget.DRAIN_TIME:
        return spec.work.target_seconds
    return spec.work.target_seconds - work.oldest_ready_age


def work_replicas(work: Work, current: int, spec: PoolSpec) -> tuple[int, str]:
    """The fewest replicas that do ``work.seconds`` within the budget, and how it was found.

    A pod does ``jobsPerReplica`` work-seconds per second once started, so within a budget
    of B seconds a pod that still needs r seconds to start contributes
    ``jobsPerReplica * (B - r)``. Active pods have r = 0; a loading pod has the start-up time
    less what it has already loaded (capacity already coming: a slow model load does not make
    the pool grow again and again while it loads); any other pod of the ``current`` ones, and
    every added pod, the whole start-up time. Pods are counted quickest first. When even
    maxReplicas cannot do the work within the budget (too much work, or too little time left
    for a new pod to start), the answer is maxReplicas.
    """
    startup = startup_seconds(spec, work.reported_startup_seconds)
    budget = budget_seconds(work, spec)
    known = [0.0] * work.active + [max(startup - age, 0.0) for age in work.loading]
    remaining = sorted([*known, *[startup] * max(current - len(known), 0)])
    remaining += [startup] * max(spec.max_replicas - len(remaining), 0)
    capacity, replicas = 0.0, 0
    for start in remaining:
        if capacity >= work.seconds or budget - start <= 0:
            break
        capacity += spec.jobs_per_replica * (budget - start)
        replicas += 1
    why = (
        f"{work.seconds:.0f} work-seconds within {budget:.0f}s"
        f" ({work.active} active, {len(work.loading)} loading, start-up {startup:.0f}s)"
    )
    if capacity < work.seconds:
        return spec.max_replicas, f"{why}: out of reach, so maxReplicas"
    return replicas, why


def _recommend(demand: Demand, current: int, spec: PoolSpec) -> tuple[int, str]:
    counted = replicas_for(demand.jobs, spec.jobs_per_replica)
    jobs = (
        f"{demand.ready} ready, {demand.scheduled_soon} due soon, {demand.running} running"
        f" at {spec.jobs_per_replica} per replica"
    ) + (f", {demand.coming} due within the scale-down window" if demand.coming else "")
    if spec.scale_on is ScaleOn.JOBS or demand.work is None:
        return counted, jobs
    replicas, why = work_replicas(demand.work, current, spec)
    return min(replicas, counted), f"{jobs}; {why}"


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
    wanted, basis = _recommend(demand, current, spec)
    recommended = _clamp(wanted, spec)
    up_to = min([recommended, *_within(past, now, spec.scale_up_seconds)])
    down_to = max([recommended, *_within(past, now, spec.scale_down_seconds)])
    if current < up_to:
        target, why = up_to, "scale up"
    elif current > down_to:
        target, why = down_to, "scale down"
        keep = _clamp(replicas_for(demand.coming, spec.jobs_per_replica), spec)
        if target < min(current, keep):
            target, why = min(current, keep), "hold for jobs due within the scale-down window"
    else:
        target, why = current, "hold"
    target = _clamp(target, spec)
    floor = replicas_for(demand.running, spec.jobs_per_replica)
    if target < min(current, floor):
        target, why = min(current, floor), "hold for running jobs"
    reason = (
        f"{why}: {basis} ask for {recommended} (bounds {spec.min_replicas}..{spec.max_replicas})"
    )
    return Decision(
        desired=target,
        recommended=recommended,
        floor=floor,
        reason=reason,
        history=(*past, Recommendation(now, recommended)),
    )
