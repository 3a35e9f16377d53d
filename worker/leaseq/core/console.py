"""The web console's face on the database: every read the console's pages make and its two
admin actions, each one short transaction under a statement timeout.

Everything here is bounded by construction (see sql/queries/console.sql): counts are capped
(:class:`Count` says when the cap was reached), lists are windows of an index, and the admin
actions go through SECURITY DEFINER functions that write their audit row in the same
transaction. What the console's role may do is the database's decision
(``leaseq.apply_console_grants``); a refusal surfaces as :class:`PermissionDenied`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from leaseq.core import validation
from leaseq.core._store.console import BulkAction, ConsoleStore, Row
from leaseq.core.db import Db, transaction
from leaseq.core.errors import InvalidJob
from leaseq.core.models import (
    SILENT_AFTER_SECONDS,
    JobStatus,
    StepRecord,
    is_silent,
    unsettled_reason,
)

#: Counts stop here: a queue with more shows ``1000+``.
COUNT_CAP = 1000
#: Held jobs the overview lists (it says when there may be more).
HELD_SHOWN = 50
#: Queues the overview shows at most (the most backed-up first).
OVERVIEW_QUEUES = 200
#: Queues the overview finds at most per source (pending, keyed, dead, waiting jobs), by a
#: skip scan of one probe per queue.
QUEUE_SCAN = 1000
#: Ready jobs counted per queue (per claim index) to rank the queues: beyond it, the oldest
#: ready job decides.
RANK_CAP = 100
#: Ids examined per jobs page: a filter that matches nothing costs one window.
JOBS_WINDOW = 5000
#: A pipeline's jobs looked at per page of its jobs filtered by state (each a heap fetch).
PIPELINE_WINDOW = 1000
#: Dead jobs looked at for a bulk retry's count and selection (index only: cheap).
BULK_SCAN = 10000
#: Pending jobs looked at for a bulk cancel's count (the claim index has no job type, so
#: each is a heap fetch).
PENDING_SCAN = 2000
#: Jobs one bulk action changes at most (the admin functions refuse more).
BULK_LIMIT = 1000
#: Parents or children shown per page of a job's links.
LINKS_PAGE = 50
#: Steps shown per page of a job's durable steps.
STEPS_PAGE = 50
#: A job's stream items counted at most: a longer stream shows as ``1000+``.
STREAM_CAP = 1000
#: A job's document (payload, progress, result, checkpoint) larger than this as JSON text is
#: not loaded by its page (only said to be larger): a page's time and memory must not grow
#: with what a producer wrote.
DOCUMENT_BYTES = 64 * 1024


@dataclass(frozen=True)
class Count:
    """A count that stopped at ``cap``: ``capped`` means there are more than ``value``."""

    value: int
    capped: bool = False

    def __str__(self) -> str:
        return f"{self.value}+" if self.capped else str(self.value)

    @classmethod
    def of(cls, value: int, cap: int) -> Count:
        return cls(cap, True) if value > cap else cls(value, False)


@dataclass(frozen=True)
class QueuePanel:
    """One queue on the overview."""

    queue: str
    ready: Count
    scheduled: Count
    running: int
    dead: Count
    #: Jobs waiting for their parents (a pipeline), from jobs_waiting_idx.
    waiting: Count
    oldest_ready_age: float | None
    oldest_heartbeat_age: float | None
    workers: int
    in_flight: int


@dataclass(frozen=True)
class Overview:
    """The overview's panels, most backed-up queue first, and how many queues were found
    (``found``: at least that many exist; each source of queues is scanned up to
    :data:`QUEUE_SCAN`)."""

    panels: list[QueuePanel]
    found: int
    #: Jobs held at an uncertain step (oldest first, at most :data:`HELD_SHOWN`): each
    #: waits for a human to settle its step.
    held: list[Row]

    @property
    def cut(self) -> bool:
        """Whether some queues found are not shown."""
        return self.found > len(self.panels)


@dataclass(frozen=True)
class RoleInfo:
    """The console's database role and the admin actions the database lets it take."""

    role: str
    can_retry: bool
    can_cancel: bool
    jobs_estimate: int
    can_cancel_pipeline: bool = False
    can_resolve_step: bool = False

    @property
    def read_only(self) -> bool:
        return not (
            self.can_retry or self.can_cancel or self.can_cancel_pipeline or self.can_resolve_step
        )


@dataclass(frozen=True)
class RolePower:
    """What would put the console's role above every policy and grant."""

    role: str
    superuser: bool
    bypassrls: bool
    owns_tables: bool

    @property
    def reasons(self) -> list[str]:
        """Why no policy or grant would hold this role (empty: an ordinary role)."""
        found = []
        if self.superuser:
            found.append("is a superuser")
        if self.bypassrls:
            found.append("has BYPASSRLS")
        # A superuser is a member of every role: saying so again adds nothing.
        if self.owns_tables and not self.superuser:
            found.append("owns leaseq's tables (or is a member of their owner)")
        return found


@dataclass(frozen=True)
class JobFilter:
    """The jobs page's filters (None: any)."""

    status: JobStatus | None = None
    queue: str | None = None
    job_type: str | None = None
    error_code: str | None = None
    key: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None


@dataclass(frozen=True)
class JobsPage:
    """One window of the jobs list: its rows, newest first, and the cursor of the next
    (older) window, None at the oldest job."""

    rows: list[Row]
    before: int | None
    next_before: int | None
    window: int


@dataclass(frozen=True)
class JobLinks:
    """A job's place in a pipeline: its pipeline, the job whose failure cancelled it, and one
    keyset page each of its parents and children (``*_next``: the cursor of the next page,
    None at the last)."""

    pipeline_id: int | None
    cancelled_by: int | None
    deps_left: int
    parents: list[Row]
    parents_next: int | None
    children: list[Row]
    children_next: int | None


@dataclass(frozen=True)
class JobSteps:
    """One keyset page of a job's durable steps (names after ``after``, in name order; each
    row's ``state`` is recorded, running, uncertain or not started, its ``result`` None and
    ``result_large`` true when over :data:`DOCUMENT_BYTES`), the cursor of the next page
    (None: this was the last), the size of the job's stream, the name of its uncertain
    step (None: none), wherever it is in name order, and the signal the job waits for
    (``ctx.wait_for``) and since when (None: it waits for none)."""

    rows: list[Row]
    after: str
    next_after: str | None
    stream_items: Count
    stream_last: int | None
    uncertain: str | None
    waiting_for: str | None = None
    waiting_since: datetime | None = None


@dataclass(frozen=True)
class PipelineJobs:
    """One keyset page of a pipeline's jobs in the hot table (ids above ``after``, of
    ``status`` or all), and the cursor of the next page (None: this was the last)."""

    rows: list[Row]
    after: int
    next_after: int | None
    status: JobStatus | None = None


#: Jobs counted per flow key (ready, running of an unlimited key) or blocked aggregate
#: (waiting behind its head) before the count shows as ``N+``.
FLOW_CAP = 1000

#: Holders of a key's units the Flow page names (the longest silent first); the rest are
#: counted.
HOLDERS_SHOWN = 20

#: A keyset cursor over flow rows: (queue, key or pattern or ordering key).
FlowCursor = tuple[str, str]


@dataclass(frozen=True)
class FlowList:
    """One keyset page of flow rows in (queue, key) order after ``after``, and the cursor of
    the next page (None: this was the last)."""

    rows: list[Row]
    after: FlowCursor | None
    next_after: FlowCursor | None


@dataclass(frozen=True)
class FlowPage:
    """What the Flow page shows: limits, keys with work (``running``/``ready`` as
    :class:`Count`, ``saturated`` when a limited key has no free unit; ``holders``: who
    holds its units, at most :data:`HOLDERS_SHOWN`, the longest silent first, each with
    ``silent`` by :func:`leaseq.core.models.is_silent`; ``held_silent``: how many of its
    units silent workers hold) and aggregates blocked by a dead head (``waiting`` as
    :class:`Count`)."""

    limits: FlowList
    keys: FlowList
    blocked: FlowList


@dataclass(frozen=True)
class BulkSelection:
    """The jobs a bulk action would change: matched among ``scanned`` looked at (``capped``:
    the scan stopped at its bound, so more may match beyond it), and their ids (at most
    :data:`BULK_LIMIT`)."""

    matched: int
    scanned: int
    capped: bool
    ids: list[int] = field(default_factory=list)

    def describe(self) -> str:
        more = "+" if self.capped else ""
        return f"{self.matched}{more}"


class Console:
    """The console's reads and actions, over one connection or a pool."""

    def __init__(self, db: Db, *, timeout: float = 5.0) -> None:
        validation.positive("timeout", timeout)
        self._db = db
        self._store = ConsoleStore()
        self._timeout = timeout

    def _tx(self, action: str) -> Any:
        return transaction(self._db, action)

    def role(self) -> RoleInfo:
        with self._tx("console") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            row = self._store.console_role(c)
        return RoleInfo(
            row["role"],
            row["can_retry"],
            row["can_cancel"],
            row["jobs_estimate"],
            row["can_cancel_pipeline"],
            row["can_resolve_step"],
        )

    def power(self) -> RolePower:
        """Whether the console's role is one no policy or grant holds (start-up check)."""
        with self._tx("console: check role") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            row = self._store.console_privileges(c)
        return RolePower(row["role"], row["superuser"], row["bypassrls"], row["owns_tables"])

    def overview(self, *, limit: int = OVERVIEW_QUEUES, now: datetime | None = None) -> Overview:
        """The most backed-up queues with work, workers or a schedule (at most ``limit``),
        one panel each, how many queues were found, and the jobs held at an uncertain step
        (:class:`Overview`)."""
        validation.at_least("limit", limit, 1)
        panels = []
        with self._tx("console: overview") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            queues, found = self._store.console_queues(
                c, limit=limit, scan=QUEUE_SCAN, rank_cap=RANK_CAP, now=now
            )
            for queue in queues:
                r = self._store.console_queue_panel(
                    c, queue=queue, cap=COUNT_CAP, live_seconds=SILENT_AFTER_SECONDS, now=now
                )
                panels.append(
                    QueuePanel(
                        queue=queue,
                        ready=Count.of(r["ready"], COUNT_CAP),
                        scheduled=Count.of(r["scheduled"], COUNT_CAP),
                        running=r["running"],
                        dead=Count.of(r["dead"], COUNT_CAP),
                        waiting=Count.of(r["waiting"], COUNT_CAP),
                        oldest_ready_age=r["oldest_ready_age"],
                        oldest_heartbeat_age=r["oldest_heartbeat_age"],
                        workers=r["workers"],
                        in_flight=r["in_flight"],
                    )
                )
            held = self._store.console_held(c, limit=HELD_SHOWN)
        return Overview(panels, found, held)

    def jobs(
        self,
        filters: JobFilter,
        *,
        before: int | None = None,
        limit: int = 50,
        window: int = JOBS_WINDOW,
    ) -> JobsPage:
        """One window of ids below ``before`` (from the newest job when None), newest first."""
        validation.at_least("limit", limit, 1)
        validation.at_least("window", window, 1)
        with self._tx("console: jobs") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            low, high = self._store.console_id_bounds(c)
            if high is None or low is None:
                return JobsPage([], before, None, window)
            start = high + 1 if before is None else before
            params = {
                "before": start,
                "window": window,
                "limit": limit,
                "status": None if filters.status is None else str(filters.status),
                "queue": filters.queue,
                "job_type": filters.job_type,
                "error_code": filters.error_code,
                "key": filters.key,
                "created_from": filters.created_from,
                "created_to": filters.created_to,
            }
            rows = self._store.console_jobs(c, params)
            if len(rows) == limit:
                next_before: int | None = int(rows[-1]["id"])
            else:
                below = self._store.console_id_below(c, before=start - window)
                next_before = None if below is None else below + 1
        if next_before is not None and next_before <= low:
            next_before = None
        return JobsPage(rows, before, next_before, window)

    def job(self, job_id: int, *, attempts: int = 200) -> tuple[Row | None, list[Row]]:
        """One job wherever it is, and its attempt timeline (None, [] when unknown). A
        document larger than :data:`DOCUMENT_BYTES` is None, its ``<name>_large`` true."""
        with self._tx("console: job") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            job = self._store.console_job(c, job_id=job_id, max_bytes=DOCUMENT_BYTES)
            timeline = (
                self._store.console_job_attempts(c, job_id=job_id, limit=attempts) if job else []
            )
        return job, timeline

    def job_steps(self, job_id: int, *, after: str = "", limit: int = STEPS_PAGE) -> JobSteps:
        """A keyset page of the job's durable steps and its stream's size (:class:`JobSteps`),
        in one transaction; a job that left the hot table has neither (they go with it)."""
        validation.at_least("limit", limit, 1)
        with self._tx("console: job steps") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            rows = self._store.console_job_steps(
                c, job_id=job_id, after=after, limit=limit + 1, max_bytes=DOCUMENT_BYTES
            )
            facts = self._store.console_job_step_facts(c, job_id=job_id, cap=STREAM_CAP)
        next_after = str(rows[limit - 1]["name"]) if len(rows) > limit else None
        return JobSteps(
            rows[:limit],
            after,
            next_after,
            Count.of(int(facts["stream_items"]), STREAM_CAP),
            facts["stream_last"],
            facts["uncertain"],
            facts["waiting_for"],
            facts["waiting_since"],
        )

    def dead(
        self,
        *,
        queue: str | None = None,
        job_type: str | None = None,
        error_code: str | None = None,
        limit: int = 100,
        scan: int = BULK_SCAN,
    ) -> tuple[list[Row], BulkSelection]:
        """The newest dead jobs matching the filters (among the newest ``scan`` dead jobs)."""
        params = {
            "queue": queue,
            "job_type": job_type,
            "error_code": error_code,
            "limit": limit,
            "scan": scan,
        }
        with self._tx("console: dead jobs") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            rows = self._store.console_dead(c, params)
            if rows:
                matched, scanned = int(rows[0]["matched"]), int(rows[0]["scanned"])
            else:
                counted = self._store.console_dead_count(c, params)
                matched, scanned = int(counted["matched"]), int(counted["scanned"])
        selection = BulkSelection(matched, scanned, scanned >= scan, [int(r["id"]) for r in rows])
        return rows, selection

    def select_dead(
        self,
        *,
        queue: str | None,
        job_type: str | None,
        error_code: str | None,
        scan: int = BULK_SCAN,
    ) -> BulkSelection:
        """The dead jobs a bulk retry by these filters takes (at most :data:`BULK_LIMIT`)."""
        _, selection = self.dead(
            queue=queue, job_type=job_type, error_code=error_code, limit=BULK_LIMIT, scan=scan
        )
        return selection

    def select_pending(
        self, *, queue: str, job_type: str | None, scan: int = PENDING_SCAN
    ) -> BulkSelection:
        """The pending jobs of ``queue`` a bulk cancel by these filters takes (at most
        :data:`BULK_LIMIT`, in claim order, among the first ``scan``)."""
        if not queue:
            raise InvalidJob("queue", "a bulk cancel needs a queue")
        params = {"queue": queue, "job_type": job_type, "scan": scan, "limit": BULK_LIMIT}
        with self._tx("console: pending jobs") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            row = self._store.console_pending(c, params)
        scanned = int(row["scanned"])
        return BulkSelection(int(row["matched"]), scanned, scanned >= scan, list(row["ids"]))

    def retry_dead(
        self,
        ids: Sequence[int],
        *,
        actor: str,
        reason: str,
        filter: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Retry these dead jobs (those still dead) and audit it, in one transaction."""
        return self._bulk(BulkAction.RETRY_DEAD, ids, actor, reason, filter)

    def cancel(
        self,
        ids: Sequence[int],
        *,
        actor: str,
        reason: str,
        filter: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Cancel these jobs (those still pending or running) and audit it, in one
        transaction."""
        return self._bulk(BulkAction.CANCEL, ids, actor, reason, filter)

    def _bulk(
        self,
        action: BulkAction,
        ids: Sequence[int],
        actor: str,
        reason: str,
        filter: Mapping[str, Any] | None,
    ) -> list[int]:
        """One audited bulk action, checked first, in one transaction of its own."""
        _check_action(ids, actor, reason)
        with self._tx(action.label) as c:
            self._store.console_bounds(c, seconds=self._timeout)
            return self._store.console_bulk(
                c, action=action, ids=ids, actor=actor, reason=reason, filter=filter
            )

    def resolve_step(
        self, job_id: int, step: str, *, result: Any = None, retry: bool, actor: str, reason: str
    ) -> bool:
        """Settle the uncertain step ``step`` of held job ``job_id`` as ``leaseq steps
        resolve`` does (the same statement: record ``result``, or with ``retry`` run the step
        again; the job goes back to pending with a fresh budget of attempts) and audit it, in
        one transaction. False when the job was not (or no longer) held at an uncertain step
        of that name: nothing settled, the audit says so. InvalidJob, before anything is
        written, for a blank actor or reason or a result that is no JSON of at most 1 MiB."""
        _check_action([job_id], actor, reason)
        result, actor, reason = validation.step_resolution(
            step, result, retry=retry, actor=actor, reason=reason
        )
        with self._tx("console: resolve step") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            return self._store.console_resolve_step(
                c, job_id=job_id, step=step, result=result, retry=retry, actor=actor, reason=reason
            )

    def step_unsettled(self, job_id: int, step: str) -> str:
        """Why :meth:`resolve_step` settled nothing, read now, as the CLI says it: the job
        does not exist, has no step ``step``, the step is not uncertain, or the job is not
        held. ("" when the step could be settled now: it became so meanwhile.)"""
        with self._tx("console: job step") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            row = self._store.console_job_step_state(c, job_id=job_id, name=step)
        if row is None:
            return f"job {job_id} does not exist"
        found = None
        if row["name"] is not None:
            found = StepRecord(
                **{k: row[k] for k in StepRecord.__dataclass_fields__ if k != "result"},
                result=None,
            )
        settleable = row["status"] in (JobStatus.HELD, JobStatus.DEAD)
        if found is not None and found.intended and settleable:
            return ""
        return f"job {job_id} {unsettled_reason(step, str(row['status']), found)}"

    def job_links(
        self,
        job_id: int,
        *,
        parents_after: int = 0,
        children_after: int = 0,
        limit: int = LINKS_PAGE,
    ) -> JobLinks | None:
        """A job's pipeline, ``cancelled_by``, and a keyset page of its parents and children
        (None when the job is nowhere)."""
        validation.at_least("limit", limit, 1)
        with self._tx("console: job links") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            row = self._store.console_job_links(c, job_id=job_id)
            if row is None:
                return None
            parents = self._store.console_job_parents(
                c, job_id=job_id, after=parents_after, limit=limit + 1
            )
            children = (
                self._store.console_job_children(
                    c, job_id=job_id, after=children_after, limit=limit + 1
                )
                if row["has_children"]
                else []
            )

        def page(rows: list[Row]) -> tuple[list[Row], int | None]:
            if len(rows) > limit:
                return rows[:limit], int(rows[limit - 1]["job_id"])
            return rows, None

        shown_parents, parents_next = page(parents)
        shown_children, children_next = page(children)
        return JobLinks(
            row["pipeline_id"],
            row["cancelled_by"],
            int(row["deps_left"] or 0),
            shown_parents,
            parents_next,
            shown_children,
            children_next,
        )

    def pipelines(
        self, *, before: int | None = None, unfinished: bool = False, limit: int = 50
    ) -> tuple[list[Row], int | None]:
        """A keyset page of pipelines, newest first, below id ``before``; and the cursor of
        the next (older) page, None at the oldest."""
        validation.at_least("limit", limit, 1)
        with self._tx("console: pipelines") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            rows = self._store.console_pipelines(
                c, before=before, unfinished=unfinished, limit=limit + 1
            )
        if len(rows) > limit:
            return rows[:limit], int(rows[limit - 1]["id"])
        return rows, None

    def pipeline(
        self,
        pipeline_id: int,
        *,
        after: int = 0,
        status: JobStatus | None = None,
        limit: int = 100,
        window: int = PIPELINE_WINDOW,
    ) -> tuple[Row | None, PipelineJobs]:
        """A pipeline's counters and one keyset page of its jobs in the hot table, finished or
        not (ids above ``after``, in id order, of ``status`` or all). A page looks at most
        ``window`` of the pipeline's jobs: a rare status costs one window, never the
        pipeline; an empty page with a cursor means none matched in that window."""
        validation.at_least("limit", limit, 1)
        validation.at_least("window", window, 1)
        with self._tx("console: pipeline") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            row = self._store.console_pipeline(c, pipeline_id=pipeline_id)
            found = (
                self._store.console_pipeline_jobs(
                    c,
                    pipeline_id=pipeline_id,
                    after=after,
                    status=None if status is None else str(status),
                    window=window,
                    limit=limit + 1,
                )
                if row is not None
                else []
            )
        jobs = [r for r in found if r["id"] is not None]
        if len(jobs) > limit:
            return row, PipelineJobs(jobs[:limit], after, int(jobs[limit - 1]["id"]), status)
        full = bool(found) and int(found[0]["looked"]) == window
        return row, PipelineJobs(jobs, after, int(found[0]["looked_to"]) if full else None, status)

    def cancel_pipeline(self, pipeline_id: int, *, actor: str, reason: str) -> tuple[int, int]:
        """Cancel every unfinished job of the pipeline (as ``leaseq pipelines cancel``) and
        audit it, in one transaction; returns how many were cancelled and how many of those
        were running (their holders are fenced)."""
        _check_action([], actor, reason)
        with self._tx("console: cancel pipeline") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            row = self._store.console_cancel_pipeline(
                c, pipeline_id=pipeline_id, actor=actor, reason=reason
            )
        return int(row["cancelled"]), int(row["running"])

    def flow(
        self,
        *,
        queue: str | None = None,
        limits_after: FlowCursor | None = None,
        keys_after: FlowCursor | None = None,
        blocked_after: FlowCursor | None = None,
        limit: int = 100,
        now: datetime | None = None,
    ) -> FlowPage:
        """Flow control, read-only: one keyset page each of the limits, the keys with work
        and the blocked aggregates (of ``queue``, or all), in one transaction. Counts over
        jobs stop at :data:`FLOW_CAP`."""
        validation.at_least("limit", limit, 1)

        def params(after: FlowCursor | None) -> dict[str, Any]:
            q, k = after or ("", "")
            return {
                "queue": queue, "after_queue": q, "after_key": k, "limit": limit + 1,
                "cap": FLOW_CAP, "now": now,
            }  # fmt: skip

        def page(rows: list[Row], after: FlowCursor | None, column: str) -> FlowList:
            if len(rows) > limit:
                last = rows[limit - 1]
                return FlowList(rows[:limit], after, (str(last["queue"]), str(last[column])))
            return FlowList(rows, after, None)

        with self._tx("console: flow") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            limits = self._store.console_flow_limits(c, params(limits_after))
            keys = self._store.console_flow_keys(c, params(keys_after))
            shown = keys[:limit]
            holders = self._store.console_flow_holders(
                c,
                {
                    "queues": [k["queue"] for k in shown], "keys": [k["key"] for k in shown],
                    "per_key": HOLDERS_SHOWN, "live_seconds": SILENT_AFTER_SECONDS, "now": now,
                },
            )  # fmt: skip
            blocked = self._store.console_flow_blocked(c, params(blocked_after))
        by_key: dict[tuple[str, str], list[Row]] = {}
        for h in holders:
            by_key.setdefault((h["queue"], h["key"]), []).append(
                {**h, "silent": is_silent(h["heartbeat_age"])}
            )
        for row in keys:
            row["ready"] = Count.of(int(row["ready"]), FLOW_CAP)
            row["running"] = Count.of(int(row["running"]), FLOW_CAP)
            row["holders"] = by_key.get((row["queue"], row["key"]), [])
            row["held_silent"] = int(row["holders"][0]["held_silent"]) if row["holders"] else 0
        for row in blocked:
            row["waiting"] = Count.of(int(row["waiting"]), FLOW_CAP)
        return FlowPage(
            page(limits, limits_after, "key_pattern"),
            page(keys, keys_after, "key"),
            page(blocked, blocked_after, "ordering_key"),
        )

    def workers(self, *, limit: int = 500, now: datetime | None = None) -> list[Row]:
        """Registered workers (at most ``limit``), each with ``silent`` by the rule
        ``leaseq status`` applies (:func:`leaseq.core.models.is_silent`)."""
        with self._tx("console: workers") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            rows = self._store.console_workers(c, limit=limit, now=now)
        return [{**r, "silent": is_silent(r["heartbeat_age"])} for r in rows]

    def schedules(self, *, limit: int = 500) -> list[Row]:
        with self._tx("console: schedules") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            return self._store.console_schedules(c, limit=limit)

    def audit(self, *, limit: int = 50) -> list[Row]:
        with self._tx("console: audit") as c:
            self._store.console_bounds(c, seconds=self._timeout)
            return self._store.console_audit(c, limit=limit)


def _check_action(ids: Sequence[int], actor: str, reason: str) -> None:
    if len(ids) > BULK_LIMIT:
        raise InvalidJob("ids", f"at most {BULK_LIMIT} jobs per action, {len(ids)} given")
    if not actor.strip():
        raise InvalidJob("actor", "an action needs the name of who takes it")
    if not reason.strip():
        raise InvalidJob("reason", "say why (it goes into leaseq.console_audit)")
