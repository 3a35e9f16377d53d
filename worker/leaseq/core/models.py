"""Typed values that leaseq's API takes and returns."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from leaseq.core.errors import JobCancelled, JobDead, JobStateError

#: How long a lease lasts unless renewed, when the caller names no other length (seconds).
DEFAULT_LEASE_SECONDS = 30.0


class JobStatus(enum.StrEnum):
    """A job's status (PostgreSQL type ``leaseq.job_status``); compares equal to its text."""

    #: Waiting for parent jobs (a pipeline): not claimable until the last one is met.
    WAITING = "waiting"
    PENDING = "pending"
    #: Stopped at an uncertain durable step, waiting for an operator's ``leaseq steps
    #: resolve``: not finished (its waiters, stream, signals and pipeline wait on).
    HELD = "held"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


#: The statuses a job never leaves (prune deletes only these).
FINISHED_STATUSES = (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED)


class AttemptOutcome(enum.StrEnum):
    """How one attempt ended (PostgreSQL type ``leaseq.attempt_outcome``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LEASE_EXPIRED = "lease_expired"
    RELEASED = "released"
    FENCED = "fenced"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    #: Handed back by the handler (``Interrupted``) outside a shutdown: counts as an attempt.
    INTERRUPTED = "interrupted"


#: A registered worker whose registry heartbeat (``heartbeat_at``, database time) is older
#: than this is silent: killed, frozen or cut off, whatever its row's state says. Six default
#: heartbeat intervals (10 s), three default leases: a live worker is never silent.
SILENT_AFTER_SECONDS = 60.0


def is_silent(heartbeat_age: float) -> bool:
    """The one rule for a silent worker, whatever its row's state says (``leaseq status``,
    the console's Workers page and overview): no registry heartbeat for more than
    :data:`SILENT_AFTER_SECONDS` by database time. SQL that counts live workers keeps
    ``heartbeat_at >= now - SILENT_AFTER_SECONDS``, the same rule."""
    return heartbeat_age > SILENT_AFTER_SECONDS


class WorkerState(enum.StrEnum):
    """A registered worker's state in ``leaseq.workers``."""

    LOADING = "loading"  # on_startup (a model load) has not finished: not taking work yet
    RUNNING = "running"
    DRAINING = "draining"


class ClaimTable(enum.StrEnum):
    """A table whose index a claim walks from its head: rows that leave it leave dead
    entries there, which only VACUUM removes (:meth:`leaseq.Queue.vacuum`)."""

    JOBS = "jobs"  # the claim index: claimed jobs
    FLOW_KEYS = "flow_keys"  # the keyed claim's turn order: keys that went idle


class Call(enum.StrEnum):
    """A worker-side call that settles an attempt (named in a :class:`Fenced` refusal)."""

    HEARTBEAT = "heartbeat"
    COMPLETE = "complete"
    FAIL = "fail"
    RELEASE = "release"


def _as(cls: type[enum.StrEnum], record: object, *names: str) -> None:
    """Turn the text columns ``names`` of a frozen record into ``cls`` members."""
    for name in names:
        value = getattr(record, name)
        if value is not None:
            object.__setattr__(record, name, cls(value))


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff between attempts: capped exponential with equal jitter, in database time.

    Retry n waits ``d/2 + random() * d/2`` seconds with ``d = min(cap, base * 2**(n-1))``:
    with the defaults 1-2 s, 2-4 s, 4-8 s, ... never more than 10 minutes.
    """

    base_seconds: float = 2.0
    cap_seconds: float = 600.0

    def __post_init__(self) -> None:
        if not 0 < self.base_seconds <= self.cap_seconds:
            raise ValueError("RetryPolicy needs 0 < base_seconds <= cap_seconds")


@dataclass(frozen=True)
class Lease:
    """Proof of ownership of one attempt: every worker-side call carries it.

    A call succeeds only while ``owner`` and ``token`` are the job's current ones, the lease
    has not expired in database time, and ``secret`` is the one its claim minted
    (:mod:`leaseq.core.capability`: the database keeps only a digest of it and the job's
    id). The token orders executions; the secret proves which one this is. It is never
    printed (no repr) and a process-isolation child gets none: its supervisor makes its
    calls.
    """

    job_id: int
    owner: str
    token: int
    attempt: int
    started_at: datetime
    secret: bytes = field(repr=False)


@dataclass(frozen=True)
class ClaimedJob:
    """A job leased to a worker by :meth:`leaseq.Queue.claim`."""

    id: int
    queue: str
    job_type: str
    payload: Any
    priority: int
    attempt: int
    max_attempts: int
    lease: Lease
    lease_expires_at: datetime
    timeout_seconds: float | None
    idempotency_key: str | None
    checkpoint: Any
    #: The W3C trace context stored at enqueue (leaseq.core.tracing), or None.
    trace_context: dict[str, str] | None = None

    @property
    def effect_key(self) -> str:
        """The name of the job's effect, derived from the work, never minted: the enqueuer's
        idempotency key (completion writes an effect row under it), else ``job:<id>`` (no
        effect row: the job's own row holds its result)."""
        return self.idempotency_key or f"job:{self.id}"


@dataclass(frozen=True)
class ClaimRequest:
    """What each claim statement of one :meth:`leaseq.Queue.claim` call is asked, but for
    how many jobs (each statement gets the room the call's earlier ones left)."""

    queues: list[str]
    owner: str
    lease_seconds: float
    #: Stamped on the rows the call takes, so a call whose answer was lost finds them.
    claim_id: UUID
    job_types: list[str] | None
    now: datetime | None
    #: The call's claim secret (:mod:`leaseq.core.capability`); never printed.
    secret: bytes = field(repr=False)


@dataclass(frozen=True)
class OpenClaim:
    """What job_claim_keyed_open answered: the jobs it leased; whether its queues have a
    limit or rate set (``limited``: then it leased none), and a rate among them."""

    jobs: list[ClaimedJob]
    limited: bool
    rated: bool


@dataclass(frozen=True)
class SlotsClaim:
    """What job_claim_keyed_slots answered: the jobs it leased; whether its queues have a
    rate set (``rated``: then it leased none)."""

    jobs: list[ClaimedJob]
    rated: bool


@dataclass(frozen=True)
class Enqueued:
    """Result of an enqueue: ``created`` is False when an unfinished job had the dedup key."""

    job_id: int
    created: bool


@dataclass(frozen=True)
class Fenced:
    """A worker-side call refused because the caller no longer holds the lease.

    Nothing about the job changed; the refusal is recorded in job_attempts as ``fenced``.
    ``status`` is the job's status when the call was refused (``cancelled`` tells a cancel
    from a lost lease).
    """

    job_id: int
    call: Call
    status: JobStatus


@dataclass(frozen=True)
class Completed:
    """The job succeeded. ``effect_key``: the key its effect row was written under (the one
    passed to complete, else the job's idempotency key); None for a job without a key, whose
    result is in its own row only. ``effect_written`` is False when there is no key, or the
    key already had a row: another job's effect holds it (a repeat of that work, or another
    producer's job using the same key in the queue), and the attempt's note says so."""

    job_id: int
    effect_key: str | None
    effect_written: bool

    @property
    def effect_dropped(self) -> bool:
        """This job had a key but wrote no effect: another job's effect holds the key."""
        return self.effect_key is not None and not self.effect_written


@dataclass(frozen=True)
class Failed:
    """The attempt failed: ``status`` is ``pending`` (retry at ``retry_at``) or ``dead``."""

    job_id: int
    status: JobStatus
    retry_at: datetime | None

    def __post_init__(self) -> None:
        _as(JobStatus, self, "status")


@dataclass(frozen=True)
class Released:
    """The job was handed back. A shutdown release costs no attempt and keeps the job's
    place (``pending``); any other counts as an attempt: ``pending`` after backoff, or
    ``dead`` when its attempts are used up."""

    job_id: int
    status: JobStatus = JobStatus.PENDING

    def __post_init__(self) -> None:
        _as(JobStatus, self, "status")


class HeartbeatStatus(enum.Enum):
    """What a heartbeat found."""

    #: The lease was extended (up to the job's maximum runtime at most).
    RENEWED = "renewed"
    #: The caller no longer holds the lease (expired, reclaimed, cancelled or finished).
    LOST = "lost"


@dataclass(frozen=True)
class Heartbeat:
    """Result of a heartbeat; ``lease_expires_at`` is the new end of the lease when renewed,
    ``job_status`` the job's status when LOST (``cancelled`` tells a cancel from a lost lease)."""

    status: HeartbeatStatus
    lease_expires_at: datetime | None
    job_status: JobStatus | None = None


@dataclass(frozen=True)
class LeaderTerm:
    """A held leader lease: the term this holder holds and when it lapses (database time)."""

    term: int
    expires_at: datetime


class LeaderKind(enum.StrEnum):
    """What holds a leader lease. The operator's replica also scales WorkerPools; a worker
    offering to lead never takes a lease that an operator or a ``leaseq reaper`` held last."""

    OPERATOR = "operator"
    REAPER = "reaper"
    WORKER = "worker"


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds (``live``) or last held a leader lease, of which kind, in which term."""

    holder: str
    kind: LeaderKind
    term: int
    expires_at: datetime
    live: bool


@dataclass(frozen=True)
class Reaped:
    """A running job whose lease expired, put back to pending or dead by the reaper."""

    job_id: int
    queue: str
    job_type: str
    status: JobStatus
    previous_owner: str
    token: int
    attempt: int
    timed_out: bool

    def __post_init__(self) -> None:
        _as(JobStatus, self, "status")


@dataclass(frozen=True)
class Cancelled:
    """A cancel request's outcome: ``cancelled`` is False when the job had already finished
    (its unfinished descendants are cancelled all the same); ``descendants``: how many of
    them were cancelled with it; ``running``: how many of all those cancelled were running
    (their holders are fenced)."""

    job_id: int
    cancelled: bool
    previous_status: JobStatus
    descendants: int = 0
    running: int = 0

    def __post_init__(self) -> None:
        _as(JobStatus, self, "previous_status")

    @property
    def pending(self) -> int:
        """How many of those cancelled had not started (waiting or pending)."""
        return int(self.cancelled) + self.descendants - self.running


@dataclass(frozen=True)
class CancelledJob:
    """One job a cancel reached: its previous status, and the job named whose cancel reached
    it (None: a pipeline's cancel)."""

    job_id: int
    previous_status: JobStatus
    ancestor: int | None

    def __post_init__(self) -> None:
        _as(JobStatus, self, "previous_status")


def cancelled_of(job_id: int, reached: Sequence[CancelledJob], status: JobStatus) -> Cancelled:
    """The outcome of cancelling ``job_id``, from the jobs the statement reached and the job's
    status when it was not among them."""
    mine = next((r for r in reached if r.job_id == job_id), None)
    return Cancelled(
        job_id,
        mine is not None,
        mine.previous_status if mine is not None else status,
        descendants=len(reached) - (mine is not None),
        running=sum(r.previous_status is JobStatus.RUNNING for r in reached),
    )


@dataclass(frozen=True)
class JobOutcome:
    """Where a waited-for job stands: its status, and its result once ``succeeded`` (or its
    last error, code and attempt count when ``dead``)."""

    job_id: int
    status: JobStatus
    result: Any
    last_error: str | None
    last_error_code: str | None
    attempts: int

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES


def unwrap(outcome: JobOutcome) -> Any:
    """The stored result of a succeeded job; JobDead or JobCancelled otherwise."""
    if outcome.status == JobStatus.DEAD:
        raise JobDead(outcome.job_id, outcome.last_error, outcome.last_error_code, outcome.attempts)
    if outcome.status == JobStatus.CANCELLED:
        raise JobCancelled(outcome.job_id, outcome.last_error)
    return outcome.result


@dataclass(frozen=True)
class QueueStats:
    """Depth of one queue, computed in the database at the time of the call."""

    queue: str
    ready: int
    scheduled: int
    scheduled_soon: int
    running: int
    dead: int
    #: Held at an uncertain step, waiting for an operator (``leaseq steps resolve``).
    held: int
    oldest_ready_age: float | None
    max_heartbeat_age: float | None


@dataclass(frozen=True)
class QueueFinished:
    """Jobs of one queue that finished without dying within a recent window."""

    queue: str
    succeeded: int
    cancelled: int


@dataclass(frozen=True)
class JobTypeWork:
    """Jobs of one job type in some queues, with the mean run time of its recent attempts."""

    job_type: str
    ready: int
    scheduled_soon: int
    running: int
    mean_seconds: float | None  # None: no attempt ran to its end within the window
    samples: int  # attempts the mean is taken over


@dataclass(frozen=True)
class UnservedWork:
    """Ready jobs of one job type in one queue that no live worker serves, though the queue
    has live workers: each of them reports its job types, and this one is not among them
    (a deploy that has not reached this type yet, or a typo in a producer)."""

    queue: str
    job_type: str
    ready: int
    oldest_ready_age: float


@dataclass(frozen=True)
class JobRecord:
    """A job row as stored, for inspection."""

    id: int
    queue: str
    job_type: str
    payload: Any
    status: JobStatus
    priority: int
    attempt_count: int
    max_attempts: int
    created_at: datetime
    available_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    lease_owner: str | None
    lease_token: int
    lease_expires_at: datetime | None
    heartbeat_at: datetime | None
    progress: Any
    timeout_seconds: float | None
    last_error: str | None
    last_error_code: str | None
    idempotency_key: str | None
    dedup_key: str | None
    result: Any
    checkpoint: Any
    #: The signal a pending job waits for (``ctx.wait_for``) and since when; cleared by the
    #: next claim. Only a ``pending`` job waits.
    waiting_for: str | None = None
    waiting_since: datetime | None = None

    def __post_init__(self) -> None:
        _as(JobStatus, self, "status")


@dataclass(frozen=True)
class AttemptRecord:
    """One row of a job's audit trail."""

    job_id: int
    attempt: int
    lease_token: int
    worker: str
    started_at: datetime | None
    ended_at: datetime
    outcome: AttemptOutcome
    error: str | None
    #: The traceback of the exception that ended the attempt (a failed handler), if any.
    traceback: str | None = None

    def __post_init__(self) -> None:
        _as(AttemptOutcome, self, "outcome")


#: ``last_error_code`` of a job stopped at an uncertain step (leaseq.StepUncertain's name).
STEP_UNCERTAIN_CODE = "StepUncertain"


@dataclass(frozen=True)
class StepRecord:
    """One durable step of a job (``ctx.step``): its intent (the attempt and lease token that
    committed to run it, and when; None once an operator asked for it to run again) and its
    outcome (``finished_at`` and ``result``; None while it has none), and the last operator
    resolution of it, if any."""

    name: str
    attempt: int | None
    lease_token: int | None
    intended_at: datetime | None
    finished_at: datetime | None
    result: Any
    #: What had to change in the result to store it (None: nothing).
    note: str | None
    resolved_by: str | None
    resolved_at: datetime | None
    resolve_reason: str | None

    @property
    def recorded(self) -> bool:
        """True when the step has an outcome: no attempt runs its function again."""
        return self.finished_at is not None

    @property
    def intended(self) -> bool:
        """True when an attempt committed to run the step and no outcome was recorded."""
        return self.finished_at is None and self.lease_token is not None


def unsettled_reason(step: str, status: str, found: StepRecord | None) -> str:
    """Why step ``step`` (``found``; None: the job has none of that name) of an existing job
    in ``status`` cannot be settled, as a phrase after "job N" (the CLI's error, the
    console's answer)."""
    if found is None:
        return f"has no step {step!r}"
    if not found.intended:
        has = "a result" if found.recorded else "no intent"
        return f"step {step!r} is not uncertain: it has {has}"
    return f"is {status}, not held: only a held job's uncertain step is settled"


@dataclass(frozen=True)
class Signalled:
    """What :meth:`leaseq.Queue.signal` did: ``stored`` is False when the job already had a
    signal of that name (the first is kept); ``waiting`` is True when the job was waiting for
    it, and is now claimable."""

    job_id: int
    name: str
    stored: bool
    waiting: bool


@dataclass(frozen=True)
class SignalRecord:
    """A signal sent to a job (its payload is not shown: ``bytes`` is its size as JSON)."""

    name: str
    sent_at: datetime
    sent_by: str
    bytes: int


@dataclass(frozen=True)
class SignalWaits:
    """Jobs of a queue waiting for a signal (``ctx.wait_for``): how many, and the seconds
    since the oldest of them began to wait (None when no wait began at a finite time in the
    past: a stored ``-infinity`` or a time past now adds no age)."""

    queue: str
    waiting: int
    oldest_age: float | None


@dataclass(frozen=True)
class WaitingOn:
    """What a pending job waits for (``ctx.wait_for``), since when, and until when."""

    waiting_for: str
    waiting_since: datetime | None
    deadline: datetime


#: Items a job's stream holds at most (``ctx.emit`` raises once it is full).
MAX_STREAM_ITEMS = 10_000
#: Largest stream item, as JSON (bytes).
MAX_STREAM_ITEM_BYTES = 65_536


@dataclass(frozen=True)
class StreamItem:
    """One item of a job's stream (``ctx.emit``): its offset (1 for the first item; read on
    from any offset with ``Queue.stream(job_id, after=offset)``) and its JSON value."""

    offset: int
    value: Any


@dataclass(frozen=True)
class StreamPage:
    """Items of a job's stream after an offset, and whether the job had finished when they
    were read (then no item follows the last one of a page that was not full)."""

    items: list[StreamItem]
    finished: bool


@dataclass(frozen=True)
class UncertainStep:
    """A dead job stopped at a step whose outcome is unknown (see ``leaseq steps``)."""

    job_id: int
    queue: str
    job_type: str
    name: str
    attempt: int | None
    intended_at: datetime | None


@dataclass(frozen=True)
class EffectRecord:
    """The effect stored under an idempotency key, in its queue and job type (the key's
    scope: the same key in another queue or type is another effect)."""

    idempotency_key: str
    job_id: int
    produced_by: str
    produced_at: datetime
    result: Any
    queue: str
    job_type: str


@dataclass(frozen=True)
class WorkerRecord:
    """A registered worker process and the running jobs it holds."""

    worker_id: str
    pod: str | None
    node: str | None
    queues: list[str]
    concurrency: int
    state: WorkerState
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age: float
    running: int
    oldest_running_age: float | None
    age: float = 0.0  # seconds since the worker registered (how long a loading one has loaded)
    startup_seconds: float | None = None  # how long on_startup took; None while loading
    #: The job types it serves (claims); None for a worker that predates reporting them.
    job_types: list[str] | None = None
    #: No registry heartbeat for :data:`SILENT_AFTER_SECONDS` (by database time): the worker
    #: is gone or stuck, and ``state`` is only what it last said.
    silent: bool = field(init=False)

    def __post_init__(self) -> None:
        _as(WorkerState, self, "state")
        object.__setattr__(self, "silent", is_silent(self.heartbeat_age))


class JobPlace(enum.StrEnum):
    """Where a job's record was found (``leaseq.job_whereabouts.place``)."""

    #: leaseq.jobs: live, or finished less than the hot retention ago.
    HOT = "hot"
    #: leaseq.job_history: moved, the full row and its attempts, until its retention ends.
    HISTORY = "history"
    #: leaseq.job_ledger only: its history was dropped; queue, type, final state, times,
    #: attempts and the start of its last error remain.
    LEDGER = "ledger"


@dataclass(frozen=True)
class JobWhereabouts:
    """A job wherever it is. In the ledger only the ledger's fields are set."""

    place: JobPlace
    id: int
    queue: str
    job_type: str
    status: JobStatus
    attempt_count: int
    created_at: datetime
    finished_at: datetime | None
    last_error: str | None
    last_error_code: str | None
    payload: Any = None
    priority: int | None = None
    max_attempts: int | None = None
    available_at: datetime | None = None
    started_at: datetime | None = None
    lease_owner: str | None = None
    lease_token: int | None = None
    lease_expires_at: datetime | None = None
    heartbeat_at: datetime | None = None
    progress: Any = None
    timeout_seconds: float | None = None
    idempotency_key: str | None = None
    dedup_key: str | None = None
    result: Any = None
    checkpoint: Any = None

    def __post_init__(self) -> None:
        _as(JobPlace, self, "place")
        _as(JobStatus, self, "status")


@dataclass(frozen=True)
class Moved:
    """One mover batch: jobs moved out of the hot table, of which ``expired`` were already
    past their retention and went to the ledger only."""

    moved: int
    expired: int


@dataclass(frozen=True)
class RetentionRule:
    """How many days moved jobs of ``queue`` (``*``: every queue) in ``status`` stay in history."""

    queue: str
    status: JobStatus
    keep_days: int
    ledger_keep_days: int

    def __post_init__(self) -> None:
        _as(JobStatus, self, "status")


@dataclass(frozen=True)
class ExpireStep:
    """One retention step: the history leaf, effects deleted, and whether it was dropped."""

    leaf: str
    effects: int
    dropped: bool


@dataclass(frozen=True)
class FinishedCount:
    """Finished jobs of one queue and final state over a period (from the rollup)."""

    queue: str
    status: JobStatus
    jobs: int

    def __post_init__(self) -> None:
        _as(JobStatus, self, "status")


@dataclass(frozen=True)
class PruneCandidates:
    """What a prune would delete in one status."""

    status: JobStatus
    jobs: int
    oldest: datetime
    newest: datetime

    def __post_init__(self) -> None:
        _as(JobStatus, self, "status")


class After(enum.StrEnum):
    """When a dependency is met (``leaseq.job_deps.after``)."""

    #: The parent succeeded; if it goes dead or is cancelled, the child is cancelled
    #: (recorded, and undone when the parent is retried).
    SUCCEEDED = "succeeded"
    #: The parent finished in any state (succeeded, dead or cancelled).
    FINISHED = "finished"


@dataclass(frozen=True)
class GraphEnqueued:
    """What :meth:`leaseq.Queue.enqueue_graph` wrote: the pipeline and each node's job id
    (by node key, in the order the nodes were added)."""

    pipeline_id: int | None
    job_ids: dict[str, int]

    def __getitem__(self, key: str) -> int:
        return self.job_ids[key]


@dataclass(frozen=True)
class PipelineRecord:
    """A pipeline's progress, kept by the transitions of its jobs (one row, no scan)."""

    id: int
    name: str
    created_at: datetime
    total: int
    succeeded: int
    dead: int
    cancelled: int
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def unfinished(self) -> int:
        return self.total - self.succeeded - self.dead - self.cancelled


class PipelineState(enum.StrEnum):
    """How a finished pipeline ended."""

    #: Every job succeeded.
    SUCCEEDED = "succeeded"
    #: At least one job is dead (its waiting descendants were cancelled).
    FAILED = "failed"
    #: No job is dead, and at least one was cancelled.
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class PipelineOutcome:
    """A finished pipeline (:meth:`leaseq.Queue.wait_pipeline`): how it ended, its counters,
    and its sinks, the jobs no other job of it waits for (a fan-out's merge), in id order.
    A job that finished without starting a pipeline is a pipeline of one: ``pipeline_id``
    None and the job its only sink."""

    pipeline_id: int | None
    state: PipelineState
    total: int
    succeeded: int
    dead: int
    cancelled: int
    sinks: list[JobOutcome]
    #: More sinks than were read (``sinks=`` of the wait): ``sinks`` holds the newest.
    more_sinks: bool = False

    @property
    def result(self) -> Any:
        """The pipeline's result: the result of its one sink (the merge of a split/page/merge
        pipeline); JobDead or JobCancelled when that job did not succeed. A pipeline that
        ends in several jobs has no one result: JobStateError naming them (read ``sinks``)."""
        if len(self.sinks) != 1 or self.more_sinks:
            ids = ", ".join(str(s.job_id) for s in self.sinks) + (
                ", ..." if self.more_sinks else ""
            )
            raise JobStateError(
                f"pipeline {self.pipeline_id} ends in {len(self.sinks)} jobs ({ids}), not one: "
                "read each from .sinks (leaseq.unwrap turns one into its result)"
            )
        return unwrap(self.sinks[0])


@dataclass(frozen=True)
class ParentResult:
    """One parent of a job, read by reference (``ctx.parent_results()``)."""

    job_id: int
    job_type: str
    status: JobStatus
    result: Any
    after: After

    def __post_init__(self) -> None:
        _as(JobStatus, self, "status")
        _as(After, self, "after")


@dataclass(frozen=True)
class LinkedJob:
    """A parent or child of a job, for ``leaseq jobs show``."""

    job_id: int
    job_type: str
    status: JobStatus
    after: After

    def __post_init__(self) -> None:
        _as(JobStatus, self, "status")
        _as(After, self, "after")


@dataclass(frozen=True)
class JobLinks:
    """A job's pipeline, parents and children (at most ``limit`` of each; ``more_*`` when
    there are more), its unmet parent count and what cancelled it, if a failure did."""

    job_id: int
    pipeline_id: int | None
    deps_left: int
    cancelled_by: int | None
    parents: list[LinkedJob]
    children: list[LinkedJob]
    more_parents: bool
    more_children: bool


@dataclass(frozen=True)
class PipelineCancelled:
    """What :meth:`leaseq.Queue.cancel_pipeline` cancelled (running ones are fenced)."""

    pipeline_id: int
    cancelled: int
    running: int

    @property
    def pending(self) -> int:
        """How many of those cancelled had not started (waiting or pending)."""
        return self.cancelled - self.running
