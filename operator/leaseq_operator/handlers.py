"""kopf handlers and the pool loop: every WorkerPool is read for queue depth and scaled.

kopf only *watches* WorkerPools here (``@kopf.on.event``): it keeps the latest body of each one
in :attr:`OperatorApp.pools`. The ticks run in the operator's own thread (:func:`run_pools`),
not as kopf timers, because kopf puts a finalizer on every object it times (kopf PR #548: a
timer without one never stops) and nothing can remove that finalizer once ``helm uninstall``
or a namespace deletion has removed the operator and its RBAC: the WorkerPool would stay
Terminating and the namespace with it. With no timer and no changing handler, kopf adds no
finalizer, and it removes the ``leaseq.dev/operator`` finalizer that earlier versions added.
Users' Deployments are read, scaled by a server-side apply of their scale subresource, and
(only one the chart created paused for the operator's first scale) resumed; every write names
the field manager ``leaseq-operator``.

kopf also watches pods (``@kopf.on.event``, nothing written to them): when the kubelet
reports a worker container terminated, the leading replica ends its workers' leases at once
(:func:`reclaim_terminated`, :mod:`leaseq_operator.terminations`).

Handlers are synchronous on purpose: kopf runs them in worker threads, where the blocking
``kubernetes`` client and the psycopg pool belong (never inside a coroutine).

One tick of a pool, every ``pollSeconds`` (checked every ``tick_seconds``):

1. parse the spec; a bad one sets ``SpecValid=False`` with the reason (the next poll tries
   again, so a fixed spec recovers by itself);
2. read depth with one stats query for the pool's queues, and what is coming (delayed jobs,
   the next slot of each schedule that enqueues into them, see :mod:`leaseq_operator.scaling`
   for how they count); if the database cannot be read, hold
   the replica count, set ``DatabaseReachable=False`` with the error and retry after
   ``pollSeconds`` (no scaling on missing data); a pool with ``scaleOn: Work`` also reads
   its work per job type, the workers table and its Deployment's pods, so pods whose worker
   still loads count as capacity already coming (a ``Jobs`` pool counts every replica it
   asked for, loading or not, so a slow load never makes it ask again);
3. decide with :func:`leaseq_operator.scaling.decide`; only the replica holding the reaper
   lease acts on the decision and writes status and Events (the others keep their history
   warm for a failover, and write nothing, whatever the outcome; when the database is down
   nobody holds the lease, and the replica that held it last reports the outage; when a
   worker or a ``leaseq reaper`` holds it, no replica scales and each says who holds it:
   ``LeaderLease=False``);
4. keep the pods' safe-to-evict annotations in step and, before shrinking, mark pods by
   deletion cost (idle cheapest); never shrink below the number of busy pods. A refused
   annotation patch is reported (``PodsAnnotated=False``, a Warning Event, a counter) and
   never stops step 5;
5. apply the Deployment's scale (at every change, and once per process to own the field),
   resume a Deployment the chart holds paused, write the status, and post an Event for
   every change.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import Any

import kopf

from leaseq.core.errors import LeaseqError
from leaseq.core.models import SILENT_AFTER_SECONDS, QueueStats, UnservedWork, WorkerRecord
from leaseq.core.queue import Queue
from leaseq.core.workers import Workers
from leaseq_operator import capacity, conditions, protection, scaling, terminations
from leaseq_operator.app import OperatorApp, PoolState, remedy
from leaseq_operator.conditions import Condition
from leaseq_operator.kube import POOL_LABEL, KubeError, ObjectRef, Pod, TargetNotFound
from leaseq_operator.spec import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    InvalidSpec,
    PoolSpec,
    ScaleOn,
    parse,
)

log = logging.getLogger("leaseq_operator.pools")
POOL_THREADS = 8  # WorkerPools polled at once (each tick mostly waits for PostgreSQL)


def _depth(stats: list[QueueStats]) -> dict[str, Any]:
    ages = [s.oldest_ready_age for s in stats if s.oldest_ready_age is not None]
    return {
        "ready": sum(s.ready for s in stats),
        "scheduled": sum(s.scheduled for s in stats),
        "scheduledSoon": sum(s.scheduled_soon for s in stats),
        "running": sum(s.running for s in stats),
        "dead": sum(s.dead for s in stats),
        "oldestReadyAge": round(max(ages), 3) if ages else 0.0,
    }


class Retry(Exception):
    """This pool's tick could not finish; poll it again after ``delay`` seconds."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


class PoolTick:
    """One tick of one WorkerPool; collects the status and the Events to write."""

    def __init__(
        self, app: OperatorApp, body: Mapping[str, Any], at: datetime | None = None
    ) -> None:
        self.app = app
        self.body = body
        self.at = at  # the readings' database time: None (now) but in tests
        meta = body.get("metadata", {})
        self.namespace = str(meta.get("namespace"))
        self.ref = ObjectRef(
            GROUP, VERSION, PLURAL, KIND, self.namespace, str(meta.get("name")), meta.get("uid")
        )
        self.key = f"{self.namespace}/{self.ref.name}"
        self.status: dict[str, Any] = {}
        self.updates: list[Condition] = []
        self.events: list[tuple[str, str, str]] = []  # (type, reason, message)
        self.queue: Queue | None = None  # the pool's database, once its depth was read
        self.workers: Workers | None = None
        self.annotation_problem: str | None = None  # why the pods could not be annotated
        self.reports = False  # write the status although this replica does not report

    # -- reporting -------------------------------------------------------------------------

    def condition(self, type_: str, ok: bool, reason: str, message: str) -> None:
        self.updates.append(Condition(type_, ok, reason, message))

    def flush(self) -> None:
        """Write the status and post one Event per condition that changed (leader only)."""
        existing = (self.body.get("status") or {}).get("conditions") or []
        merged, changed = conditions.merge(existing, self.updates)
        self.status["conditions"] = merged
        self.status["observedGeneration"] = self.body.get("metadata", {}).get("generation")
        self.app.kube.patch_status(self.ref, self.status)
        for c in changed:
            kind = "Normal" if c.ok else "Warning"
            self.events.insert(0, (kind, c.reason, f"{c.type}: {c.message}"))
        for type_, reason, message in self.events:
            self.app.kube.post_event(self.ref, type_, reason, message)

    # -- the tick --------------------------------------------------------------------------

    def spec(self) -> PoolSpec:
        try:
            pool = parse(self.body.get("spec") or {})
        except InvalidSpec as exc:
            self.condition(conditions.SPEC_VALID, False, "InvalidSpec", str(exc))
            raise
        self.condition(conditions.SPEC_VALID, True, "Valid", "spec accepted")
        self.app.metrics.known_queues(pool.queues)
        return pool

    def read_depth(self, pool: PoolSpec, state: PoolState) -> scaling.Demand | LeaseqError:
        """Read the pool's demand; jobs due later (delayed jobs, the schedules' next slots)
        count by the horizons of :mod:`leaseq_operator.scaling` (lead time from the spec or
        the model-load time the pool's workers last reported, remembered in ``state``)."""
        try:
            url = None
            if pool.database_secret is not None:
                ref = pool.database_secret
                url = self.app.kube.secret_value(self.namespace, ref.name, ref.key)
            self.queue = self.app.databases.queue(url)
            self.workers = self.app.databases.workers(url)
            registered = self.workers.list(pool.queues)
            reported = capacity.reported_startup(registered)
            if reported is not None:
                state.reported_startup = reported
            lead = scaling.lead_seconds(pool, state.reported_startup)
            soon = scaling.soon_seconds(pool, lead)
            stats = self.queue.stats(pool.queues, horizon=soon, now=self.at)
            # Work no live worker of the pool can do is not a reason for more replicas.
            unserved = self.queue.unserved(
                pool.queues, live_seconds=SILENT_AFTER_SECONDS, now=self.at
            )
            # Ready jobs of keys at their concurrency limit are not work a new pod could take.
            flow = self.app.databases.flow(url).summary(pool.queues, now=self.at)
            claimable = sum(f.claimable for f in flow)
            horizon = scaling.coming_seconds(pool, lead)
            coming = self.app.databases.schedules(url).coming(
                pool.queues, horizon=horizon, now=self.at
            )
            slots = [s.job_type for s in coming.slots_within(soon)]
            self.status.update(_depth(stats))
            work = None
            if pool.scale_on is ScaleOn.WORK:
                work = self.read_work(pool, self.queue, registered, unserved, soon, slots)
        except LeaseqError as exc:
            self.condition(conditions.DATABASE_REACHABLE, False, "DatabaseUnreadable", str(exc))
            return exc
        self.condition(conditions.DATABASE_REACHABLE, True, "DepthRead", "queue depth read")
        depth = self.status
        self.status["claimable"] = claimable
        self.status["coming"] = coming.delayed + len(coming.slots_within(horizon))
        self.status["scaleAheadSeconds"] = round(lead, 3)
        ready = max(0, min(depth["ready"], claimable) - sum(u.ready for u in unserved))
        return scaling.Demand(
            ready,
            depth["scheduledSoon"] + len(slots),
            depth["running"],
            work,
            coming=self.status["coming"],
        )

    def read_work(
        self,
        pool: PoolSpec,
        queue: Queue,
        registered: list[WorkerRecord],
        unserved: list[UnservedWork],
        soon: float,
        slots: list[str],
    ) -> scaling.Work:
        """The work-seconds of the pool's jobs (but ``unserved`` ones; with the job types of
        the schedules' ``slots`` due within ``soon`` seconds) and which of its pods take work
        or still load, for a pool that scales on work (after the depth was read)."""
        loads = queue.work(pool.queues, window=pool.work.window_seconds, horizon=soon, now=self.at)
        types = scaling.servable(scaling.with_slots(loads, slots), unserved)
        pods = self.app.kube.pods(self.namespace, pool.deployment)
        states = capacity.pod_states([p.name for p in pods if not p.terminating], registered)
        seconds = scaling.work_seconds(types, pool.work.default_job_seconds)
        self.status["workSeconds"] = round(seconds, 3)
        self.status["loadingReplicas"] = len(states.loading)
        return scaling.Work(
            seconds=seconds,
            oldest_ready_age=self.status["oldestReadyAge"],
            active=states.active,
            loading=states.loading,
            reported_startup_seconds=states.reported_startup_seconds,
        )

    def protect(self, pool: PoolSpec, current: int, desired: int) -> int:
        """Keep the pods' safe-to-evict annotations in step with their busyness (every tick:
        the cluster autoscaler drains nodes at any time). Before a scale-down, also set
        deletion costs, and never shrink below the busy pods.

        Annotating is a duty of its own: a patch the API server refuses (an admission policy,
        a conflict) never stops the scaling. It sets ``PodsAnnotated=False`` with the server's
        message (a Warning Event when it starts) and is counted; the replicas are still
        limited to the busy pods. Only when the pods or the workers cannot be read (so which
        pods are busy is unknown) is a scale-down held."""
        shrinking = desired < current
        hold = current if shrinking else desired
        held = f"holding {current} replicas; " if shrinking else ""
        try:
            pods = [
                p for p in self.app.kube.pods(self.namespace, pool.deployment) if not p.terminating
            ]
        except KubeError as exc:
            self.annotation_failure("PodsUnreadable", f"{held}cannot list the pods: {exc}")
            return hold
        self.scheduling(pods)
        try:
            workers = self.workers.list(pool.queues) if self.workers else []
        except LeaseqError as exc:  # which pods are busy is unknown: change and shrink nothing
            self.annotation_failure("WorkersUnreadable", f"{held}cannot read the workers: {exc}")
            return hold
        loads = protection.pod_loads([p.name for p in pods], workers)
        annotations = {p.name: p.annotations for p in pods}
        patches: dict[str, dict[str, str]] = {}
        for pod, value in protection.eviction_changes(loads, annotations).items():
            patches.setdefault(pod, {})[protection.SAFE_TO_EVICT] = value
        if shrinking:
            for pod, cost in protection.cost_changes(loads, annotations).items():
                patches.setdefault(pod, {})[protection.DELETION_COST] = cost
        failed: list[KubeError] = []
        for pod, patch in patches.items():
            try:
                self.app.kube.annotate_pod(self.namespace, pod, patch)
            except KubeError as exc:
                failed.append(exc)
        if failed:
            self.app.metrics.annotation_failed(self.key, len(failed))
            self.annotation_failure(
                "AnnotationFailed",
                f"{len(failed)} of {len(patches)} pod annotation patches failed: {failed[0]}",
            )
        else:
            self.condition(conditions.PODS_ANNOTATED, True, "Annotated", "pod annotations written")
        if not shrinking:
            return desired
        busy = sum(1 for load in loads.values() if not load.idle)
        limited = protection.limit_scale_down(current, desired, busy)
        if limited != desired:
            log.info(
                "%s: scale-down to %d limited to %d: %d pods are busy",
                self.key,
                desired,
                limited,
                busy,
            )
        return limited

    def scheduling(self, pods: list[Pod]) -> None:
        """``PodsScheduled``: False, with the scheduler's message, while pods wait for a node."""
        waiting = [p for p in pods if p.unschedulable is not None]
        if not waiting:
            self.condition(conditions.PODS_SCHEDULED, True, "Scheduled", "every pod has a node")
            return
        first = waiting[0]
        self.condition(
            conditions.PODS_SCHEDULED,
            False,
            "Unschedulable",
            f"{len(waiting)} of {len(pods)} pods cannot be scheduled; {first.name}: "
            f"{first.unschedulable}",
        )

    def leader_elsewhere(self) -> None:
        """When no operator replica can lead because a worker or a ``leaseq reaper`` holds
        the leader lease, say so on the pool (every replica does: none leads to say it)."""
        other = self.app.lease_holder
        if other is None:
            return
        kind = other.kind.value.capitalize()
        self.condition(
            conditions.LEADER_LEASE,
            False,
            f"HeldBy{kind}",
            f"{other.kind.value} {other.holder} holds the leader lease (term {other.term}, "
            f"until {conditions.timestamp(other.expires_at)}): no operator replica scales this "
            f"pool while it does; {remedy(other)}, and the operator takes the lease when it "
            f"lapses",
        )
        self.reports = True

    def annotation_failure(self, reason: str, message: str) -> None:
        self.condition(conditions.PODS_ANNOTATED, False, reason, message)
        self.annotation_problem = message

    def run(self, state: PoolState, now: float) -> None:
        """Decide, and act when this replica leads (raises :class:`Retry` to poll again later)."""
        pool = self.spec()
        demand = self.read_depth(pool, state)
        try:
            target = self.app.kube.target(self.namespace, pool.deployment)
        except TargetNotFound as exc:
            self.condition(conditions.TARGET_FOUND, False, "DeploymentNotFound", str(exc))
            raise Retry(str(exc), pool.poll_seconds) from exc
        if not self.app.config.namespace and target.pool_label != self.ref.name:
            # Watching every namespace, the operator scales only Deployments whose owner
            # labelled them for this pool: a WorkerPool cannot point it at someone else's
            # Deployment, and the admission policy refuses the writes anyway.
            message = (
                f"deployment {self.namespace}/{pool.deployment} is not labelled for this pool: "
                f"in clusterWide mode its spec.selector.matchLabels (and so its pod template) "
                f"must carry {POOL_LABEL}: {self.ref.name} (found: "
                f"{'none' if target.pool_label is None else repr(target.pool_label)}); "
                f"the operator leaves it alone until it does"
            )
            self.condition(conditions.TARGET_FOUND, False, "DeploymentNotLabelled", message)
            raise Retry(message, pool.poll_seconds)
        self.condition(conditions.TARGET_FOUND, True, "DeploymentFound", pool.deployment)
        # A Deployment the chart created paused has no pod yet: its count (the API server's
        # default of 1) is nothing to hold, so the pool's own decision is its first count,
        # applied before the resume (a fresh install with an empty queue starts no pod).
        current = 0 if target.unstarted else target.replicas
        decision = scaling.decide(
            None if isinstance(demand, LeaseqError) else demand,
            current,
            () if target.unstarted else state.history,
            pool,
            now,
        )
        state.history = decision.history
        if isinstance(demand, LeaseqError):
            self.status["currentReplicas"] = current
            raise Retry(f"holding {current} replicas: {demand}", pool.poll_seconds)
        if not self.app.leading:
            self.leader_elsewhere()
            return  # a standby replica: the leader scales
        lease = self.app.reaper.lease
        self.condition(
            conditions.LEADER_LEASE,
            True,
            "HeldByOperator",
            f"operator replica {lease.holder} holds the leader lease (term {lease.term})",
        )
        desired = self.protect(pool, current, decision.desired)
        if desired != current or not state.claimed:
            # Once per process even at an unchanged count: the apply makes the operator an
            # owner of spec.replicas, so a chart or GitOps apply that once wrote the field and
            # now leaves it out does not remove it (see Kube.scale).
            self.app.kube.scale(self.namespace, pool.deployment, desired)
            state.claimed = True
        if target.held:
            self.app.kube.resume(self.namespace, pool.deployment, target.paused)
            log.info("%s: %s resumed at %d replicas", self.key, pool.deployment, desired)
        if desired != current:
            self.status["lastScaleTime"] = conditions.timestamp()
            kind = "ScaledUp" if desired > current else "ScaledDown"
            message = f"{pool.deployment} from {current} to {desired} replicas: {decision.reason}"
            self.events.append(("Normal", kind, message))
            log.info("%s: scaled %s", self.key, message)
        self.status["desiredReplicas"] = desired
        self.status["currentReplicas"] = current
        self.app.metrics.pool(self.key, desired=desired, current=current)


def tick_pool(
    app: OperatorApp, key: str, state: PoolState, now: float, at: datetime | None = None
) -> None:
    """Poll one WorkerPool if it is due; write what it found only in the leading replica.

    ``now`` is the clock of the scaling history (monotonic seconds); ``at`` the database
    time the readings are taken at (None: the database's now; tests move it)."""
    body = state.body
    if body is None or not state.due(now, app.config.tick_seconds):
        return
    state.last_poll = now
    state.delay = None
    pool_tick = PoolTick(app, body, at)
    problem: str | None = None
    try:
        pool_tick.run(state, now)
    except InvalidSpec as exc:
        problem = f"invalid spec: {exc}"
    except Retry as exc:
        problem, state.delay = str(exc), exc.delay
    except KubeError as exc:
        problem, state.delay = str(exc), app.config.tick_seconds
    # Log a problem when it starts or changes, not at every poll while it lasts.
    if problem != state.problem:
        if problem is not None:
            log.warning("%s: %s", key, problem)
        elif state.problem is not None:
            log.info("%s: recovered", key)
        state.problem = problem
    annotation_problem = pool_tick.annotation_problem
    if app.leading and annotation_problem != state.annotation_problem:
        if annotation_problem is not None:
            log.warning("%s: pod annotations: %s", key, annotation_problem)
        elif state.annotation_problem is not None:
            log.info("%s: pod annotations written again", key)
        state.annotation_problem = annotation_problem
    if app.reports or pool_tick.reports:
        try:
            pool_tick.flush()
        except KubeError as exc:
            log.warning("%s: could not write status: %s", key, exc)


def _tick(app: OperatorApp, key: str, state: PoolState) -> None:
    try:
        tick_pool(app, key, state, time.monotonic())
    except Exception:  # one pool's bug must not stop the others
        log.exception("%s: tick failed", key)
    # Deleted while this tick ran: the tick may have exported the pool's gauges again after
    # the watch forgot them.
    if key not in app.pools:
        app.metrics.forget_pool(key)


def run_pools(app: OperatorApp, stop: threading.Event) -> None:
    """Tick every known WorkerPool every ``tick_seconds`` until ``stop`` is set.

    Pools tick in parallel, one tick per pool at a time: a pool whose database hangs until
    its timeout delays only itself (as kopf's per-object timers did)."""
    busy: dict[str, Future[None]] = {}
    with ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="leaseq-pool") as executor:
        while not stop.wait(app.config.tick_seconds):
            for key, state in list(app.pools.items()):
                if key not in busy or busy[key].done():
                    busy[key] = executor.submit(_tick, app, key, state)
            for key in [k for k, f in busy.items() if k not in app.pools and f.done()]:
                del busy[key]


RECLAIM_TRIES = 5  # a reap pass holding the pass lock is short: try again this many times
RECLAIM_RETRY_SECONDS = 0.2


def reclaim_terminated(app: OperatorApp, body: Mapping[str, Any], deleted: bool) -> None:
    """End at once the leases of the workers that ran in ``body``'s worker container if the
    kubelet reported it terminated (:mod:`leaseq_operator.terminations`); only the leading
    replica acts, once per termination. A pod whose statuses do not say so (deleted while
    running, on a node that stopped reporting) leaves its jobs to their leases."""
    ended = terminations.terminated(body)
    uid = str((body.get("metadata") or {}).get("uid") or "")
    try:
        if ended is None or app.reclaimed.get(uid) == ended.finished_at:
            return
        for _ in range(RECLAIM_TRIES):
            try:
                reaped = app.reaper.reclaim(ended.pod, ended.node, ended.finished_at)
            except LeaseqError as exc:
                log.warning(
                    "pod %s/%s: could not end the leases of its terminated worker: %s",
                    ended.namespace, ended.pod, exc,
                )  # fmt: skip
                return
            if reaped is not None:
                break
            if not app.leading:
                return  # the leader reclaims
            time.sleep(RECLAIM_RETRY_SECONDS)  # a reap pass holds the lock: a short wait
        else:
            return
        app.reclaimed[uid] = ended.finished_at
        if reaped:
            log.info(
                "pod %s/%s: worker container terminated (%s, exit code %s, at %s): %d jobs of "
                "%s back without waiting for their leases",
                ended.namespace, ended.pod, ended.reason, ended.exit_code,
                conditions.timestamp(ended.finished_at), len(reaped),
                ", ".join(sorted({job.previous_owner for job in reaped})),
                extra={"pod": ended.pod, "namespace": ended.namespace, "node": ended.node},
            )  # fmt: skip
    finally:
        if deleted:
            app.reclaimed.pop(uid, None)


def build_registry(app: OperatorApp) -> kopf.OperatorRegistry:
    """A registry with the operator's handlers bound to ``app`` (one per operator instance)."""
    registry = kopf.OperatorRegistry()
    stop = threading.Event()
    loop = threading.Thread(target=run_pools, args=(app, stop), name="leaseq-pools", daemon=True)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return app.cluster.login(**kwargs)

    @kopf.on.startup(registry=registry)
    def startup(**_: Any) -> None:
        app.start()
        loop.start()

    @kopf.on.cleanup(registry=registry)
    def cleanup(**_: Any) -> None:
        stop.set()
        if loop.is_alive():
            loop.join(app.config.database_timeout + app.config.tick_seconds)
        app.stop()

    @kopf.on.probe(id="reaper", registry=registry)
    def reaper_probe(**_: Any) -> Mapping[str, bool]:
        if not app.reaper.alive:
            raise RuntimeError("the reaper thread is not running")
        return {"leading": app.leading}

    # Watching only, as for WorkerPools: no finalizer, nothing written to the pods.
    @kopf.on.event("", "v1", "pods", registry=registry)
    def pods(type: str | None, body: kopf.Body, **_: Any) -> None:
        reclaim_terminated(app, body, deleted=type == "DELETED")

    # Watching only: an event handler needs no finalizer (see the module docstring).
    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    def watch(type: str | None, body: kopf.Body, **_: Any) -> None:
        key = f"{body.metadata.namespace}/{body.metadata.name}"
        if type == "DELETED" or body.metadata.get("deletionTimestamp"):
            if app.pools.pop(key, None) is not None:
                app.metrics.forget_pool(key)
            return
        app.pools.setdefault(key, PoolState()).body = copy.deepcopy(dict(body))

    return registry
