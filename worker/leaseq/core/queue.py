"""leaseq's synchronous Python API: every job transition, fenced by lease token.

Give :class:`Queue` a pool or an autocommit connection (see :func:`leaseq.open_pool` and
:func:`leaseq.connect`): each call then commits on its own, and each is one statement, so no
transaction is ever held while a handler runs.

Infrastructure faults: on a pool, a worker-side write (heartbeat, checkpoint, complete, fail,
release) whose connection drops is sent once more on a fresh connection. That is safe because
each is fenced by owner and token; and a repeat that finds the lease gone looks up how the
attempt ended, so a first try whose commit was lost with its connection is answered by what
it really did. Everything written is made storable first (:mod:`leaseq.core.bounded`).

To enqueue in the same transaction as the row that caused the job, pass your own
non-autocommit connection as ``conn=``: the job commits (and listeners wake) when you commit,
or vanishes if you roll back.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import UUID, uuid4

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import DictRow

from leaseq.core import bounded, capability, tracing, validation, waiters
from leaseq.core._store.store import Store, graph_rows, json_param, pipeline_of
from leaseq.core.claims import ClaimPlan, Claims, keyless_then_keyed
from leaseq.core.db import Conn, Db, borrow, replaceable, transaction
from leaseq.core.errors import (
    DatabaseUnavailable,
    InvalidJob,
    JobNotFound,
    JobStateError,
    LeaseqError,
    PipelineTimeout,
    ResultTimeout,
    TransactionConflict,
)
from leaseq.core.graph import Dep, Graph, Plan
from leaseq.core.models import (
    DEFAULT_LEASE_SECONDS,
    FINISHED_STATUSES,
    MAX_STREAM_ITEM_BYTES,
    MAX_STREAM_ITEMS,
    SILENT_AFTER_SECONDS,
    STEP_UNCERTAIN_CODE,
    After,
    AttemptOutcome,
    AttemptRecord,
    Call,
    Cancelled,
    ClaimedJob,
    ClaimRequest,
    ClaimTable,
    Completed,
    EffectRecord,
    Enqueued,
    Failed,
    Fenced,
    GraphEnqueued,
    Heartbeat,
    HeartbeatStatus,
    JobLinks,
    JobOutcome,
    JobRecord,
    JobStatus,
    JobTypeWork,
    Lease,
    ParentResult,
    PipelineCancelled,
    PipelineOutcome,
    PipelineRecord,
    PruneCandidates,
    QueueFinished,
    QueueStats,
    Reaped,
    Released,
    RetryPolicy,
    Signalled,
    SignalRecord,
    SignalWaits,
    StepRecord,
    StreamItem,
    StreamPage,
    UncertainStep,
    UnservedWork,
    WaitingOn,
    cancelled_of,
    unsettled_reason,
)
from leaseq.core.redact import redact

# Why a job that is not dead cannot be retried, and what to do instead, by its status.
_NOT_RETRYABLE = {
    JobStatus.SUCCEEDED: "already succeeded: there is nothing to retry (only dead jobs can be "
    "retried; to run the work again, enqueue a new job)",
    JobStatus.CANCELLED: "was cancelled; only dead jobs can be retried (to run the work, "
    "enqueue a new job)",
    JobStatus.PENDING: "is still pending: it will run without a retry (only dead jobs can be "
    "retried)",
    JobStatus.RUNNING: "is running now; only dead jobs can be retried",
    JobStatus.WAITING: "is waiting for its parents; only dead jobs can be retried",
    JobStatus.HELD: "is held at an uncertain step: settle the step with `leaseq steps "
    "resolve` (only dead jobs can be retried)",
}

log = logging.getLogger("leaseq.queue")

#: The longest a BackOff hands a job back for, and pauses its key (the database agrees).
MAX_BACK_OFF_SECONDS = 86_400.0

T = TypeVar("T")

MAX_CLAIM_BATCH = 100
#: Lost claim calls remembered per owner (older ones are left to the reaper).
MAX_LOST_CLAIMS = 16
#: Attempts :meth:`Queue.work` reads at most to estimate run times (the newest ones).
WORK_SAMPLES = 2000


@dataclass(frozen=True)
class JobSpec:
    """Everything that describes a job to enqueue; see :meth:`Queue.enqueue` for the fields."""

    queue: str
    job_type: str
    payload: Any = None
    # The rest by name only, as in Queue.enqueue: ten optional fields, several of one type,
    # which a call counting positions could swap unnoticed.
    _: KW_ONLY
    priority: int = 100
    run_at: datetime | None = None
    delay: float = 0.0
    max_attempts: int = 5
    timeout: float | None = None
    idempotency_key: str | None = None
    dedup_key: str | None = None
    #: A producer will wait for it: its final transition notifies (see Queue.result).
    wait: bool = False
    #: Flow-control key (e.g. a tenant): the queue's limits for it apply (leaseq.FlowControl).
    key: str | None = None
    #: Aggregate whose jobs run one at a time in enqueue order (only the head is claimable).
    ordering_key: str | None = None
    #: The W3C trace context (``traceparent``, ``tracestate``) its attempts continue; None:
    #: the enqueue's span's (leaseq.core.tracing), if a tracer provider is set.
    trace_context: Mapping[str, str] | None = None

    def validated(self) -> JobSpec:
        """This spec, checked: raises InvalidJob naming the first bad field."""
        validation.queue_name(self.queue)
        validation.name("job_type", self.job_type)
        validation.json_value("payload", self.payload)
        validation.priority(self.priority)
        validation.within_horizon("delay", self.delay)
        validation.attempts("max_attempts", self.max_attempts)
        if self.timeout is not None:
            validation.positive("timeout", self.timeout)
            validation.within_horizon("timeout", self.timeout)
        validation.optional_key("idempotency_key", self.idempotency_key)
        validation.optional_key("dedup_key", self.dedup_key)
        validation.flow_key("key", self.key)
        validation.flow_key("ordering_key", self.ordering_key)
        tracing.checked_carrier("trace_context", self.trace_context)
        if self.run_at is not None and self.run_at.tzinfo is None:
            raise InvalidJob("run_at", "must be timezone-aware")
        return self


def statement_fields(spec: JobSpec, carrier: tracing.Carrier | None) -> dict[str, Any]:
    """The job_enqueue parameters of ``spec`` (``wait`` flags the new job notify_done), in
    the trace of ``carrier`` (the enqueue span's) unless the spec names its own."""
    fields = dataclasses.asdict(spec)
    if spec.trace_context is None:
        fields["trace_context"] = carrier
    return fields


def enqueued(specs: Sequence[JobSpec], rows: Sequence[DictRow | None]) -> list[Enqueued]:
    """What job_enqueue's rows say about each spec (shared with the asyncio face)."""
    results = []
    for spec, row in zip(specs, rows, strict=True):
        if row is None:
            # The unfinished job holding this dedup key is not visible to this call: a
            # concurrent enqueue committed after this statement's snapshot, or another
            # producer role enqueued it (a producer reads only its own jobs).
            # Worded as leaseq.enqueue's, and so it does not tell whose job holds the key.
            raise JobStateError(
                f"dedup_key {spec.dedup_key!r} in queue {spec.queue!r} is held by an unfinished "
                "job this call cannot read: retry to get its id if it was enqueued "
                "concurrently; dedup keys are per queue across all producers, so make yours "
                "unique to your application (a prefix)"
            )
        results.append(Enqueued(job_id=row["id"], created=row["created"]))
    return results


def _lease_fields(lease: Lease) -> dict[str, Any]:
    return {
        "job_id": lease.job_id,
        "worker": lease.owner,
        "token": lease.token,
        "attempt": lease.attempt,
    }


def _storable(value: Any, what: str, lease: Lease) -> Any:
    """``value`` with what jsonb cannot hold replaced (logged, since nothing else records it)."""
    stored = bounded.json(value, what)
    if stored.note:
        log.warning("%s stored with changes: %s", what, stored.note, extra=_lease_fields(lease))
    return stored.value


#: A pipeline mode of :func:`write_plan`: a new pipeline for the graph, or join the one of
#: its first existing parent that has one (``enqueue(after=...)``).
NEW_PIPELINE = "new"
JOIN_PIPELINE = "join"
#: Parents per page of :meth:`Queue.parent_results`.
PARENT_PAGE = 1000
#: Times a transaction PostgreSQL rolled back to break a deadlock is run again.
CONFLICT_RETRIES = 5


def unresolvable(
    job_id: int, step: str, record: JobRecord | None, steps: Sequence[StepRecord]
) -> LeaseqError:
    """Why step ``step`` of job ``job_id`` (``record``, with ``steps``) was not settled."""
    if record is None:
        return JobNotFound(job_id)
    named = {s.name: s for s in steps}
    why = unsettled_reason(step, record.status, named.get(step))
    if step not in named:
        why += f" (its steps: {', '.join(sorted(named)) or 'none'})"
    return JobStateError(f"job {job_id} {why}")


def checked_plan(graph: Graph) -> Plan:
    """``graph`` validated: its shape (:meth:`Graph.plan`) and every node's job fields."""
    plan = graph.plan()
    validation.name("pipeline name", plan.name)
    for node in plan.nodes:
        spec = JobSpec(
            queue=node.queue,
            job_type=node.job_type,
            payload=node.payload,
            priority=node.priority,
            run_at=node.run_at,
            delay=node.delay,
            max_attempts=node.max_attempts,
            timeout=node.timeout,
            idempotency_key=node.idempotency_key,
            key=node.key if isinstance(node.key, str) else None,
        )
        spec.validated()
    return plan


def single_plan(spec: JobSpec, after: Iterable[int | Dep], when: After) -> Plan:
    """The one-node plan of ``enqueue(..., after=...)``, with its flow key (none inherited:
    its parents did not spawn it); dedup keys are refused (a waiting job is outside the
    dedup index), and so are ordering keys (a waiting job is outside its aggregate's order:
    refused rather than dropped)."""
    if spec.dedup_key is not None:
        raise InvalidJob(
            "dedup_key", "cannot be combined with after= (a waiting job is not deduplicated)"
        )
    tracing.checked_carrier("trace_context", spec.trace_context)
    if spec.ordering_key is not None:
        raise InvalidJob(
            "ordering_key",
            "cannot be combined with after= yet (a waiting job takes no place in its "
            "aggregate's order); enqueue it without after=, or without the ordering key",
        )
    graph = Graph(f"{spec.job_type} after {len(list(after))} job(s)")
    graph.add(
        spec.queue,
        spec.job_type,
        spec.payload,
        name="job",
        key=spec.key,
        after=list(after),
        when=when,
        priority=spec.priority,
        run_at=spec.run_at,
        delay=spec.delay,
        max_attempts=spec.max_attempts,
        timeout=spec.timeout,
        idempotency_key=spec.idempotency_key,
    )
    return checked_plan(graph)


def write_plan(
    store: Store,
    c: Conn,
    plan: Plan,
    pipeline: int | str | None,
    now: datetime | None,
    trace_context: Mapping[str, str] | None = None,
) -> GraphEnqueued:
    """Write a validated plan on ``c`` (inside the caller's transaction): lock its existing
    parents (waiting out a completion in flight), check them, then the pipeline, the jobs,
    the edges, and wake the queues with claimable jobs. ``pipeline``: NEW_PIPELINE,
    JOIN_PIPELINE, an existing pipeline's id to grow, or None. The jobs carry
    ``trace_context`` (checked), else the trace of the enqueue's span."""
    parents = (
        {r["id"]: r for r in store.deps_lock_parents(c, sorted(plan.external))}
        if plan.external
        else {}
    )
    ids = store.job_ids_reserve(c, len(plan.nodes))
    jobs, deps, wake = graph_rows(plan, ids, parents, None, now)
    pipeline_id: int | None
    if pipeline == NEW_PIPELINE:
        pipeline_id = store.pipeline_create(c, name=plan.name, total=len(plan.nodes), now=now)
    elif pipeline == JOIN_PIPELINE:
        pipeline_id = pipeline_of(parents, plan.external)
    else:
        pipeline_id = None if pipeline is None else int(pipeline)
    if pipeline != NEW_PIPELINE and pipeline_id is not None:
        store.pipeline_grow(c, pipeline_id, len(plan.nodes))
    jobs["pipeline_id"] = pipeline_id
    with tracing.enqueue_span(sorted({n.queue for n in plan.nodes}), len(plan.nodes)):
        jobs["trace_context"] = json_param(trace_context or tracing.current_carrier())
        store.graph_insert_jobs(c, jobs)
    if deps["parents"]:
        store.graph_insert_deps(c, deps)
    if wake:
        store.queues_wake(c, wake)
    return GraphEnqueued(pipeline_id, {n.name: i for n, i in zip(plan.nodes, ids, strict=True)})


def spawn_plan(store: Store, c: Conn, plan: Plan, lease: Lease, now: datetime | None) -> bool:
    """Write a handler's fan-out on ``c`` (inside its completion's transaction) through the
    worker's door, while ``lease`` holds: its existing parents locked and checked, then its
    jobs and edges in the spawner's pipeline (or a new one of its producer), the spawner the
    met parent of its roots. False, with nothing written, when the lease does not hold."""
    locked = store.lease_spawn_lock(c, lease, sorted(plan.external), now)
    if locked is None:
        return False
    parents = {r["id"]: r for r in locked}
    # Nodes are named -1..-n: lease_spawn gives them their ids.
    nodes = [-(i + 1) for i in range(len(plan.nodes))]
    jobs, deps, wake = graph_rows(plan, nodes, parents, None, now, spawner=lease.job_id)
    if store.lease_spawn(c, lease, plan.name, jobs, deps, now) is None:
        return False
    if wake:
        store.queues_wake(c, wake)
    return True


class Queue:
    """The queue API over one connection or a pool. Thread-safe when given a pool."""

    def __init__(
        self,
        db: Db,
        *,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._db = db
        self.retry = retry or RetryPolicy()
        self._store = Store()
        # Claim calls whose answer was lost, by owner (see :meth:`claim`).
        #: By owner: the ids and secrets of claim calls whose answer was lost.
        self._lost_claims: dict[str, dict[UUID, bytes]] = {}
        self._lock = threading.Lock()
        # Tables this role was found unable to VACUUM (said once, at WARNING).
        self._unvacuumable: set[ClaimTable] = set()

    @staticmethod
    def tune_worker_session(conn: Conn) -> None:
        """Set up a worker's connection (a pool's ``configure`` hook): its prepared
        statements reuse one generic plan instead of planning every call (the claim's
        planning cost as much as its execution; its generic plan is as good, measured in
        bench/)."""
        Store().worker_session(conn)

    @staticmethod
    def server_identity(conn: Conn) -> tuple[str, int | None]:
        """Which server ``conn`` reached: its cluster's system identifier and failover epoch
        (a promotion raises it; None on a standby). Two connections with different answers
        reached different primaries: leases taken through one are void on the other."""
        return Store().server_identity(conn)

    # -- producer side --------------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        job_type: str,
        payload: Any = None,
        *,
        priority: int = 100,
        run_at: datetime | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        dedup_key: str | None = None,
        wait: bool = False,
        after: Iterable[int | Dep] | None = None,
        when: After = After.SUCCEEDED,
        key: str | None = None,
        ordering_key: str | None = None,
        trace_context: Mapping[str, str] | None = None,
        conn: Conn | None = None,
        now: datetime | None = None,
    ) -> Enqueued:
        """Enqueue one job; when it commits it will run at least once.

        ``priority``: lower runs first; any smallint (-32768 to 32767), default 100.
        ``run_at`` or ``delay`` (seconds) postpone it. ``timeout``: maximum runtime of one
        attempt in seconds.
        ``idempotency_key``: the effect key, derived from the work (e.g. ``invoice-412``).
        ``dedup_key``: while a job with this key is unfinished in the queue, enqueueing
        another returns the existing one (``created=False``). Listeners are woken on commit.
        ``wait``: you will call :meth:`result` on it; flagged in the same transaction, so its
        waiter needs no second statement.
        ``after``: ids of existing jobs (or :class:`leaseq.Dep`) this job waits for: it is
        ``waiting``, not claimable, until each has succeeded (``when=After.FINISHED``: finished
        in any state); a parent that goes dead or is cancelled cancels it (undone when the
        parent is retried). Each parent must exist (InvalidGraph). The job joins its first
        parent's pipeline, if any.
        ``key``: the flow-control key (a tenant, an endpoint): the queue's limits and fair
        shares for it apply (see :class:`leaseq.FlowControl`). ``ordering_key``: the jobs of
        one aggregate run one at a time, in enqueue order, across retries.
        ``trace_context``: the W3C headers (``traceparent``, ``tracestate``) of the trace its
        first attempt continues; by default the enqueue's own span's (docs/guides/tracing.md).
        """
        spec = JobSpec(
            queue=queue,
            job_type=job_type,
            payload=payload,
            priority=priority,
            run_at=run_at,
            delay=delay,
            max_attempts=max_attempts,
            timeout=timeout,
            idempotency_key=idempotency_key,
            dedup_key=dedup_key,
            wait=wait,
            key=key,
            ordering_key=ordering_key,
            trace_context=trace_context,
        )
        if after:
            plan = single_plan(spec, after, when)
            with transaction(self._db, "enqueue", conn) as c:
                job_id = write_plan(self._store, c, plan, JOIN_PIPELINE, now, spec.trace_context)[
                    "job"
                ]
                if wait:
                    self._store.job_watch(c, [job_id])
            return Enqueued(job_id, True)
        return self.enqueue_many([spec], conn=conn, now=now)[0]

    def enqueue_graph(
        self, graph: Graph, *, conn: Conn | None = None, now: datetime | None = None
    ) -> GraphEnqueued:
        """Enqueue a whole graph (a pipeline) in one transaction, validated first: a cycle, an
        unknown node, a parent job that does not exist or can no longer succeed is refused
        with InvalidGraph and nothing is written. Jobs without unmet parents are claimable at
        once, the others ``waiting``. Returns the pipeline's id and each node's job id."""
        plan = checked_plan(graph)
        with transaction(self._db, "enqueue", conn) as c:
            return write_plan(self._store, c, plan, NEW_PIPELINE, now)

    def enqueue_many(
        self, jobs: Iterable[JobSpec], *, conn: Conn | None = None, now: datetime | None = None
    ) -> list[Enqueued]:
        """Enqueue a batch in one transaction: all are written or none is."""
        specs = [spec.validated() for spec in jobs]
        if not specs:
            return []
        with tracing.enqueue_span([s.queue for s in specs], len(specs)) as span:
            carrier = tracing.current_carrier()
            with transaction(self._db, "enqueue", conn) as c:
                rows = self._store.job_enqueue(
                    c, [statement_fields(spec, carrier) for spec in specs], now
                )
            results = enqueued(specs, rows)
            tracing.enqueued(span, [r.job_id for r in results])
        return results

    # -- waiting for results ----------------------------------------------------------------

    def result(
        self,
        job_id: int,
        timeout: float | None = None,
        *,
        cancel_on_timeout: bool = False,
        poll: float = waiters.DEFAULT_POLL_SECONDS,
    ) -> Any:
        """Wait for the job to finish and return its stored result.

        Cannot miss a completion: the process's listening connection is subscribed before the
        row is first read, and the row is read again on every wake-up and at least every
        ``poll`` seconds (so a lost notification costs at most one poll). Raises JobDead (with
        the last error, its code and the attempt count), JobCancelled, JobNotFound, or
        ResultTimeout after ``timeout`` seconds (None: no limit) while the job keeps running,
        unless ``cancel_on_timeout`` (then it is cancelled first). Refused inside a handler
        (WaitInHandler)."""
        try:
            found = next(self.as_completed([job_id], timeout=timeout, poll=poll))
        except ResultTimeout as exc:
            if not cancel_on_timeout:
                raise
            if self.cancel(job_id, reason=f"result() timed out after {timeout}s").cancelled:
                raise ResultTimeout(exc.job_ids, exc.timeout, cancelled=True) from None
            found = next(self.as_completed([job_id], timeout=0, poll=poll))
        return waiters.unwrap(found)

    def wait_any(
        self,
        job_ids: Collection[int],
        timeout: float | None = None,
        *,
        poll: float = waiters.DEFAULT_POLL_SECONDS,
    ) -> JobOutcome:
        """The first of ``job_ids`` to be finished (any finished status: see
        :meth:`JobOutcome.finished`); ResultTimeout if none is within ``timeout``."""
        return next(self.as_completed(job_ids, timeout=timeout, poll=poll))

    def as_completed(
        self,
        job_ids: Collection[int],
        timeout: float | None = None,
        *,
        poll: float = waiters.DEFAULT_POLL_SECONDS,
    ) -> Iterator[JobOutcome]:
        """Each of ``job_ids`` once it is finished, in the order they finish (those already
        finished first). ResultTimeout names the rest when ``timeout`` seconds (for them all)
        pass first. :func:`leaseq.unwrap` turns an outcome into its result or error."""
        waiters.refuse_in_handler()
        pending = waiters.job_ids(job_ids)
        validation.positive("poll", poll)
        if timeout is not None:
            validation.non_negative("timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with waiters.shared_listener(self._conninfo()).watching(pending) as woken:
            first = True
            while True:
                with borrow(self._db, "wait") as c:
                    if first:
                        # After the subscription, before the read: see migration 0011.
                        self._store.job_watch(c, pending)
                    found = self._store.job_outcomes(c, pending)
                if first and len(found) < len(pending):
                    raise JobNotFound(min(set(pending) - found.keys()))
                first = False
                for outcome in sorted(
                    (o for o in found.values() if o.finished), key=lambda o: o.job_id
                ):
                    pending.remove(outcome.job_id)
                    yield outcome
                if not pending:
                    return
                left = poll if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise ResultTimeout(pending, timeout or 0.0)
                woken.wait(min(left, poll))
                woken.clear()

    def _conninfo(self) -> str:
        """The connection string of this queue's database, for the listening connection."""
        db = self._db
        if isinstance(db, psycopg.Connection):
            return make_conninfo(db.info.dsn, password=db.info.password or None)
        return db.conninfo if isinstance(db.conninfo, str) else ""

    # -- worker side ----------------------------------------------------------------------

    def claim(
        self,
        queues: Sequence[str],
        owner: str,
        *,
        limit: int = 1,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        job_types: Sequence[str] | None = None,
        now: datetime | None = None,
        plan: ClaimPlan | None = None,
    ) -> list[ClaimedJob]:
        """Lease up to ``limit`` ready jobs from ``queues``, best priority first; only of
        ``job_types`` when given (a worker claims what its registry serves, so a job type it
        does not know stays pending, attempts untouched, for a worker that does).

        Each claim increments the job's attempt count and lease token. Rows held by other
        claimers are skipped, never waited for, and never handed out twice.

        A claim whose connection drops may have taken rows without its answer arriving. Each
        call stamps its rows with an id of its own; the retry on a fresh connection (or, if
        PostgreSQL stays unreachable, ``owner``'s next claim on this Queue) first asks for
        those rows and returns them, so a lost answer never leaves a job to expire and cost
        an attempt.

        Which claim statements run, in which order, is ``plan``'s choice (see
        :mod:`leaseq.core.claims`), on one connection. This Queue keeps no state between
        claims: given no plan, a call runs :func:`~leaseq.core.claims.keyless_then_keyed`,
        the same statements every time. A worker passes its
        :class:`~leaseq.runtime.claims.ClaimPlanner`, which learns from its claims which
        kind of work shows and which keyed statement is the cheapest that keeps the
        queues' limits.
        """
        if isinstance(queues, str):
            queues = [queues]
        if not queues:
            raise InvalidJob("queues", "must name at least one queue")
        for queue in queues:
            validation.queue_name(queue)
        validation.name("owner", owner)
        if not 1 <= limit <= MAX_CLAIM_BATCH:
            raise InvalidJob("limit", f"must be in [1, {MAX_CLAIM_BATCH}], got {limit}")
        validation.lease_seconds(lease_seconds)
        if job_types is not None:
            if isinstance(job_types, str) or not job_types:
                raise InvalidJob("job_types", "must be a non-empty list of job types, or None")
            for job_type in job_types:
                validation.name("job_type", job_type)
        with self._lock:
            lost = self._lost_claims.pop(owner, {})
        claim_id = uuid4()
        types = None if job_types is None else list(job_types)
        secret = capability.claim_secret()
        request = ClaimRequest(list(queues), owner, lease_seconds, claim_id, types, now, secret)

        def run(c: Conn, repeat: bool) -> list[ClaimedJob]:
            ids = {**lost, claim_id: secret} if repeat else lost
            if ids:
                found = self._store.job_claim_recover(c, owner=owner, claims=ids)
                if found:
                    log.info("recovered %d job(s) claimed by a call whose answer was lost",
                             len(found), extra={"worker": owner})  # fmt: skip
                    if len(found) > limit:
                        self._remember_lost(owner, ids)
                    return found[:limit]
            return (plan or keyless_then_keyed)(Claims(self._store, c, request), limit)

        try:
            return self._write("claim", run)
        except DatabaseUnavailable:
            self._remember_lost(owner, {**lost, claim_id: secret})
            raise

    def _remember_lost(self, owner: str, claims: dict[UUID, bytes]) -> None:
        with self._lock:
            kept = self._lost_claims.setdefault(owner, {})
            kept.update(claims)
            for old in list(kept)[:-MAX_LOST_CLAIMS]:
                del kept[old]

    def _write(self, action: str, run: Callable[[Conn, bool], T]) -> T:
        """``run(conn, repeat)`` for a fenced write; on a pool, once more on a fresh
        connection if the first one dropped (``repeat=True`` then: see the module's
        docstring). DatabaseUnavailable when the second try cannot reach PostgreSQL either."""
        try:
            with borrow(self._db, action) as c:
                for conflicts in range(CONFLICT_RETRIES + 1):
                    try:
                        return run(c, False)
                    except TransactionConflict:
                        # Rolled back as a whole: nothing of it was applied.
                        if conflicts == CONFLICT_RETRIES:
                            raise
                        log.info("%s rolled back to break a deadlock; running it again", action)
                raise AssertionError("unreachable")
        except DatabaseUnavailable as exc:
            if not replaceable(self._db):
                raise
            log.debug("%s: connection lost (%s); once more on a fresh connection", action, exc)
        with borrow(self._db, action) as c:
            return run(c, True)

    def _ended(
        self, c: Conn, lease: Lease, repeat: bool, applied: set[AttemptOutcome]
    ) -> DictRow | None:
        """On a repeated call, how the attempt ended if the first try did it."""
        if not repeat:
            return None
        row = self._store.job_attempt_outcome(c, lease)
        if row is None or row["outcome"] not in applied:
            return None
        log.info("the first try had been applied before the connection dropped",
                 extra=_lease_fields(lease))  # fmt: skip
        return row

    def _fenced(self, c: Conn, lease: Lease, call: Call, now: datetime | None) -> Fenced:
        """Record the refusal; one statement, which also reads the job's status."""
        status = self._store.job_record_fenced(c, lease, call=call, now=now)
        if status is None:
            raise JobNotFound(lease.job_id)
        if status is JobStatus.CANCELLED:
            # Someone cancelled the job: the refusal is the cancellation reaching its worker.
            log.info("%s refused: the job was cancelled", call, extra=_lease_fields(lease))
        else:
            log.warning("%s fenced: lease no longer held", call, extra=_lease_fields(lease))
        return Fenced(job_id=lease.job_id, call=call, status=status)

    def heartbeat(
        self,
        lease: Lease,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        progress: Any = None,
        now: datetime | None = None,
    ) -> Heartbeat:
        """Extend the lease to ``lease_seconds`` from now and store ``progress``. The lease
        never extends past the job's maximum runtime (``started_at + timeout``): near the end,
        ``lease_expires_at`` is that deadline, and the worker must finish or fail the job by
        then. LOST means stop working on the job: its result will be refused."""
        if progress is not None:
            validation.json_value("progress", progress, limit=65536)
            progress = _storable(progress, "progress", lease)

        def run(c: Conn, repeat: bool) -> Heartbeat:
            expires = self._store.job_heartbeat_many(
                c, [lease], lease_seconds=lease_seconds, progresses=[progress], now=now
            ).get(lease.job_id)
            if expires is None:
                fenced = self._fenced(c, lease, Call.HEARTBEAT, now)
                return Heartbeat(HeartbeatStatus.LOST, None, fenced.status)
            return Heartbeat(HeartbeatStatus.RENEWED, expires)

        return self._write("heartbeat", run)

    def heartbeat_many(
        self,
        leases: Sequence[Lease],
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        progresses: Sequence[Any] | None = None,
        now: datetime | None = None,
    ) -> list[Heartbeat]:
        """:meth:`heartbeat` for many leases in one statement (answers in the order of
        ``leases``): each is fenced by its own token, and each lost one is recorded and
        answered LOST (with the job's status) as :meth:`heartbeat` answers it. A progress
        that cannot be stored is logged (an ERROR naming the job) and left out, and that
        lease is renewed all the same: bad progress never costs a lease."""
        validation.lease_seconds(lease_seconds)
        progresses = list(progresses) if progresses is not None else [None] * len(leases)
        if len(progresses) != len(leases):
            raise InvalidJob("progresses", "need one progress (or None) per lease")
        if len({lease.job_id for lease in leases}) != len(leases):
            raise InvalidJob("leases", "name each job once")
        stored = []
        for lease, progress in zip(leases, progresses, strict=True):
            if progress is not None:
                try:
                    validation.json_value("progress", progress, limit=65536)
                    progress = _storable(progress, "progress", lease)
                except InvalidJob as exc:
                    log.error("progress not stored: %s", exc, extra=_lease_fields(lease))
                    progress = None
            stored.append(progress)
        if not leases:
            return []

        def run(c: Conn, repeat: bool) -> list[Heartbeat]:
            held = self._store.job_heartbeat_many(
                c, leases, lease_seconds=lease_seconds, progresses=stored, now=now
            )
            answers = []
            for lease in leases:
                expires = held.get(lease.job_id)
                if expires is None:
                    fenced = self._fenced(c, lease, Call.HEARTBEAT, now)
                    answers.append(Heartbeat(HeartbeatStatus.LOST, None, fenced.status))
                else:
                    answers.append(Heartbeat(HeartbeatStatus.RENEWED, expires))
            return answers

        return self._write("heartbeat", run)

    def checkpoint(self, lease: Lease, state: Any, *, now: datetime | None = None) -> bool:
        """Store durable state that the job's next attempt receives; False if the lease is lost."""
        validation.json_value("checkpoint", state)
        state = _storable(state, "checkpoint", lease)
        return self._write(
            "checkpoint", lambda c, _: self._store.job_checkpoint(c, lease, state, now=now)
        )

    # -- durable steps (leaseq.runtime.steps: ctx.step) ------------------------------------

    def steps(self, job_id: int) -> list[StepRecord]:
        """A job's steps, intents and outcomes, in the order they were first intended."""
        with borrow(self._db, "list steps") as c:
            return self._store.step_list(c, job_id)

    def step_intend(self, lease: Lease, name: str, *, seen_token: int | None) -> bool:
        """Commit the intent to run step ``name`` under ``lease``, over the intent of token
        ``seen_token`` if the step has one (None: it has none); False if the lease is lost."""
        return self._write(
            "step intent",
            lambda c, _: self._store.step_intend(c, lease, name, seen_token=seen_token),
        )

    def step_record(self, lease: Lease, name: str, result: Any) -> bool:
        """Record the result of step ``name``, intended under ``lease`` (size-checked and
        made storable as a job's result is); False if the lease is lost."""
        validation.json_value(f"step {name!r} result", result)
        stored = bounded.json(result, f"step {name!r} result")
        return self._write(
            "step record",
            lambda c, _: self._store.step_record(
                c, lease, name, result=stored.value, note=stored.note
            ),
        )

    def step_withdraw(self, lease: Lease, name: str) -> bool:
        """Withdraw the intent of step ``name`` (its function raised); False if the lease is
        lost (or a repeat after a lost connection found it withdrawn)."""
        return self._write("step withdraw", lambda c, _: self._store.step_withdraw(c, lease, name))

    # -- streams (ctx.emit) ------------------------------------------------------------

    def emit(self, lease: Lease, value: Any) -> int | None:
        """Append ``value`` (JSON, at most 64 KiB) to the job's stream as its next item, under
        ``lease``: the item's offset, or None if the lease is lost. LeaseqError when the
        stream already holds MAX_STREAM_ITEMS items."""
        validation.json_value("stream item", value, limit=MAX_STREAM_ITEM_BYTES)
        if value is None:
            raise InvalidJob("stream item", "must not be null (it could not be told from none)")
        stored = _storable(value, "stream item", lease)
        held, offset = self._write(
            "emit",
            lambda c, _: self._store.stream_emit(c, lease, stored, cap=MAX_STREAM_ITEMS),
        )
        if held and offset is None:
            raise LeaseqError(
                f"job {lease.job_id}'s stream is full ({MAX_STREAM_ITEMS} items): emit progress"
                " and partial results, not per-token output"
            )
        return offset if held else None

    def stream_page(self, job_id: int, *, after: int = 0, limit: int = 1000) -> StreamPage:
        """Up to ``limit`` items (1 to 10,000, the most a stream holds) of the job's stream
        after offset ``after``, and whether the job had finished when they were read (one
        snapshot)."""
        validation.stream_window(after, limit, "limit")
        with borrow(self._db, "read stream") as c:
            return self._store.stream_read(c, job_id, after, limit)

    def stream(
        self, job_id: int, *, after: int = 0, poll: float = 0.2, page: int = 1000
    ) -> Iterator[StreamItem]:
        """The job's stream items after offset ``after``, as they are written (read every
        ``poll`` seconds while none is new), ending once the job has finished and every item
        it wrote was yielded. Resumable: after a restart, pass the last offset seen. A job
        that is not in the hot table (never was, or moved to history) ends at once."""
        validation.positive("poll", poll)
        validation.stream_window(after, page, "page")
        while True:
            got = self.stream_page(job_id, after=after, limit=page)
            yield from got.items
            if got.items:
                after = got.items[-1].offset
            if got.finished and len(got.items) < page:
                return
            if not got.items:
                time.sleep(poll)

    def complete(
        self,
        lease: Lease,
        result: Any = None,
        *,
        effect_key: str | None = None,
        progress: Any = None,
        now: datetime | None = None,
    ) -> Completed | Fenced:
        """Mark the job succeeded, store ``result`` in its row and, when it has a key
        (``effect_key``, else the job's idempotency key), write its effect row under that key,
        in one statement. A repeat execution's effect is a no-op (``effect_written=False``).
        A job without any key gets no effect row: its row's result is the record. A stale
        lease gets :class:`Fenced`, and nothing changes."""
        return self.complete_many(
            [lease], [result], effect_keys=[effect_key], progresses=[progress], now=now
        )[0]

    def complete_many(
        self,
        leases: Sequence[Lease],
        results: Sequence[Any] | None = None,
        *,
        effect_keys: Sequence[str | None] | None = None,
        progresses: Sequence[Any] | None = None,
        spawns: Sequence[Graph | None] | None = None,
        now: datetime | None = None,
    ) -> list[Completed | Fenced]:
        """:meth:`complete` for several jobs in one statement and one commit (answers in the
        order of ``leases``). Each lease is fenced on its own: a stale one gets
        :class:`Fenced` and changes nothing, the others still complete.

        ``spawns``: per lease, a graph of new jobs (a fan-out and its aggregating job) written
        in the same transaction, only if that lease's completion applied: a crash can neither
        lose nor double them, and a stale completion adds nothing. They join the completing
        job's pipeline (or a new one named after the graph), and are written before the
        completion, while the job still runs under the lease (the worker role's policy
        admits a fan-out only then), after its row is locked and found held."""
        count = len(leases)
        plans = [None if g is None else checked_plan(g) for g in (spawns or [None] * count)]
        if len(plans) != count:
            raise InvalidJob("spawns", "need one graph (or None) per lease")
        results = list(results) if results is not None else [None] * count
        effect_keys = list(effect_keys) if effect_keys is not None else [None] * count
        progresses = list(progresses) if progresses is not None else [None] * count
        if not count == len(results) == len(effect_keys) == len(progresses):
            raise InvalidJob("results", "need one result, effect key and progress per lease")
        if len({lease.job_id for lease in leases}) != count:
            raise InvalidJob("leases", "name each job once")
        for result, key in zip(results, effect_keys, strict=True):
            validation.json_value("result", result)
            validation.optional_key("effect_key", key)
        if not leases:
            return []
        stored = [bounded.json(r, "result") for r in results]
        for lease, result in zip(leases, stored, strict=True):
            if result.note:
                log.warning("result stored with changes: %s", result.note,
                            extra=_lease_fields(lease))  # fmt: skip
        progresses = [
            _storable(p, "progress", lease) for p, lease in zip(progresses, leases, strict=True)
        ]

        def run(c: Conn, repeat: bool) -> list[Completed | Fenced]:
            if not any(plans):
                return settle(c, repeat)
            with c.transaction():
                return settle(c, repeat)

        def settle(c: Conn, repeat: bool) -> list[Completed | Fenced]:
            spawned: set[int] = set()
            # Written while the spawner still runs (its lease checked by the door), before
            # the completion ends it; in job id order, so two batches lock rows alike.
            for lease, plan in sorted(zip(leases, plans, strict=True), key=lambda p: p[0].job_id):
                if plan and spawn_plan(self._store, c, plan, lease, now):
                    spawned.add(lease.job_id)
            done = self._store.job_complete(
                c,
                leases,
                results=[r.value for r in stored],
                effect_keys=effect_keys,
                progresses=progresses,
                notes=[r.note for r in stored],
                now=now,
            )
            if not spawned <= done.keys():
                # Cannot happen under the row locks; never commit a fan-out without its spawner.
                raise LeaseqError(
                    f"jobs {sorted(spawned - done.keys())} were held when locked but their "
                    "completion was refused; nothing was written"
                )
            answers: list[Completed | Fenced] = []
            for lease, key in zip(leases, effect_keys, strict=True):
                row = done.get(lease.job_id)
                if row is not None:
                    if log.isEnabledFor(logging.DEBUG):
                        log.debug("job succeeded", extra=_lease_fields(lease))
                    answers.append(Completed(row["id"], row["effect_key"], row["effect_written"]))
                elif ended := self._ended(c, lease, repeat, {AttemptOutcome.SUCCEEDED}):
                    effect = key or ended["effect_key"]
                    answers.append(Completed(lease.job_id, effect, ended["effect_written"]))
                else:
                    answers.append(self._fenced(c, lease, Call.COMPLETE, now))
            return answers

        return self._write("complete", run)

    def fail(
        self,
        lease: Lease,
        error: str,
        *,
        retryable: bool = True,
        error_code: str | None = None,
        traceback: str | None = None,
        timed_out: bool = False,
        now: datetime | None = None,
    ) -> Failed | Fenced:
        """End the attempt with ``error``: retried after backoff while attempts remain and the
        error is retryable, else the job stops in ``dead`` with the error kept. The error is
        stored bounded (:func:`leaseq.core.bounded.text`: NULs replaced, cut, and it says so).
        ``traceback`` (the handler's, if it raised) is kept in the attempt's row, bounded the
        same way and with secrets masked (:func:`leaseq.core.redact.redact`): it outlives the
        worker's stderr."""
        outcome = AttemptOutcome.TIMED_OUT if timed_out else AttemptOutcome.FAILED
        text = bounded.text(error).value
        trace = None if traceback is None else bounded.text(redact(traceback)).value

        def run(c: Conn, repeat: bool) -> Failed | Fenced:
            row = self._store.job_fail(
                c,
                lease,
                error=text,
                error_code=error_code,
                traceback=trace,
                retryable=retryable,
                outcome=outcome,
                retry=self.retry,
                now=now,
            ) or self._ended(c, lease, repeat, {outcome})
            if row is None:
                return self._fenced(c, lease, Call.FAIL, now)
            retry_at = row["available_at"] if row["status"] == JobStatus.PENDING else None
            log.info("job failed: %s", row["status"], extra=_lease_fields(lease))
            return Failed(lease.job_id, row["status"], retry_at)

        return self._write("fail", run)

    def release(
        self,
        lease: Lease,
        *,
        reason: str = "worker shutting down",
        shutdown: bool = True,
        now: datetime | None = None,
    ) -> Released | Fenced:
        """Give the job back, keeping its place in the queue.

        ``shutdown=True`` (a draining worker) does not cost an attempt, so rolling deploys
        alone never kill a job; a crash (lease expiry) does. Any other release (a handler
        raising Interrupted while its worker is not shutting down) counts as an attempt,
        outcome ``interrupted``: retried after backoff, ``dead`` when attempts are used up.
        Without that bound a handler that always hands its job back would cycle forever."""
        outcome = AttemptOutcome.RELEASED if shutdown else AttemptOutcome.INTERRUPTED
        text = bounded.text(reason).value

        def run(c: Conn, repeat: bool) -> Released | Fenced:
            row = self._store.job_release(
                c, lease, reason=text, shutdown=shutdown, retry=self.retry, now=now
            ) or self._ended(c, lease, repeat, {outcome})
            if row is None:
                return self._fenced(c, lease, Call.RELEASE, now)
            log.info("job released (%s): %s", outcome, row["status"], extra=_lease_fields(lease))
            return Released(lease.job_id, row["status"])

        return self._write("release", run)

    def back_off(
        self,
        lease: Lease,
        seconds: float,
        *,
        reason: str = "told to back off",
        now: datetime | None = None,
    ) -> Released | Fenced:
        """Hand the job back without spending an attempt, not to run before ``seconds`` from
        now, and pause its key (if it has one) until then: what a handler does when the
        service it calls answers 429 / Retry-After (``raise leaseq.BackOff(seconds)``).
        ``seconds`` is clamped to :data:`MAX_BACK_OFF_SECONDS` (a day), with a warning: a
        garbage Retry-After never parks a job or pauses a key for years (the database clamps
        the key's pause the same way)."""
        if seconds > MAX_BACK_OFF_SECONDS:
            log.warning(
                "back-off of %gs clamped to %gs (a day); a longer wait is not a back-off",
                seconds,
                MAX_BACK_OFF_SECONDS,
                extra=_lease_fields(lease),
            )
            seconds = MAX_BACK_OFF_SECONDS
        validation.non_negative("seconds", seconds)
        text = bounded.text(reason).value

        def run(c: Conn, repeat: bool) -> Released | Fenced:
            row = self._store.job_back_off(
                c, lease, seconds=seconds, reason=text, now=now
            ) or self._ended(c, lease, repeat, {AttemptOutcome.RELEASED})
            if row is None:
                return self._fenced(c, lease, Call.RELEASE, now)
            log.info("job backed off until %s", row["available_at"], extra=_lease_fields(lease))
            return Released(lease.job_id, JobStatus(row["status"]))

        return self._write("back off", run)

    def sleep(
        self, lease: Lease, until: datetime, *, now: datetime | None = None
    ) -> Released | Fenced:
        """Hand the job back without spending an attempt, claimable again at ``until``
        (database time; at once if it has passed): what a handler's ``ctx.sleep`` ends its
        attempt with. Nothing is held meanwhile (no lease, slot or unit of its key's limit).
        ``until`` must be timezone-aware and at most 3650 days away (InvalidJob)."""
        validation.wake_time("until", until, datetime.now(UTC))

        def run(c: Conn, repeat: bool) -> Released | Fenced:
            row = self._store.job_sleep(c, lease, until=until, now=now) or self._ended(
                c, lease, repeat, {AttemptOutcome.RELEASED}
            )
            if row is None:
                return self._fenced(c, lease, Call.RELEASE, now)
            log.info("job sleeping until %s", row["available_at"], extra=_lease_fields(lease))
            return Released(lease.job_id, JobStatus(row["status"]))

        return self._write("sleep", run)

    def wait(
        self, lease: Lease, name: str, until: datetime, *, now: datetime | None = None
    ) -> Released | Fenced:
        """Hand the job back to wait for signal ``name``, without spending an attempt: what a
        handler's ``ctx.wait_for`` ends its attempt with. The job is claimable again at
        ``until`` (database time), or as soon as the signal is sent, or at once if it was
        sent already; meanwhile it holds nothing and shows what it waits for. One call of
        leaseq.lease_wait: the job's row is locked before the signal is looked for, so a
        signal sent at any moment is never missed (definitions/lease.sql)."""
        validation.signal_name("name", name)
        validation.wake_time("until", until, datetime.now(UTC))

        def run(c: Conn, repeat: bool) -> Released | Fenced:
            row = self._store.job_wait(c, lease, name=name, until=until, now=now) or self._ended(
                c, lease, repeat, {AttemptOutcome.RELEASED}
            )
            if row is None:
                return self._fenced(c, lease, Call.RELEASE, now)
            log.info("job waiting for signal %r until %s", name, row["available_at"],
                     extra=_lease_fields(lease))  # fmt: skip
            return Released(lease.job_id, JobStatus(row["status"]))

        return self._write("wait", run)

    def signal_read(
        self, lease: Lease, name: str, *, now: datetime | None = None
    ) -> tuple[bool, Any] | None:
        """The signal ``name`` of the job ``lease`` holds: (True, payload), or (False, None)
        when none was sent; None when the lease is not held."""
        row = self._write(
            "read signal", lambda c, _: self._store.signal_read(c, lease, name, now=now)
        )
        return None if row is None else (bool(row["found"]), row["payload"])

    def signal(self, job_id: int, name: str, payload: Any = None) -> Signalled:
        """Send signal ``name`` with ``payload`` (JSON, at most 64 KiB) to job ``job_id``,
        for its handler's ``ctx.wait_for(name)``: kept until the job is deleted, so a signal
        sent before the wait is found by it. A job waiting for it becomes claimable at once.
        One signal per (job, name): the first is kept, a later one is not stored
        (``stored=False``). A job holds at most :data:`~leaseq.core.validation.MAX_SIGNALS_PER_JOB`
        signals and :data:`~leaseq.core.validation.MAX_SIGNAL_BYTES_PER_JOB` bytes of their
        payloads (the database refuses past either). A producer's role reaches only the jobs it
        enqueued. JobStateError for a finished job or one this role cannot see; InvalidJob for
        a bad name or payload, or one past the job's bounds."""
        validation.signal_name("name", name)
        validation.json_value("payload", payload, limit=validation.MAX_SIGNAL_BYTES)
        with tracing.signal_span(job_id, name), borrow(self._db, "signal") as c:
            row = self._store.job_signal(c, job_id, name, payload)
        return Signalled(job_id, name, bool(row["stored"]), bool(row["waiting"]))

    def waiting_on(self, job_id: int) -> WaitingOn | None:
        """What a pending job waits for (``ctx.wait_for``), since when and until when; None
        when it waits for no signal."""
        with borrow(self._db, "show job") as c:
            return self._store.job_waiting_on(c, job_id)

    def signals(self, job_id: int, *, limit: int = 100) -> list[SignalRecord]:
        """The signals sent to a job (names, times, senders, sizes), oldest first."""
        validation.at_least("limit", limit, 1)
        with borrow(self._db, "list signals") as c:
            return self._store.signal_list(c, job_id, limit=limit)

    def signal_waits(self, queues: Sequence[str] | None = None) -> list[SignalWaits]:
        """Jobs waiting for a signal per queue (only queues with some), and the age of each
        queue's oldest wait, from a small partial index."""
        with borrow(self._db, "stats") as c:
            return self._store.queue_signal_waits(c, queues=queues)

    # -- operations -----------------------------------------------------------------------

    def reap(
        self,
        *,
        limit: int = 1000,
        reaper: str | None = None,
        owners: Sequence[str] | None = None,
        conn: Conn | None = None,
        now: datetime | None = None,
    ) -> list[Reaped]:
        """Bring back running jobs whose lease expired: pending in their old place (the
        expired lease was their backoff), or dead when their attempts are used up. Safe to run
        concurrently (rows are skipped, not shared). ``reaper`` (e.g. holder and term) is
        named in each attempt row. Given ``owners`` (workers known dead), bring back every
        running job they hold instead, expired or not, the same way (the attempt counts, as
        for any crash). Given ``conn`` inside a transaction, joins it (the reaper holds its
        lock there)."""
        with borrow(self._db, "reap", conn) as c:
            reaped = self._store.job_reap(c, limit=limit, reaper=reaper, owners=owners, now=now)
        for job in reaped:
            log.warning(
                "reaped job from %s: %s",
                job.previous_owner,
                job.status,
                extra={
                    "job_id": job.job_id,
                    "queue": job.queue,
                    "worker": job.previous_owner,
                    "token": job.token,
                    "attempt": job.attempt,
                },
            )
        return reaped

    def vacuum(self, *, min_dead_tuples: int) -> int | None:
        """VACUUM each table a claim walks from its head (leaseq.jobs; leaseq.flow_keys for
        keyed jobs) that holds at least ``min_dead_tuples`` dead row versions; returns the
        dead row versions of the tables it vacuumed, or None when it vacuumed none.

        Why: every claim leaves a dead entry at the head of the claim index, and every key
        that goes idle one at the head of the keyed claim's turn order; each claim reads
        through them until VACUUM removes them. Autovacuum wakes at most once per
        ``autovacuum_naptime`` (a minute by default), so under steady churn a head grows to
        tens of thousands of dead entries; the reaper calls this every pass to keep it short.
        Needs the table's owner or the database's (or, from PostgreSQL 17, MAINTAIN, which
        migrating with an operator role grants it): a table this role may not vacuum is
        skipped, and said once at WARNING (PostgreSQL itself would only warn, skip it and let
        this method report what it never did); autovacuum still cleans it."""
        validation.at_least("min_dead_tuples", min_dead_tuples, 1)
        vacuumed = 0
        with borrow(self._db, "vacuum") as c:
            role, tables = self._store.claim_dead_tuples(c)
            for table, (dead, may) in tables.items():
                if dead < min_dead_tuples:
                    continue
                if not may:
                    self._cannot_vacuum(table, role, dead)
                    continue
                self._store.vacuum(c, table)
                log.info("vacuumed leaseq.%s (%d dead row versions)", table, dead)
                vacuumed += dead
        return vacuumed or None

    def _cannot_vacuum(self, table: ClaimTable, role: str, dead: int) -> None:
        level = logging.DEBUG if table in self._unvacuumable else logging.WARNING
        self._unvacuumable.add(table)
        log.log(
            level,
            "cannot VACUUM leaseq.%s as role %s (%d dead row versions): PostgreSQL lets only "
            "the table's owner, the database's owner or, from PostgreSQL 17, a role with "
            "MAINTAIN on it do that; autovacuum still does. Run the leader as the owner, or "
            "on PostgreSQL 17 or later migrate with --operator-role, which grants it MAINTAIN",
            table,
            role,
            dead,
        )

    def cancel(self, job_id: int, *, reason: str | None = None) -> Cancelled:
        """Cancel a job (waiting, pending or running) with every unfinished descendant (the
        jobs it spawned or that were enqueued after it, transitively), in one short transaction:
        those not started never run; running ones are fenced (their workers' next heartbeat,
        step or completion is refused, their handlers see ``ctx.cancelled``; a late
        completion writes nothing and spawns nothing). Each records why (``reason``; its
        descendants "cancelled with ancestor job <id>: <reason>"). A finished job's
        unfinished descendants are cancelled all the same. Not undone by a retry. Under a
        producer's role only its own jobs, and of the descendants only its own
        (leaseq.producer_cancel); JobNotFound for another producer's job."""
        with borrow(self._db, "cancel") as c:
            reached = self._store.job_cancel(c, job_id, reason=reason)
            if any(r.job_id == job_id for r in reached):
                return cancelled_of(job_id, reached, JobStatus.CANCELLED)
            record = self._store.job_get(c, job_id)
        if record is None:
            raise JobNotFound(job_id)
        return cancelled_of(job_id, reached, record.status)

    # -- pipelines ------------------------------------------------------------------------

    def cancel_pipeline(self, pipeline_id: int, *, reason: str | None = None) -> PipelineCancelled:
        """Cancel every unfinished job of a pipeline, in one short transaction: waiting and pending
        ones (sleeping ones too) never run, running ones are fenced (their workers' next call
        is refused and their handlers see ``ctx.cancelled``). Each records why ("cancelled
        with pipeline <id>: <reason>"). Not undone by a retry. Under a producer's role only
        its own pipelines' jobs of its own (leaseq.producer_cancel_pipeline)."""
        with borrow(self._db, "cancel") as c:
            if self._store.pipeline_get(c, pipeline_id) is None:
                raise JobStateError(f"pipeline {pipeline_id} does not exist; check the id")
            row = self._store.pipeline_cancel(c, pipeline_id, reason=reason)
        return PipelineCancelled(pipeline_id, int(row["cancelled"]), int(row["running"]))

    def pipeline(self, pipeline_id: int) -> PipelineRecord:
        """A pipeline's progress: one primary-key lookup (the counters are kept by the
        transitions of its jobs)."""
        with borrow(self._db, "show pipeline") as c:
            found = self._store.pipeline_get(c, pipeline_id)
        if found is None:
            raise JobStateError(f"pipeline {pipeline_id} does not exist; check the id")
        return found

    def pipeline_of(self, job_id: int) -> int | None:
        """The pipeline job ``job_id`` belongs to, else the one its fan-out (``ctx.spawn``)
        started: a job outside any pipeline that spawns is the met parent of a new pipeline,
        not one of its jobs (read as the pipeline of the first job that waits for it). None
        when it has neither (yet: a fan-out is written with the job's completion).
        JobNotFound when there is no such job."""
        with borrow(self._db, "wait") as c:
            found, pipeline_id = self._store.job_pipeline_of(c, job_id)
        if not found:
            raise JobNotFound(job_id)
        return pipeline_id

    def wait_pipeline(
        self,
        pipeline_id: int | None = None,
        *,
        job: int | None = None,
        timeout: float | None = None,
        poll: float = waiters.DEFAULT_POLL_SECONDS,
        sinks: int = waiters.DEFAULT_SINKS,
    ) -> PipelineOutcome:
        """Wait until a pipeline has finished (every job of it succeeded, dead or cancelled)
        and return how it ended with its sinks, the jobs nothing else of it waits for (the
        merge of a fan-out): ``outcome.result`` is the result of the one sink.

        Name the pipeline, or its root with ``job=`` (the job a producer enqueued, whose
        handler fans out with ``ctx.spawn``): that job is waited for first, then the pipeline
        it belongs to or started (:meth:`pipeline_of`); a job that finished without one is a
        pipeline of one. Woken by the pipeline's finish (a notification on the waiters'
        connection, as :meth:`result`), with a safety read every ``poll`` seconds.
        ``sinks``: how many sinks to read at most (the newest). PipelineTimeout (a
        ResultTimeout) after ``timeout`` seconds in all; the pipeline keeps running. Refused
        inside a handler (WaitInHandler)."""
        waiters.refuse_in_handler()
        waiters.wait_target(pipeline_id, job, sinks)
        validation.positive("poll", poll)
        if timeout is not None:
            validation.non_negative("timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if job is not None:
            root = next(self.as_completed([job], timeout=timeout, poll=poll))
            pipeline_id = self.pipeline_of(job)
            if pipeline_id is None:
                return waiters.lone_outcome(root)
        assert pipeline_id is not None
        topic = waiters.pipeline_topic(pipeline_id)
        with waiters.shared_listener(self._conninfo()).watching([topic]) as woken:
            while True:
                # Read after the subscription: a finish that commits later wakes this.
                with borrow(self._db, "wait") as c:
                    record = self._store.pipeline_get(c, pipeline_id)
                    if record is None:
                        raise JobStateError(f"pipeline {pipeline_id} does not exist; check the id")
                    if record.finished:
                        ends = self._store.pipeline_sinks(c, pipeline_id, limit=sinks + 1)
                        return waiters.pipeline_outcome(record, ends, sinks)
                left = poll if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise PipelineTimeout(pipeline_id, timeout or 0.0)
                woken.wait(min(left, poll))
                woken.clear()

    def pipelines(
        self, *, before: int | None = None, unfinished: bool = False, limit: int = 50
    ) -> list[PipelineRecord]:
        """Pipelines newest first, a keyset page below id ``before``."""
        validation.at_least("limit", limit, 1)
        with borrow(self._db, "list pipelines") as c:
            return self._store.pipeline_list(c, before=before, unfinished=unfinished, limit=limit)

    def pipeline_jobs(
        self, pipeline_id: int, *, after_id: int = 0, limit: int = 100
    ) -> list[dict[str, Any]]:
        """A keyset page of a pipeline's jobs (id, job_type, status, deps_left, cancelled_by)."""
        validation.at_least("limit", limit, 1)
        with borrow(self._db, "show pipeline") as c:
            rows = self._store.pipeline_jobs(c, pipeline_id, after_id=after_id, limit=limit)
        return [dict(r) for r in rows]

    def parent_results(
        self, job_id: int, *, after_id: int = 0, limit: int = PARENT_PAGE
    ) -> list[ParentResult]:
        """One keyset page of ``job_id``'s parents in id order after ``after_id``, each with
        its status and result, read from the database (never copied into the payload)."""
        validation.at_least("limit", limit, 1)
        with borrow(self._db, "read parent results") as c:
            return self._store.parent_results(c, job_id, after_id=after_id, limit=limit)

    def iter_parent_results(
        self, job_id: int, *, page: int = PARENT_PAGE
    ) -> Iterator[ParentResult]:
        """Every parent of ``job_id``, page by page (keyset: each page is an index range)."""
        after_id = 0
        while True:
            rows = self.parent_results(job_id, after_id=after_id, limit=page)
            yield from rows
            if len(rows) < page:
                return
            after_id = rows[-1].job_id

    def links(self, job_id: int, *, limit: int = 20) -> JobLinks:
        """A job's pipeline, unmet parent count, what cancelled it, and up to ``limit`` of its
        parents and of its children."""
        with borrow(self._db, "show job") as c:
            found = self._store.job_links(c, job_id, limit=limit)
        if found is None:
            raise JobNotFound(job_id)
        return found

    def waiting(self, queues: Sequence[str] | None = None) -> dict[str, int]:
        """Waiting jobs (parents unmet) per queue, from a small partial index."""
        with borrow(self._db, "stats") as c:
            return self._store.queue_waiting(c, queues=queues)

    def retry_dead(self, job_id: int, *, attempts: int | None = None) -> int:
        """Put a dead job back to pending now, same id and history, with ``attempts`` more
        attempts (default: its original budget again). Returns its new max_attempts."""
        if attempts is not None:
            validation.at_least("attempts", attempts, 1)
        with borrow(self._db, "retry") as c:
            new_max = self._store.job_retry_dead(c, job_id, attempts=attempts)
            if new_max is not None:
                return new_max
            record = self._store.job_get(c, job_id)
        if record is None:
            raise JobNotFound(job_id)
        # A job that died since the statement ran: it can be retried now.
        why = _NOT_RETRYABLE.get(record.status, f"is {record.status} now; try again")
        raise JobStateError(f"job {job_id} {why}")

    def prune(
        self,
        *,
        older_than: float,
        statuses: Sequence[str] = FINISHED_STATUSES,
        batch: int = 1000,
        now: datetime | None = None,
    ) -> int:
        """Delete finished jobs (and their attempts) that finished more than ``older_than``
        seconds ago, ``batch`` rows per transaction. Effects in job_results are kept."""
        validation.at_least("batch", batch, 1)
        checked = _prunable(older_than, statuses)
        total = 0
        while True:
            with borrow(self._db, "prune") as c:
                deleted = self._store.job_prune(
                    c, older_than=older_than, statuses=checked, batch=batch, now=now
                )
            total += deleted
            if deleted < batch:
                return total

    def prune_preview(
        self,
        *,
        older_than: float,
        statuses: Sequence[str] = FINISHED_STATUSES,
        now: datetime | None = None,
    ) -> list[PruneCandidates]:
        """What :meth:`prune` with the same arguments would delete now, per status; deletes
        nothing."""
        checked = _prunable(older_than, statuses)
        with borrow(self._db, "preview prune") as c:
            return self._store.job_prune_preview(
                c, older_than=older_than, statuses=checked, now=now
            )

    def stats(
        self,
        queues: Sequence[str] | None = None,
        *,
        horizon: float = 0.0,
        now: datetime | None = None,
    ) -> list[QueueStats]:
        """Per-queue depth computed now in the database; ``scheduled_soon`` counts jobs due
        within ``horizon`` seconds."""
        with borrow(self._db, "stats") as c:
            return self._store.queue_stats(c, queues=queues, horizon=horizon, now=now)

    def unserved(
        self,
        queues: Sequence[str] | None = None,
        *,
        live_seconds: float = SILENT_AFTER_SECONDS,
        now: datetime | None = None,
    ) -> list[UnservedWork]:
        """Ready jobs, per queue and job type, that no live worker serves although the queue
        has live workers (registry heartbeat within ``live_seconds``), every one of which
        reports job types without this one. A queue without live workers is not listed (no
        one to ask; ``leaseq_queue_workers`` says so), nor is one where a worker that
        predates reporting its types is live (it claims every type)."""
        validation.positive("live_seconds", live_seconds)
        with borrow(self._db, "read unserved work") as c:
            return self._store.unserved_ready(c, queues=queues, live_seconds=live_seconds, now=now)

    def finished(
        self,
        queues: Sequence[str] | None = None,
        *,
        window: float = 3600.0,
        now: datetime | None = None,
    ) -> list[QueueFinished]:
        """Per queue, jobs that succeeded or were cancelled within the last ``window``
        seconds (dead ones are in :meth:`stats`). Bounded by the window, not by history."""
        validation.positive("window", window)
        with borrow(self._db, "recently finished jobs") as c:
            return self._store.queue_finished(c, queues=queues, window=window, now=now)

    def work(
        self,
        queues: Sequence[str],
        *,
        window: float,
        horizon: float = 0.0,
        now: datetime | None = None,
    ) -> list[JobTypeWork]:
        """Ready, due-within-``horizon`` and running jobs of ``queues`` per job type, each with
        the mean run time of the type's attempts that ran to their end (succeeded, failed or
        timed out) within the last ``window`` seconds. At most the newest
        :data:`WORK_SAMPLES` attempts (of every queue) are read, through an index: the cost
        stays bounded however long the audit trail grows."""
        validation.positive("window", window)
        with borrow(self._db, "read work") as c:
            return self._store.pool_work(
                c, queues=queues, window=window, horizon=horizon, max_samples=WORK_SAMPLES, now=now
            )

    def get(self, job_id: int) -> JobRecord:
        with borrow(self._db, "show job") as c:
            record = self._store.job_get(c, job_id)
        if record is None:
            raise JobNotFound(job_id)
        return record

    def resolve_step(
        self,
        job_id: int,
        step: str,
        *,
        result: Any = None,
        retry: bool = False,
        actor: str,
        reason: str,
    ) -> None:
        """Settle the uncertain step ``step`` of held job ``job_id``: record ``result`` as its
        outcome (the effect happened), or with ``retry`` clear its intent (it did not: the
        step runs again); either way say who (``actor``) and why, and bring the job back to
        pending with a fresh budget of attempts, in one statement. JobStateError when the
        job is not held at an uncertain step of that name (a job stopped there before
        leaseq had the status held is dead, and is settled too)."""
        result, actor, reason = validation.step_resolution(
            step, result, retry=retry, actor=actor, reason=reason
        )
        with borrow(self._db, "resolve step") as c:
            if self._store.step_resolve(
                c, job_id, step, result=result, retry=retry, actor=actor, reason=reason
            ):
                return
            record = self._store.job_get(c, job_id)
            steps = self._store.step_list(c, job_id) if record else []
        raise unresolvable(job_id, step, record, steps)

    def uncertain_steps(self, *, limit: int = 100) -> list[UncertainStep]:
        """Jobs held at an uncertain step (``leaseq steps resolve`` settles them)."""
        with borrow(self._db, "list uncertain steps") as c:
            return self._store.steps_uncertain(c, STEP_UNCERTAIN_CODE, limit)

    def attempts(self, job_id: int) -> list[AttemptRecord]:
        with borrow(self._db, "list attempts") as c:
            return self._store.job_attempts(c, job_id)

    def effect(
        self, key: str, *, queue: str | None = None, job_type: str | None = None
    ) -> EffectRecord | None:
        """The effect written under ``key``. Keys are unique per queue and job type: give
        ``queue`` and ``job_type`` to name one; without them the key must be unambiguous
        (InvalidJob when several queues or types wrote an effect under it)."""
        with borrow(self._db, "read effect") as c:
            found = self._store.job_result(c, key, queue=queue, job_type=job_type)
        if len(found) > 1:
            raise InvalidJob(
                "key",
                f"{key!r} has effects in more than one queue or job type; pass queue= and "
                "job_type= to say which",
            )
        return found[0] if found else None

    def jobs(
        self, *, status: str | None = None, queue: str | None = None, limit: int = 100
    ) -> list[JobRecord]:
        with borrow(self._db, "list jobs") as c:
            return self._store.job_list(c, status=status, queue=queue, limit=limit)


def _prunable(older_than: float, statuses: Sequence[str]) -> list[JobStatus]:
    validation.non_negative("older_than", older_than)
    for status in statuses:
        if status not in FINISHED_STATUSES:
            raise InvalidJob(
                "statuses",
                f"{status!r} is not a finished status {tuple(map(str, FINISHED_STATUSES))}",
            )
    return [JobStatus(s) for s in statuses]
