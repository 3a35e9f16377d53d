"""The store: one typed method per named statement, and nothing else.

Methods take an open connection and run exactly one statement on it; transaction scope is
the caller's (see the faces in :mod:`leaseq.core`). psycopg errors become leaseq errors in
:class:`~leaseq.core._store.runner.Runner`, which every store class runs its statements
through, and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb, set_json_loads

from leaseq.core import moments
from leaseq.core._store.runner import Conn, Params, Runner
from leaseq.core.errors import InvalidGraph, translate
from leaseq.core.graph import INHERIT, Plan
from leaseq.core.models import (
    After,
    AttemptOutcome,
    AttemptRecord,
    Call,
    CancelledJob,
    ClaimedJob,
    ClaimRequest,
    ClaimTable,
    EffectRecord,
    ExpireStep,
    FinishedCount,
    JobLinks,
    JobOutcome,
    JobRecord,
    JobStatus,
    JobTypeWork,
    JobWhereabouts,
    LeaderKind,
    LeaderTerm,
    Lease,
    LeaseHolder,
    LinkedJob,
    Moved,
    OpenClaim,
    ParentResult,
    PipelineRecord,
    PruneCandidates,
    QueueFinished,
    QueueStats,
    Reaped,
    RetentionRule,
    RetryPolicy,
    SignalRecord,
    SignalWaits,
    SlotsClaim,
    StepRecord,
    StreamItem,
    StreamPage,
    UncertainStep,
    UnservedWork,
    WaitingOn,
    WorkerRecord,
    WorkerState,
)

#: The statements whose rows are read in PostgreSQL's binary format: the claims and the
#: completion, a worker's statements per job. Their integers and timestamps load without
#: parsing text: with no-op jobs at concurrency 64, a worker's CPU per job was 0.0345-0.037
#: ms against 0.0355-0.039 in text (W=4, four interleaved pairs, lower in each), and one
#: worker ran 14,748-14,819 jobs/s against 14,075-14,581 (W=1, three pairs). Only for
#: columns of types psycopg loads from binary: an enum, say, would come back as bytes
#: (test_binary_results.py describes every column of each).
BINARY_RESULTS = frozenset(
    {
        "job_claim",
        "job_claim_keyed_open",
        "job_claim_keyed_slots",
        "job_claim_keyed",
        "job_complete",
    }
)

# The decoder's C scanner (typeshed does not declare the attribute).
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _utf8_json(data: str | bytes) -> Any:
    """A JSON value as PostgreSQL sends it. jsonb's text has no surrounding whitespace, so
    the C scanner alone reads it; anything else goes through json.loads, which checks."""
    text = data if isinstance(data, str) else str(data, "utf-8")
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def json_param(value: Any) -> Jsonb | None:
    """``value`` as a jsonb parameter (None stays SQL NULL; shared with the asyncio store)."""
    return None if value is None else Jsonb(value)


def stream_page(rows: Sequence[Mapping[str, Any]]) -> StreamPage:
    """leaseq.stream_read's rows as a page (a row without an item carries only finished)."""
    items = [StreamItem(int(r["seq"]), r["value"]) for r in rows if r["seq"] is not None]
    return StreamPage(items, bool(rows[0]["finished"]) if rows else True)


def _bigint_array(values: Sequence[int]) -> str:
    """``values`` as one bigint[] input literal. psycopg dumps a list element by element
    (about a microsecond each, three arrays per completed job); one join is a twentieth."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def _text_array(values: Sequence[str]) -> str:
    """``values`` (none None) as one text[] input literal: each element double-quoted, its
    backslashes and double quotes escaped (PostgreSQL's array input syntax)."""
    quoted: dict[str, str] = {}
    for v in values:
        if v not in quoted:
            quoted[v] = '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "{" + ",".join([quoted[v] for v in values]) + "}"


def _nulls_as_null(values: list[Any]) -> list[Any] | None:
    """None for a list of Nones: the statements read their arrays with a multi-argument
    unnest, which pads a NULL array with NULLs, so nothing needs sending."""
    return None if values.count(None) == len(values) else values


def _bytea_array(values: Sequence[bytes]) -> str:
    """``values`` as one bytea[] input literal: each element double-quoted hex, its
    backslash escaped (PostgreSQL's array input syntax), as _bigint_array for its speed."""
    return "{" + ",".join(['"\\\\x' + v.hex() + '"' for v in values]) + "}"


def _claimed(
    rows: list[DictRow], owner: str, secret_of: Callable[[DictRow], bytes]
) -> list[ClaimedJob]:
    """The claim's rows as leased jobs; each lease's secret is the one of the call that took
    it (``secret_of`` a row)."""
    return [
        ClaimedJob(
            id=r["id"],
            queue=r["queue"],
            job_type=r["job_type"],
            payload=r["payload"],
            priority=r["priority"],
            attempt=r["attempt_count"],
            max_attempts=r["max_attempts"],
            lease=Lease(
                r["id"],
                owner,
                r["lease_token"],
                r["attempt_count"],
                r["started_at"],
                secret_of(r),
            ),
            lease_expires_at=r["lease_expires_at"],
            timeout_seconds=r["timeout_seconds"],
            idempotency_key=r["idempotency_key"],
            checkpoint=r["checkpoint"],
            trace_context=r["trace_context"],
        )
        for r in rows
    ]


def _held(lease: Lease) -> dict[str, Any]:
    """The parameters every statement of the worker's door takes for one lease."""
    return {"id": lease.job_id, "owner": lease.owner, "token": lease.token, "secret": lease.secret}


def _leased(rows: list[DictRow], request: ClaimRequest) -> list[ClaimedJob]:
    """The rows of one claim call (``request``) as leased jobs."""
    return _claimed(rows, request.owner, lambda _: request.secret)


def enqueue_params(jobs: Sequence[Params], now: datetime | None) -> list[dict[str, Any]]:
    """The job_enqueue parameters of each job (shared with the asyncio store)."""
    return [
        {
            **job,
            "payload": Jsonb(job["payload"]),
            "trace_context": json_param(job["trace_context"]),
            "now": now,
        }
        for job in jobs
    ]


def graph_rows(
    plan: Plan,
    ids: Sequence[int],
    parents: Mapping[int, DictRow],
    pipeline_id: int | None,
    now: datetime | None,
    spawner: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The graph_insert_jobs and graph_insert_deps parameters of a validated ``plan`` whose
    nodes get ``ids``, given its existing parents' locked rows (``parents``, by id), and the
    queues to wake (those with a node that is claimable at once). Shared with the asyncio
    store. InvalidGraph when a parent does not exist or can no longer be met. ``spawner``:
    the job whose completion writes the graph, recorded as the (met) parent of its roots."""
    for job_id in plan.external:
        if job_id not in parents:
            raise InvalidGraph(f"parent job {job_id} does not exist")
    unmet = [0] * len(plan.nodes)
    deps: dict[str, list[Any]] = {"parents": [], "children": [], "afters": [], "counted": []}
    for edge in plan.edges:
        if edge.parent is not None:
            parent_id, met = ids[edge.parent], False
        else:
            assert edge.job_id is not None
            parent_id = edge.job_id
            status = JobStatus(parents[parent_id]["status"])
            met = status is JobStatus.SUCCEEDED or (
                status in FINISHED and edge.after is After.FINISHED
            )
            if status in FINISHED and not met:
                raise InvalidGraph(
                    f"node {plan.nodes[edge.child].name!r} waits for job {parent_id} to "
                    f"succeed, but it is {status} (retry it first, or wait for it with "
                    "After.FINISHED)"
                )
        unmet[edge.child] += 0 if met else 1
        deps["parents"].append(parent_id)
        deps["children"].append(ids[edge.child])
        deps["afters"].append(str(edge.after))
        deps["counted"].append(met)
    if spawner is not None:
        with_parents = {e.child for e in plan.edges}
        for i in range(len(plan.nodes)):
            if i not in with_parents:
                deps["parents"].append(spawner)
                deps["children"].append(ids[i])
                deps["afters"].append(str(After.SUCCEEDED))
                deps["counted"].append(True)
    has_children = plan.children_of_nodes()
    nodes = plan.nodes
    jobs = {
        "ids": list(ids),
        "queues": [n.queue for n in nodes],
        "job_types": [n.job_type for n in nodes],
        "payloads": [Jsonb(n.payload) for n in nodes],
        "priorities": [n.priority for n in nodes],
        "max_attempts": [n.max_attempts for n in nodes],
        "run_ats": [n.run_at for n in nodes],
        "delays": [float(n.delay) for n in nodes],  # an int among floats cannot be dumped
        "timeouts": [n.timeout for n in nodes],
        "idempotency_keys": [n.idempotency_key for n in nodes],
        # A node left at INHERIT takes the spawner's key, read by lease_spawn itself.
        "keys": [n.key if isinstance(n.key, str) else None for n in nodes],
        "inherits": [n.key is INHERIT for n in nodes],
        "deps_left": unmet,
        "has_children": [i in has_children for i in range(len(nodes))],
        "pipeline_id": pipeline_id,
        "now": now,
    }
    wake = sorted({n.queue for n, left in zip(nodes, unmet, strict=True) if left == 0})
    return jobs, deps, wake


def pipeline_of(parents: Mapping[int, DictRow], external: Sequence[int]) -> int | None:
    """The pipeline a job enqueued after existing jobs joins: its first parent's that has one."""
    for job_id in external:
        row = parents.get(job_id)
        if row is not None and row["pipeline_id"] is not None:
            return int(row["pipeline_id"])
    return None


FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED})
_VACUUM = {ClaimTable.JOBS: "jobs_vacuum", ClaimTable.FLOW_KEYS: "flow_keys_vacuum"}


def outcome(row: DictRow) -> JobOutcome:
    """A job_outcomes row as a :class:`JobOutcome` (shared with the asyncio store)."""
    return JobOutcome(
        job_id=row["id"],
        status=JobStatus(row["status"]),
        result=row["result"],
        last_error=row["last_error"],
        last_error_code=row["last_error_code"],
        attempts=row["attempt_count"],
    )


class Store(Runner):
    """The statements of jobs.sql and the rest of the queue core's files: jobs, workers,
    leadership, history, pipelines, migrations and grants."""

    _binary_results = BINARY_RESULTS

    # -- jobs ---------------------------------------------------------------------------

    def job_enqueue(
        self, conn: Conn, jobs: Sequence[Params], now: datetime | None = None
    ) -> list[DictRow | None]:
        """Insert jobs with one pipelined round trip; each row has ``id`` and ``created``.

        ``jobs`` are mappings with the statement's fields (queue, job_type, payload, priority,
        max_attempts, run_at, delay, timeout, idempotency_key, dedup_key). A None row means a
        concurrent enqueue with the same dedup key won after this statement's snapshot."""
        params = enqueue_params(jobs, now)
        query = self._statements["job_enqueue"].query
        results: list[DictRow | None] = []
        try:
            with conn.cursor(row_factory=dict_row) as cur:
                moments.register(cur.adapters)
                cur.executemany(query, params, returning=True)
                while True:
                    results.append(cur.fetchone())
                    if not cur.nextset():
                        break
        except psycopg.Error as exc:
            raise translate(exc, action="enqueue", conninfo=conn.info.dsn) from exc
        return results

    def _claim(self, conn: Conn, name: str, request: ClaimRequest, limit: int) -> list[DictRow]:
        """The rows of the claim statement ``name`` for up to ``limit`` jobs of ``request``."""
        params = {
            "queues": request.queues,
            "job_types": request.job_types,
            "owner": request.owner,
            "limit": limit,
            "lease_seconds": request.lease_seconds,
            "claim_id": request.claim_id,
            "claim_secret": request.secret,
            "now": request.now,
        }
        return self._dicts(conn, name, params, "claim")

    def job_claim(self, conn: Conn, request: ClaimRequest, limit: int) -> list[ClaimedJob]:
        """The keyless jobs leased, at most ``limit``."""
        return _leased(self._claim(conn, "job_claim", request, limit), request)

    def job_claim_keyed_open(self, conn: Conn, request: ClaimRequest, limit: int) -> OpenClaim:
        """The keyed jobs leased from queues with no limit or rate set, at most ``limit``,
        and whether the queues have one (then none)."""
        rows = self._claim(conn, "job_claim_keyed_open", request, limit)
        jobs = _leased([r for r in rows if r["id"] is not None], request)
        return OpenClaim(jobs, limited=rows[0]["limited"], rated=rows[0]["rated"])

    def job_claim_keyed_slots(self, conn: Conn, request: ClaimRequest, limit: int) -> SlotsClaim:
        """The keyed jobs leased from queues with no rate set, each key within its limit, at
        most ``limit``, and whether the queues have a rate (then none)."""
        rows = self._claim(conn, "job_claim_keyed_slots", request, limit)
        jobs = _leased([r for r in rows if r["id"] is not None], request)
        return SlotsClaim(jobs, rated=rows[0]["rated"])

    def job_claim_keyed(self, conn: Conn, request: ClaimRequest, limit: int) -> list[ClaimedJob]:
        """The keyed jobs leased, each key within its limit and rate, at most ``limit``."""
        return _leased(self._claim(conn, "job_claim_keyed", request, limit), request)

    def job_claim_recover(
        self, conn: Conn, *, owner: str, claims: Mapping[UUID, bytes]
    ) -> list[ClaimedJob]:
        """The jobs the claim calls ``claims`` (their ids and secrets) took and ``owner``
        still holds."""
        params = {
            "owner": owner,
            "claim_ids": list(claims),
            "claim_secrets": list(claims.values()),
        }
        rows = self._dicts(conn, "job_claim_recover", params, "claim")
        return _claimed(rows, owner, lambda r: claims[r["claim_id"]])

    def job_heartbeat_many(
        self,
        conn: Conn,
        leases: Sequence[Lease],
        *,
        lease_seconds: float,
        progresses: Sequence[Any],
        now: datetime | None = None,
    ) -> dict[int, datetime]:
        """The new end of each lease still held, by job id (one statement for all)."""
        rows = self._dicts(
            conn,
            "job_heartbeat_many",
            {
                "ids": [lease.job_id for lease in leases],
                "owners": [lease.owner for lease in leases],
                "tokens": [lease.token for lease in leases],
                "secrets": _bytea_array([lease.secret for lease in leases]),
                "progresses": [json_param(p) for p in progresses],
                "lease_seconds": lease_seconds,
                "now": now,
            },
            "heartbeat",
        )
        return {int(r["id"]): r["lease_expires_at"] for r in rows}

    def job_checkpoint(
        self, conn: Conn, lease: Lease, checkpoint: Any, now: datetime | None = None
    ) -> bool:
        """True when stored; False when the lease is no longer held."""
        rows = self._dicts(
            conn,
            "job_checkpoint",
            {
                **_held(lease),
                "checkpoint": json_param(checkpoint),
                "now": now,
            },
            "checkpoint",
        )
        return bool(rows)

    # -- durable steps ---------------------------------------------------------------------

    def step_list(self, conn: Conn, job_id: int) -> list[StepRecord]:
        return self._typed(conn, "step_list", {"id": job_id}, StepRecord, "list steps")

    def _step_fenced(
        self, conn: Conn, statement: str, lease: Lease, name: str, action: str, **params: Any
    ) -> bool:
        rows = self._dicts(
            conn,
            statement,
            {
                **_held(lease),
                "name": name,
                "now": params.pop("now", None),
                **params,
            },
            action,
        )
        return bool(rows)

    def step_intend(
        self,
        conn: Conn,
        lease: Lease,
        name: str,
        *,
        seen_token: int | None,
        now: datetime | None = None,
    ) -> bool:
        """True when the intent is committed; False when the lease is not held."""
        return self._step_fenced(
            conn, "step_intend", lease, name, "step intent", seen_token=seen_token, now=now
        )

    def step_record(
        self,
        conn: Conn,
        lease: Lease,
        name: str,
        *,
        result: Any,
        note: str | None,
        now: datetime | None = None,
    ) -> bool:
        """True when the outcome is recorded; False when the lease is not held."""
        return self._step_fenced(
            conn,
            "step_record",
            lease,
            name,
            "step record",
            result=json_param(result),
            note=note,
            now=now,
        )

    def step_withdraw(
        self, conn: Conn, lease: Lease, name: str, now: datetime | None = None
    ) -> bool:
        """True when the intent is withdrawn; False when the lease is not held."""
        return self._step_fenced(conn, "step_withdraw", lease, name, "step withdraw", now=now)

    def step_resolve(
        self,
        conn: Conn,
        job_id: int,
        name: str,
        *,
        result: Any,
        retry: bool,
        actor: str,
        reason: str,
        now: datetime | None = None,
    ) -> bool:
        """True when the uncertain step was settled and its job made pending again."""
        rows = self._dicts(
            conn,
            "step_resolve",
            {
                "id": job_id,
                "name": name,
                "result": json_param(result),
                "retry": retry,
                "actor": actor,
                "reason": reason,
                "now": now,
            },
            "resolve step",
        )
        return bool(rows)

    def steps_uncertain(self, conn: Conn, error_code: str, limit: int) -> list[UncertainStep]:
        return self._typed(
            conn,
            "steps_uncertain",
            {"error_code": error_code, "limit": limit},
            UncertainStep,
            "list uncertain steps",
        )

    # -- streams --------------------------------------------------------------------------

    def stream_emit(
        self, conn: Conn, lease: Lease, value: Any, *, cap: int, now: datetime | None = None
    ) -> tuple[bool, int | None]:
        """Whether the lease is held, and the new item's offset (None: the stream is full)."""
        [row] = self._dicts(
            conn,
            "stream_emit",
            {
                **_held(lease),
                "value": Jsonb(value),
                "cap": cap,
                "now": now,
            },
            "emit",
        )
        return bool(row["held"]), row["seq"]

    def stream_read(self, conn: Conn, job_id: int, after: int, limit: int) -> StreamPage:
        rows = self._dicts(
            conn, "stream_read", {"id": job_id, "after": after, "limit": limit}, "read stream"
        )
        return stream_page(rows)

    def job_complete(
        self,
        conn: Conn,
        leases: Sequence[Lease],
        *,
        results: Sequence[Any],
        effect_keys: Sequence[str | None],
        progresses: Sequence[Any],
        notes: Sequence[str | None],
        now: datetime | None = None,
    ) -> dict[int, DictRow]:
        """Rows (``id``, ``effect_key``, ``effect_written``) of the leases still held, by job
        id; a lease missing from the answer is fenced. ``notes`` go to the attempt rows."""
        rows = self._dicts(
            conn,
            "job_complete",
            {
                "ids": _bigint_array([lease.job_id for lease in leases]),
                "owners": _text_array([lease.owner for lease in leases]),
                "tokens": _bigint_array([lease.token for lease in leases]),
                "secrets": _bytea_array([lease.secret for lease in leases]),
                "results": _nulls_as_null([json_param(r) for r in results]),
                "effect_keys": _nulls_as_null(list(effect_keys)),
                "progresses": _nulls_as_null([json_param(p) for p in progresses]),
                "notes": _nulls_as_null(list(notes)),
                "now": now,
            },
            "complete",
        )
        return {int(r["id"]): r for r in rows}

    def job_fail(
        self,
        conn: Conn,
        lease: Lease,
        *,
        error: str,
        error_code: str | None,
        traceback: str | None,
        retryable: bool,
        outcome: AttemptOutcome,
        retry: RetryPolicy,
        now: datetime | None = None,
    ) -> DictRow | None:
        """Row with ``id``, ``status`` and ``available_at``; None when fenced."""
        rows = self._dicts(
            conn,
            "job_fail",
            {
                **_held(lease),
                "error": error,
                "error_code": error_code,
                "traceback": traceback,
                "retryable": retryable,
                "outcome": outcome,
                "backoff_base": retry.base_seconds,
                "backoff_cap": retry.cap_seconds,
                "now": now,
            },
            "fail",
        )
        return rows[0] if rows else None

    def job_release(
        self,
        conn: Conn,
        lease: Lease,
        *,
        reason: str,
        shutdown: bool,
        retry: RetryPolicy,
        now: datetime | None = None,
    ) -> DictRow | None:
        """Row with ``id``, ``status`` and ``available_at``; None when fenced."""
        rows = self._dicts(
            conn,
            "job_release",
            {
                **_held(lease),
                "started_at": lease.started_at,
                "reason": reason,
                "shutdown": shutdown,
                "backoff_base": retry.base_seconds,
                "backoff_cap": retry.cap_seconds,
                "now": now,
            },
            "release",
        )
        return rows[0] if rows else None

    def job_sleep(
        self, conn: Conn, lease: Lease, *, until: datetime, now: datetime | None = None
    ) -> DictRow | None:
        """Row with ``id``, ``status`` and ``available_at``; None when fenced."""
        rows = self._dicts(
            conn,
            "job_sleep",
            {
                **_held(lease),
                "started_at": lease.started_at,
                "until": until,
                "now": now,
            },
            "sleep",
        )
        return rows[0] if rows else None

    def job_wait(
        self,
        conn: Conn,
        lease: Lease,
        *,
        name: str,
        until: datetime,
        now: datetime | None = None,
    ) -> DictRow | None:
        """Row with ``id``, ``status``, ``available_at`` and ``signalled``; None when fenced."""
        rows = self._dicts(
            conn,
            "job_wait",
            {
                **_held(lease),
                "started_at": lease.started_at,
                "name": name,
                "until": until,
                "now": now,
            },
            "wait",
        )
        return rows[0] if rows else None

    def signal_read(
        self, conn: Conn, lease: Lease, name: str, *, now: datetime | None = None
    ) -> DictRow | None:
        """Row with ``found`` and ``payload``; None when the lease is not held."""
        params = {
            **_held(lease),
            "name": name,
            "now": now,
        }
        rows = self._dicts(conn, "signal_read", params, "read signal")
        return rows[0] if rows else None

    def job_signal(self, conn: Conn, job_id: int, name: str, payload: Any) -> DictRow:
        """Row with ``stored`` and ``waiting``."""
        params = {"id": job_id, "name": name, "payload": Jsonb(payload)}
        [row] = self._dicts(conn, "job_signal", params, "signal")
        return row

    def job_waiting_on(self, conn: Conn, job_id: int) -> WaitingOn | None:
        rows = self._typed(conn, "job_waiting_on", {"id": job_id}, WaitingOn, "show job")
        return rows[0] if rows else None

    def signal_list(self, conn: Conn, job_id: int, *, limit: int) -> list[SignalRecord]:
        params = {"id": job_id, "limit": limit}
        return self._typed(conn, "signal_list", params, SignalRecord, "list signals")

    def queue_signal_waits(
        self, conn: Conn, *, queues: Sequence[str] | None, now: datetime | None = None
    ) -> list[SignalWaits]:
        params = {"queues": None if queues is None else list(queues), "now": now}
        return self._typed(conn, "queue_signal_waits", params, SignalWaits, "stats")

    def job_back_off(
        self,
        conn: Conn,
        lease: Lease,
        *,
        seconds: float,
        reason: str,
        now: datetime | None = None,
    ) -> DictRow | None:
        """Row with ``id``, ``status``, ``available_at`` and ``paused_until``; None when fenced."""
        rows = self._dicts(
            conn,
            "job_back_off",
            {
                **_held(lease),
                "started_at": lease.started_at,
                "seconds": seconds,
                "reason": reason,
                "now": now,
            },
            "back off",
        )
        return rows[0] if rows else None

    def job_attempt_outcome(self, conn: Conn, lease: Lease) -> DictRow | None:
        """How the attempt of ``lease`` ended (``outcome``, the job's ``status`` and
        ``available_at``, ``effect_key``, ``effect_written``); None while it has not."""
        rows = self._dicts(
            conn,
            "job_attempt_outcome",
            {"id": lease.job_id, "token": lease.token},
            "settle an interrupted call",
        )
        return rows[0] if rows else None

    def job_record_fenced(
        self, conn: Conn, lease: Lease, *, call: Call, now: datetime | None = None
    ) -> JobStatus | None:
        """Record a refused call; the job's status, or None when the job does not exist."""
        row = self._dicts(
            conn,
            "job_record_fenced",
            {
                **_held(lease),
                "attempt": lease.attempt,
                "started_at": lease.started_at,
                "call": call,
                "now": now,
            },
            call,
        )[0]
        return JobStatus(row["status"]) if row["status"] is not None else None

    def job_reap(
        self,
        conn: Conn,
        *,
        limit: int,
        reaper: str | None,
        owners: Sequence[str] | None = None,
        now: datetime | None = None,
    ) -> list[Reaped]:
        rows = self._dicts(
            conn,
            "job_reap",
            {
                "limit": limit,
                "reaper": reaper,
                "owners": None if owners is None else list(owners),
                "now": now,
            },
            "reap",
        )
        return [
            Reaped(
                job_id=r["id"],
                queue=r["queue"],
                job_type=r["job_type"],
                status=r["status"],
                previous_owner=r["lease_owner"],
                token=r["lease_token"],
                attempt=r["attempt_count"],
                timed_out=r["timed_out"],
            )
            for r in rows
        ]

    def job_cancel(
        self, conn: Conn, job_id: int, *, reason: str | None, now: datetime | None = None
    ) -> list[CancelledJob]:
        """Every job cancelled: the job itself if it was unfinished, and its unfinished
        descendants."""
        rows = self._dicts(
            conn, "job_cancel", {"id": job_id, "reason": reason, "now": now}, "cancel"
        )
        return [CancelledJob(r["id"], r["previous_status"], r["ancestor"]) for r in rows]

    def job_retry_dead(
        self, conn: Conn, job_id: int, *, attempts: int | None, now: datetime | None = None
    ) -> int | None:
        """The job's new max_attempts when revived; None when it was not dead."""
        rows = self._dicts(
            conn,
            "job_retry_dead",
            {"id": job_id, "attempts": attempts, "now": now},
            "retry",
        )
        return int(rows[0]["max_attempts"]) if rows else None

    def job_prune(
        self,
        conn: Conn,
        *,
        older_than: float,
        statuses: Sequence[JobStatus],
        batch: int,
        now: datetime | None = None,
    ) -> int:
        rows = self._dicts(
            conn,
            "job_prune",
            {
                "older_than": older_than,
                "statuses": list(statuses),
                "batch": batch,
                "now": now,
            },
            "prune",
        )
        return int(rows[0]["deleted"])

    def queue_finished(
        self,
        conn: Conn,
        *,
        queues: Sequence[str] | None,
        window: float,
        now: datetime | None = None,
    ) -> list[QueueFinished]:
        return self._typed(
            conn,
            "queue_finished",
            {"queues": list(queues) if queues else None, "window": window, "now": now},
            QueueFinished,
            "recently finished jobs",
        )

    def queue_stats(
        self,
        conn: Conn,
        *,
        queues: Sequence[str] | None,
        horizon: float,
        now: datetime | None = None,
    ) -> list[QueueStats]:
        return self._typed(
            conn,
            "queue_stats",
            {"queues": list(queues) if queues else None, "horizon": horizon, "now": now},
            QueueStats,
            "stats",
        )

    def unserved_ready(
        self,
        conn: Conn,
        *,
        queues: Sequence[str] | None,
        live_seconds: float,
        now: datetime | None = None,
    ) -> list[UnservedWork]:
        return self._typed(
            conn,
            "unserved_ready",
            {"queues": list(queues) if queues else None, "live_seconds": live_seconds, "now": now},
            UnservedWork,
            "read unserved work",
        )

    def pool_work(
        self,
        conn: Conn,
        *,
        queues: Sequence[str],
        window: float,
        horizon: float,
        max_samples: int,
        now: datetime | None = None,
    ) -> list[JobTypeWork]:
        params = {
            "queues": list(queues),
            "window": window,
            "horizon": horizon,
            "max_samples": max_samples,
            "now": now,
        }
        return self._typed(conn, "pool_work", params, JobTypeWork, "read work")

    def job_get(self, conn: Conn, job_id: int) -> JobRecord | None:
        rows = self._typed(conn, "job_get", {"id": job_id}, JobRecord, "show job")
        return rows[0] if rows else None

    def job_list(
        self, conn: Conn, *, status: str | None, queue: str | None, limit: int
    ) -> list[JobRecord]:
        return self._typed(
            conn,
            "job_list",
            {"status": status, "queue": queue, "limit": limit},
            JobRecord,
            "list jobs",
        )

    def job_attempts(self, conn: Conn, job_id: int) -> list[AttemptRecord]:
        return self._typed(conn, "job_attempts", {"id": job_id}, AttemptRecord, "list attempts")

    def job_result(
        self, conn: Conn, key: str, *, queue: str | None, job_type: str | None
    ) -> list[EffectRecord]:
        """At most two effects under ``key`` in the scope given (None: any), newest first."""
        return self._typed(
            conn,
            "job_result",
            {"key": key, "queue": queue, "job_type": job_type},
            EffectRecord,
            "read effect",
        )

    def claim_dead_tuples(self, conn: Conn) -> tuple[str, dict[ClaimTable, tuple[int, bool]]]:
        """This session's role, and per table that a claim walks from its head its dead row
        versions and whether that role may VACUUM it."""
        rows = self._dicts(conn, "claim_dead_tuples", {}, "vacuum")
        role = str(rows[0]["role"]) if rows else ""
        return role, {
            ClaimTable(r["table_name"]): (int(r["dead_tuples"]), bool(r["may_vacuum"]))
            for r in rows
        }

    def vacuum(self, conn: Conn, table: ClaimTable) -> None:
        """VACUUM needs a connection in autocommit mode outside any transaction."""
        self._dicts(conn, _VACUUM[table], None, "vacuum")

    def job_prune_preview(
        self,
        conn: Conn,
        *,
        older_than: float,
        statuses: Sequence[JobStatus],
        now: datetime | None = None,
    ) -> list[PruneCandidates]:
        params = {"older_than": older_than, "statuses": list(statuses), "now": now}
        return self._typed(conn, "job_prune_preview", params, PruneCandidates, "preview prune")

    # -- history ------------------------------------------------------------------------

    def history_move(
        self, conn: Conn, *, hot_retention: float, batch: int, now: datetime | None = None
    ) -> Moved:
        params = {"hot_retention": hot_retention, "batch": batch, "now": now}
        return self._typed(conn, "history_move", params, Moved, "move history")[0]

    def history_mover_state(self, conn: Conn) -> DictRow:
        return self._dicts(conn, "history_mover_state", {}, "read mover state")[0]

    def history_mover_record(self, conn: Conn, *, batch: int, timeouts: int) -> None:
        params = {"batch": batch, "timeouts": timeouts}
        self._dicts(conn, "history_mover_record", params, "record mover state")

    def history_ensure_partitions(
        self, conn: Conn, *, ahead: int, now: datetime | None = None
    ) -> list[str]:
        rows = self._dicts(
            conn, "history_ensure_partitions", {"ahead": ahead, "now": now}, "create partitions"
        )
        return [r["created"] for r in rows]

    def history_expire_step(
        self, conn: Conn, *, batch: int, now: datetime | None = None
    ) -> ExpireStep | None:
        params = {"batch": batch, "now": now}
        rows = self._typed(conn, "history_expire_step", params, ExpireStep, "expire history")
        return rows[0] if rows else None

    def history_ledger_expire(self, conn: Conn, *, batch: int, now: datetime | None = None) -> int:
        params = {"batch": batch, "now": now}
        return int(
            self._dicts(conn, "history_ledger_expire", params, "expire ledger")[0]["deleted"]
        )

    def history_retention_list(self, conn: Conn) -> list[RetentionRule]:
        return self._typed(conn, "history_retention_list", {}, RetentionRule, "read retention")

    def history_retention_set(
        self, conn: Conn, *, queue: str, status: JobStatus, keep_days: int
    ) -> None:
        params = {"queue": queue, "status": status, "keep_days": keep_days}
        self._dicts(conn, "history_retention_set", params, "set retention")

    def history_retention_unset(self, conn: Conn, *, queue: str, status: JobStatus) -> bool:
        params = {"queue": queue, "status": status}
        return bool(self._dicts(conn, "history_retention_unset", params, "unset retention"))

    def history_ledger_retention_set(self, conn: Conn, *, keep_days: int) -> None:
        params = {"keep_days": keep_days}
        self._dicts(conn, "history_ledger_retention_set", params, "set ledger retention")

    def history_counts(
        self, conn: Conn, *, since: float, queue: str | None, now: datetime | None = None
    ) -> list[FinishedCount]:
        params = {"since": since, "queue": queue, "now": now}
        return self._typed(conn, "history_counts", params, FinishedCount, "count history")

    def history_waiting(self, conn: Conn, *, hot_retention: float) -> DictRow:
        params = {"hot_retention": hot_retention}
        return self._dicts(conn, "history_waiting", params, "count finished jobs")[0]

    def job_whereabouts(self, conn: Conn, job_id: int) -> JobWhereabouts | None:
        rows = self._typed(conn, "job_whereabouts", {"id": job_id}, JobWhereabouts, "show job")
        return rows[0] if rows else None

    def job_attempts_anywhere(self, conn: Conn, job_id: int) -> list[AttemptRecord]:
        return self._typed(
            conn, "job_attempts_anywhere", {"id": job_id}, AttemptRecord, "list attempts"
        )

    # -- workers ------------------------------------------------------------------------

    def worker_upsert(
        self,
        conn: Conn,
        *,
        worker_id: str,
        pod: str | None,
        node: str | None,
        queues: Sequence[str],
        concurrency: int,
        state: WorkerState,
        in_flight: int,
        startup_seconds: float | None = None,
        job_types: Sequence[str] | None = None,
        boot_at: datetime | None = None,
        now: datetime | None = None,
    ) -> None:
        self._dicts(
            conn,
            "worker_upsert",
            {
                "worker_id": worker_id,
                "pod": pod,
                "node": node,
                "queues": list(queues),
                "concurrency": concurrency,
                "state": state,
                "in_flight": in_flight,
                "startup_seconds": startup_seconds,
                "job_types": None if job_types is None else list(job_types),
                "boot_at": boot_at,
                "now": now,
            },
            "register worker",
        )

    def worker_terminated(
        self, conn: Conn, *, pod: str, node: str, finished_at: datetime
    ) -> list[str]:
        rows = self._dicts(
            conn,
            "worker_terminated",
            {"pod": pod, "node": node, "finished_at": finished_at},
            "find terminated workers",
        )
        return [str(r["worker_id"]) for r in rows]

    def worker_delete(self, conn: Conn, worker_id: str) -> bool:
        return bool(self._dicts(conn, "worker_delete", {"worker_id": worker_id}, "remove worker"))

    def worker_list(
        self, conn: Conn, *, queues: Sequence[str] | None = None, now: datetime | None = None
    ) -> list[WorkerRecord]:
        return self._typed(
            conn,
            "worker_list",
            {"queues": list(queues) if queues else None, "now": now},
            WorkerRecord,
            "list workers",
        )

    def worker_prune_stale(
        self, conn: Conn, *, older_than: float, now: datetime | None = None
    ) -> list[str]:
        rows = self._dicts(
            conn, "worker_prune_stale", {"older_than": older_than, "now": now}, "prune workers"
        )
        return [str(r["worker_id"]) for r in rows]

    # -- leader lease -------------------------------------------------------------------

    def leader_acquire(
        self,
        conn: Conn,
        *,
        name: str,
        holder: str,
        term: int,
        ttl: float,
        kind: LeaderKind,
        now: datetime | None = None,
    ) -> LeaderTerm | None:
        """The term held; None when someone else holds the lease (or, for a worker, when an
        operator or reaper held it last)."""
        rows = self._dicts(
            conn,
            "leader_acquire",
            {
                "name": name,
                "holder": holder,
                "term": term,
                "ttl": ttl,
                "kind": kind.value,
                "now": now,
            },
            "acquire leadership",
        )
        return LeaderTerm(int(rows[0]["term"]), rows[0]["expires_at"]) if rows else None

    def leader_holder(
        self, conn: Conn, *, name: str, now: datetime | None = None
    ) -> LeaseHolder | None:
        rows = self._dicts(conn, "leader_holder", {"name": name, "now": now}, "read leadership")
        if not rows:
            return None
        row = rows[0]
        return LeaseHolder(
            holder=str(row["holder"]),
            kind=LeaderKind(row["holder_kind"]),
            term=int(row["term"]),
            expires_at=row["expires_at"],
            live=bool(row["live"]),
        )

    def leader_release(self, conn: Conn, *, name: str, holder: str, term: int) -> bool:
        return bool(
            self._dicts(
                conn,
                "leader_release",
                {"name": name, "holder": holder, "term": term},
                "release leadership",
            )
        )

    def leader_pass_bounds(self, conn: Conn, *, seconds: float) -> None:
        """Bound the current transaction (idle, statement and lock waits) to ``seconds``."""
        self._dicts(conn, "leader_pass_bounds", {"ms": max(1, round(seconds * 1000))}, "reap")

    def leader_reap_lock(
        self, conn: Conn, *, name: str, holder: str, term: int, now: datetime | None = None
    ) -> bool:
        """Try the reaper's transaction-scoped advisory lock (call inside a transaction);
        True only if it was taken and ``holder`` still leads ``name`` in ``term``."""
        row = self._dicts(
            conn,
            "leader_reap_lock",
            {"name": name, "holder": holder, "term": term, "now": now},
            "lock reaper",
        )[0]
        return bool(row["locked"] and row["leading"])

    # -- migrations ---------------------------------------------------------------------

    def migration_lock(self, conn: Conn) -> None:
        self._dicts(conn, "migration_lock", {}, "migrate")

    def migration_unlock(self, conn: Conn) -> None:
        self._dicts(conn, "migration_unlock", {}, "migrate")

    def migration_bootstrap(self, conn: Conn) -> None:
        self._dicts(conn, "migration_bootstrap", None, "migrate")

    def migration_schema_exists(self, conn: Conn) -> bool:
        return bool(self._dicts(conn, "migration_schema_exists", {}, "migrate")[0]["present"])

    def migration_server(self, conn: Conn) -> tuple[int, str, str]:
        """The server's version number (150004 for 15.4), its version as it reports it, and
        the database's encoding."""
        row = self._dicts(conn, "migration_server", {}, "migrate")[0]
        # On SQL_ASCII, the very answers come back as bytes.
        version, encoding = (
            value.decode("ascii") if isinstance(value, bytes) else str(value)
            for value in (row["version"], row["encoding"])
        )
        return int(row["version_num"]), version, encoding

    def migration_applied(self, conn: Conn) -> dict[int, str]:
        rows = self._dicts(conn, "migration_applied", {}, "migrate")
        return {int(r["version"]): str(r["name"]) for r in rows}

    def migration_record(self, conn: Conn, *, version: int, name: str) -> None:
        self._dicts(conn, "migration_record", {"version": version, "name": name}, "migrate")

    def grants_apply(
        self, conn: Conn, *, worker: str | None, operator: str | None, producer: str | None
    ) -> list[str]:
        rows = self._dicts(
            conn,
            "grants_apply",
            {"worker": worker, "operator": operator, "producer": producer},
            "grant",
        )
        return [str(r["statement"]) for r in rows]

    def grants_reapply(self, conn: Conn) -> list[str]:
        """Every statement that granted the registered roles this version's privileges."""
        return [str(r["statement"]) for r in self._dicts(conn, "grants_reapply", None, "grant")]

    def migration_apply(self, conn: Conn, script: bytes) -> None:
        """Run one migration file's statements (the caller holds the transaction)."""
        self._execute_text(conn, script, "migrate")

    # -- worker runtime (sql/queries/worker.sql) -------------------------------------------

    def worker_session(self, conn: Conn) -> None:
        """Tune a worker's session: generic plans for its prepared statements, and JSON
        decoded from text (json.loads on bytes first detects their encoding, in Python, for
        every payload claimed: PostgreSQL sends UTF-8)."""
        self._dicts(conn, "worker_session", None, "configure session")
        set_json_loads(_utf8_json, conn)

    def server_identity(self, conn: Conn) -> tuple[str, int | None]:
        """The cluster's system identifier and failover epoch (None on a standby) of the
        server ``conn`` reached."""
        (row,) = self._dicts(conn, "server_identity", None, "identify the server")
        return str(row["system_identifier"]), row["epoch"]

    def worker_listen(self, conn: Conn) -> None:
        """Subscribe ``conn`` (autocommit, dedicated) to wake-ups on channel leaseq_jobs."""
        self._dicts(conn, "worker_listen", {}, "listen")

    # -- producers waiting for results -----------------------------------------------------

    def waiter_listen(self, conn: Conn) -> None:
        """Subscribe ``conn`` (autocommit, dedicated) to completions on channel leaseq_done."""
        self._dicts(conn, "waiter_listen", {}, "listen")

    def job_watch(self, conn: Conn, ids: Sequence[int]) -> None:
        """Flag each unfinished job among ``ids`` so its final transition notifies. Run it in
        autocommit: once it returns, a completion either saw the flag or had committed
        before (then the next read sees the job finished)."""
        self._dicts(conn, "job_watch", {"ids": list(ids)}, "wait")

    def job_outcomes(self, conn: Conn, ids: Sequence[int]) -> dict[int, JobOutcome]:
        """Where each existing job among ``ids`` stands, by id."""
        rows = self._dicts(conn, "job_outcomes", {"ids": list(ids)}, "wait")
        return {int(r["id"]): outcome(r) for r in rows}

    # -- pipelines (sql/queries/pipelines.sql) ------------------------------------------

    def deps_lock_parents(self, conn: Conn, ids: Sequence[int]) -> list[DictRow]:
        """Existing parents, marked and row-locked: ``id``, ``status``, ``pipeline_id`` and
        ``queue``."""
        return self._dicts(conn, "deps_lock_parents", {"ids": list(ids)}, "enqueue")

    def lease_spawn_lock(
        self, conn: Conn, lease: Lease, parents: Sequence[int], now: datetime | None = None
    ) -> list[DictRow] | None:
        """A fan-out's first half: the existing ``parents`` of the spawner's producer, marked
        and row-locked (``id``, ``status``, ``pipeline_id``, ``queue``; the spawner's own row
        not among them); None when ``lease`` does not hold (nothing is marked)."""
        params = {**_held(lease), "parents": list(parents), "now": now}
        rows = self._dicts(conn, "lease_spawn_lock", params, "spawn")
        if not any(r["id"] == lease.job_id for r in rows):
            return None
        return [r for r in rows if r["id"] != lease.job_id]

    def lease_spawn(
        self,
        conn: Conn,
        lease: Lease,
        name: str,
        jobs: Params,
        deps: Params,
        now: datetime | None = None,
    ) -> int | None:
        """A fan-out's second half: its jobs and edges (nodes named -1..-n in ``deps``) in the
        spawner's pipeline or a new one; the pipeline's id, None when ``lease`` does not hold."""
        params = {**jobs, **deps, **_held(lease), "name": name, "now": now}
        rows = self._dicts(conn, "lease_spawn", params, "spawn")
        return int(rows[0]["pipeline_id"]) if rows else None

    def job_ids_reserve(self, conn: Conn, n: int) -> list[int]:
        rows = self._dicts(conn, "job_ids_reserve", {"n": n}, "enqueue")
        return [int(r["id"]) for r in rows]

    def pipeline_create(
        self, conn: Conn, *, name: str, total: int, now: datetime | None = None
    ) -> int:
        """A new pipeline's id, owned by this login."""
        params = {"name": name, "total": total, "now": now}
        rows = self._dicts(conn, "pipeline_create", params, "enqueue")
        return int(rows[0]["id"])

    def pipeline_grow(self, conn: Conn, pipeline_id: int, n: int) -> bool:
        return bool(self._dicts(conn, "pipeline_grow", {"id": pipeline_id, "n": n}, "enqueue"))

    def graph_insert_jobs(self, conn: Conn, params: Params) -> None:
        self._dicts(conn, "graph_insert_jobs", params, "enqueue")

    def graph_insert_deps(self, conn: Conn, params: Params) -> None:
        self._dicts(conn, "graph_insert_deps", params, "enqueue")

    def queues_wake(self, conn: Conn, queues: Sequence[str]) -> None:
        self._dicts(conn, "queues_wake", {"queues": list(queues)}, "enqueue")

    def parent_results(
        self, conn: Conn, job_id: int, *, after_id: int, limit: int
    ) -> list[ParentResult]:
        return self._typed(
            conn,
            "parent_results",
            {"id": job_id, "after_id": after_id, "limit": limit},
            ParentResult,
            "read parent results",
        )

    def job_links(self, conn: Conn, job_id: int, *, limit: int) -> JobLinks | None:
        """A job's pipeline, parents and children (``limit`` of each); None if no such job."""
        rows = self._dicts(conn, "job_pipeline_state", {"id": job_id}, "show job")
        if not rows:
            return None
        params = {"id": job_id, "limit": limit + 1}
        parents = self._typed(conn, "job_parents", params, LinkedJob, "show job")
        children = self._typed(conn, "job_children", params, LinkedJob, "show job")
        return JobLinks(
            job_id=job_id,
            pipeline_id=rows[0]["pipeline_id"],
            deps_left=rows[0]["deps_left"],
            cancelled_by=rows[0]["cancelled_by"],
            parents=parents[:limit],
            children=children[:limit],
            more_parents=len(parents) > limit,
            more_children=len(children) > limit,
        )

    def pipeline_cancel(
        self, conn: Conn, pipeline_id: int, *, reason: str | None, now: datetime | None = None
    ) -> DictRow:
        rows = self._dicts(
            conn, "pipeline_cancel", {"id": pipeline_id, "reason": reason, "now": now}, "cancel"
        )
        return rows[0]

    def pipeline_get(self, conn: Conn, pipeline_id: int) -> PipelineRecord | None:
        rows = self._typed(
            conn, "pipeline_get", {"id": pipeline_id}, PipelineRecord, "show pipeline"
        )
        return rows[0] if rows else None

    def pipeline_sinks(self, conn: Conn, pipeline_id: int, *, limit: int) -> list[JobOutcome]:
        """Up to ``limit`` of the pipeline's sinks with their outcome, in id order (the newest
        ``limit`` when it has more)."""
        rows = self._dicts(conn, "pipeline_sinks", {"id": pipeline_id, "limit": limit}, "wait")
        return [outcome(r) for r in reversed(rows)]

    def job_pipeline_of(self, conn: Conn, job_id: int) -> tuple[bool, int | None]:
        """Whether the job exists, and its pipeline or the one its fan-out started."""
        rows = self._dicts(conn, "job_pipeline_of", {"id": job_id}, "wait")
        return (False, None) if not rows else (True, rows[0]["pipeline_id"])

    def pipeline_list(
        self, conn: Conn, *, before: int | None, unfinished: bool, limit: int
    ) -> list[PipelineRecord]:
        return self._typed(
            conn,
            "pipeline_list",
            {"before": before, "unfinished": unfinished, "limit": limit},
            PipelineRecord,
            "list pipelines",
        )

    def pipeline_jobs(
        self, conn: Conn, pipeline_id: int, *, after_id: int, limit: int
    ) -> list[DictRow]:
        return self._dicts(
            conn,
            "pipeline_jobs",
            {"id": pipeline_id, "after_id": after_id, "limit": limit},
            "show pipeline",
        )

    def queue_waiting(self, conn: Conn, *, queues: Sequence[str] | None) -> dict[str, int]:
        rows = self._dicts(
            conn, "queue_waiting", {"queues": None if queues is None else list(queues)}, "stats"
        )
        return {r["queue"]: int(r["waiting"]) for r in rows}
