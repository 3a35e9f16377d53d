"""kopf handlers: a timer on every WorkerPool that reads queue depth and scales its Deployment.

Handlers are synchronous on purpose: kopf runs them in worker threads, where the blocking
``kubernetes`` client and the psycopg pool belong (never inside a coroutine). Timers live on
WorkerPool objects only, since kopf puts its finalizer on whatever it times; users'
Deployments are only read and scaled through their scale subresource.

One tick of a pool, every ``pollSeconds`` (checked at each timer tick):

1. parse the spec; a bad one sets ``SpecValid=False`` with the reason and fails permanently
   (the timer tries again next tick, so a fixed spec recovers by itself);
2. read depth with one stats query for the pool's queues; if the database cannot be read, hold
   the replica count, set ``DatabaseReachable=False`` with the error and retry after
   ``pollSeconds`` (no scaling on missing data); a pool with ``scaleOn: Work`` also reads
   its work per job type, the workers table and its Deployment's pods, so pods whose worker
   still loads count as capacity already coming (a ``Jobs`` pool counts every replica it
   asked for, loading or not, so a slow load never makes it ask again);
3. decide with :func:`leaseq.operator.scaling.decide`; only the replica holding the reaper
   lease acts on the decision (the others keep their history warm for a failover);
4. before shrinking, mark pods by deletion cost (idle cheapest) and never shrink below the
   number of busy pods;
5. patch the Deployment's scale, the status, and post an Event for every change.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import kopf

from leaseq.core.errors import LeaseqError
from leaseq.core.models import QueueStats
from leaseq.core.queue import Queue
from leaseq.core.workers import Workers
from leaseq.operator import capacity, conditions, protection, scaling
from leaseq.operator.app import OperatorApp, PoolState
from leaseq.operator.conditions import Condition
from leaseq.operator.kube import KubeError, TargetNotFound
from leaseq.operator.spec import GROUP, PLURAL, VERSION, InvalidSpec, PoolSpec, ScaleOn, parse


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


class PoolTick:
    """One tick of one WorkerPool; collects the status patch and the events to post."""

    def __init__(
        self,
        app: OperatorApp,
        body: kopf.Body,
        patch: kopf.Patch,
        logger: kopf.Logger,
    ) -> None:
        self.app = app
        self.body = body
        self.patch = patch
        self.logger = logger
        self.namespace = str(body.metadata.namespace)
        self.key = f"{self.namespace}/{body.metadata.name}"
        self.status: dict[str, Any] = {}
        self.updates: list[Condition] = []
        self.queue: Queue | None = None  # the pool's database, once its depth was read
        self.workers: Workers | None = None

    # -- reporting -------------------------------------------------------------------------

    def condition(self, type_: str, ok: bool, reason: str, message: str) -> None:
        self.updates.append(Condition(type_, ok, reason, message))

    def flush(self) -> None:
        """Write the status patch and post one Event per condition that changed."""
        existing = self.body.status.get("conditions") or []
        merged, changed = conditions.merge(existing, self.updates)
        self.status["conditions"] = merged
        self.status["observedGeneration"] = self.body.metadata.get("generation")
        self.patch.status.update(self.status)
        for c in changed:
            kind = "Normal" if c.ok else "Warning"
            kopf.event(self.body, type=kind, reason=c.reason, message=f"{c.type}: {c.message}")

    # -- the tick --------------------------------------------------------------------------

    def spec(self) -> PoolSpec:
        try:
            pool = parse(self.body.spec)
        except InvalidSpec as exc:
            self.condition(conditions.SPEC_VALID, False, "InvalidSpec", str(exc))
            raise
        self.condition(conditions.SPEC_VALID, True, "Valid", "spec accepted")
        self.app.metrics.known_queues(pool.queues)
        return pool

    def read_depth(self, pool: PoolSpec) -> scaling.Demand | LeaseqError:
        try:
            url = None
            if pool.database_secret is not None:
                ref = pool.database_secret
                url = self.app.kube.secret_value(self.namespace, ref.name, ref.key)
            self.queue = self.app.databases.queue(url)
            self.workers = self.app.databases.workers(url)
            stats = self.queue.stats(pool.queues, horizon=pool.poll_seconds)
            self.status.update(_depth(stats))
            work = None
            if pool.scale_on is ScaleOn.WORK:
                work = self.read_work(pool, self.queue, self.workers)
        except LeaseqError as exc:
            self.condition(conditions.DATABASE_REACHABLE, False, "DatabaseUnreadable", str(exc))
            return exc
        self.condition(conditions.DATABASE_REACHABLE, True, "DepthRead", "queue depth read")
        depth = self.status
        return scaling.Demand(depth["ready"], depth["scheduledSoon"], depth["running"], work)

    def read_work(self, pool: PoolSpec, queue: Queue, workers: Workers) -> scaling.Work:
        """The work-seconds of the pool's jobs and which of its pods take work or still
        load, for a pool that scales on work (after the depth was read)."""
        types = queue.work(pool.queues, window=pool.work.window_seconds, horizon=pool.poll_seconds)
        registered = workers.list(pool.queues)
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
        """Set deletion costs on the Deployment's pods; never shrink below the busy pods."""
        pods = [p for p in self.app.kube.pods(self.namespace, pool.deployment) if not p.terminating]
        try:
            workers = self.workers.list(pool.queues) if self.workers else []
        except LeaseqError as exc:  # which pods are busy is unknown: shrink nothing
            self.logger.warning(f"holding {current} replicas: cannot read the workers: {exc}")
            return current
        loads = protection.pod_loads([p.name for p in pods], workers)
        changes = protection.cost_changes(loads, {p.name: p.annotations for p in pods})
        for pod, cost in changes.items():
            self.app.kube.annotate_pod(self.namespace, pod, {protection.DELETION_COST: cost})
        busy = sum(1 for load in loads.values() if not load.idle)
        limited = protection.limit_scale_down(current, desired, busy)
        if limited != desired:
            self.logger.info(f"scale-down to {desired} limited to {limited}: {busy} pods are busy")
        return limited

    def run(self, state: PoolState, now: float) -> bool:
        """Decide and act; False when this replica is a standby with nothing to report."""
        pool = self.spec()
        demand = self.read_depth(pool)
        try:
            current = self.app.kube.replicas(self.namespace, pool.deployment)
        except TargetNotFound as exc:
            self.condition(conditions.TARGET_FOUND, False, "DeploymentNotFound", str(exc))
            raise kopf.TemporaryError(str(exc), delay=pool.poll_seconds) from exc
        self.condition(conditions.TARGET_FOUND, True, "DeploymentFound", pool.deployment)
        decision = scaling.decide(
            None if isinstance(demand, LeaseqError) else demand,
            current,
            state.history,
            pool,
            now,
        )
        state.history = decision.history
        if isinstance(demand, LeaseqError):
            self.status["currentReplicas"] = current
            raise kopf.TemporaryError(
                f"holding {current} replicas: {demand}", delay=pool.poll_seconds
            )
        if not self.app.leading:
            return False  # a standby replica: the leader scales and writes status
        desired = decision.desired
        if desired < current:
            desired = self.protect(pool, current, desired)
        if desired != current:
            self.app.kube.scale(self.namespace, pool.deployment, desired)
            self.status["lastScaleTime"] = conditions.timestamp()
            kind = "ScaledUp" if desired > current else "ScaledDown"
            message = f"{pool.deployment} from {current} to {desired} replicas: {decision.reason}"
            kopf.event(self.body, type="Normal", reason=kind, message=message)
            self.logger.info(message)
        self.status["desiredReplicas"] = desired
        self.status["currentReplicas"] = current
        self.app.metrics.pool(self.key, desired=desired, current=current)
        return True


def build_registry(app: OperatorApp) -> kopf.OperatorRegistry:
    """A registry with the operator's handlers bound to ``app`` (one per operator instance)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return app.cluster.login(**kwargs)

    @kopf.on.startup(registry=registry)
    def startup(**_: Any) -> None:
        app.start()

    @kopf.on.cleanup(registry=registry)
    def cleanup(**_: Any) -> None:
        app.stop()

    @kopf.on.probe(id="reaper", registry=registry)
    def reaper_probe(**_: Any) -> Mapping[str, bool]:
        if not app.reaper.alive:
            raise RuntimeError("the reaper thread is not running")
        return {"leading": app.leading}

    @kopf.timer(GROUP, VERSION, PLURAL, interval=app.config.tick_seconds, registry=registry)
    def tick(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any) -> None:
        key = f"{body.metadata.namespace}/{body.metadata.name}"
        state = app.pools.setdefault(key, PoolState())
        now = time.monotonic()
        if not state.due(body.spec.get("pollSeconds"), now, app.config.tick_seconds):
            return
        state.last_poll = now
        pool_tick = PoolTick(app, body, patch, logger)
        report = True
        try:
            report = pool_tick.run(state, now)
        except InvalidSpec as exc:
            raise kopf.PermanentError(str(exc)) from exc
        except KubeError as exc:
            raise kopf.TemporaryError(str(exc), delay=app.config.tick_seconds) from exc
        finally:
            if report:
                pool_tick.flush()

    @kopf.on.delete(GROUP, VERSION, PLURAL, optional=True, registry=registry)
    def forget(body: kopf.Body, **_: Any) -> None:
        key = f"{body.metadata.namespace}/{body.metadata.name}"
        app.pools.pop(key, None)
        app.metrics.forget_pool(key)

    return registry
