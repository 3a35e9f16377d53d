"""Durable steps of a handler (``ctx.step``): each runs once and its JSON result is recorded,
so a later attempt of the job resumes after its last recorded step.

Before a step's function runs, its intent (attempt, lease token, time) is committed; after,
its result. Both are fenced by the attempt's lease in one statement each (queries/steps.sql),
so a stale attempt records nothing. An attempt that finds an intent without a result knows
the step's effect may have happened: it reconciles (``reconcile=check``), repeats under the
same key (``idempotent=True``), or stops the job as uncertain for an operator to settle
(``leaseq steps resolve``). docs/concepts/steps.md says what this guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import json
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar, cast

from leaseq.core import tracing
from leaseq.core.errors import InvalidJob, LeaseqError
from leaseq.core.models import Lease, StepRecord
from leaseq.core.validation import MAX_STEP_NAME
from leaseq.runtime.handler_errors import Interrupted, PermanentError, Suspended

T = TypeVar("T")


class NotDone(Exception):
    """Raise from a step's ``reconcile`` check when the step's effect did not happen: the
    step's function then runs again."""


class StepUncertain(PermanentError):
    """A step has an intent and no recorded result, and neither ``reconcile`` nor
    ``idempotent`` says how to find out whether its effect happened: the job is held
    with ``last_error_code`` ``StepUncertain`` until an operator settles the step."""

    def __init__(self, job_id: int, intent: Intent) -> None:
        super().__init__(
            f"step {intent.step!r} is uncertain: attempt {intent.attempt} committed to run it"
            f" at {intent.intended_at:%Y-%m-%d %H:%M:%S%z} and recorded no result, and the"
            " step has neither reconcile= nor idempotent=True, so it is not run again."
            f" Settle it: leaseq steps resolve {job_id} {intent.step} --result JSON"
            " (what the effect was) or --retry (it did not happen), with --reason"
        )
        self.intent = intent


class StepNameReused(PermanentError):
    """A handler ran two steps of one name in one attempt: a bug in the handler, which every
    retry would meet again, so the job goes to dead at once (``last_error_code``
    ``StepNameReused``), naming the step."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"step {name!r} ran already in this attempt: step names are unique per job;"
            " name the steps of a loop apart, e.g. f'page-{i}'"
        )
        self.step = name


@dataclass(frozen=True)
class Intent:
    """What an earlier attempt committed before running a step's function: handed to the
    step's ``reconcile`` check, which finds out whether the effect happened (by ``key``)."""

    job_id: int
    step: str
    #: The step's stable key (``ctx.step_key`` while it ran): the name to look it up by.
    key: str
    attempt: int
    lease_token: int
    intended_at: datetime


class StepOp(enum.StrEnum):
    """The store calls a step makes, a stream's append (``ctx.emit``) and a signal's read
    (``ctx.wait_for``): a child process asks its supervisor for each."""

    LIST = "list"
    INTEND = "intend"
    RECORD = "record"
    WITHDRAW = "withdraw"
    EMIT = "emit"
    SIGNAL = "signal"


class StepStore(Protocol):
    """Where steps are read and written, and stream items appended: the
    :class:`leaseq.Queue` (fenced statements), or in a child process its supervisor."""

    def steps(self, job_id: int) -> list[StepRecord]: ...

    def step_intend(self, lease: Lease, name: str, *, seen_token: int | None) -> bool: ...

    def step_record(self, lease: Lease, name: str, result: Any) -> bool: ...

    def step_withdraw(self, lease: Lease, name: str) -> bool: ...

    def emit(self, lease: Lease, value: Any) -> int | None: ...

    def signal_read(self, lease: Lease, name: str) -> tuple[bool, Any] | None: ...


def dispatch(store: StepStore, lease: Lease, op: StepOp, args: tuple[Any, ...]) -> Any:
    """Run one step call on ``store`` for ``lease`` (a supervisor answering its child)."""
    if op is StepOp.LIST:
        return store.steps(lease.job_id)
    if op is StepOp.INTEND:
        name, seen_token = args
        return store.step_intend(lease, name, seen_token=seen_token)
    if op is StepOp.RECORD:
        name, result = args
        return store.step_record(lease, name, result)
    if op is StepOp.EMIT:
        (value,) = args
        return store.emit(lease, value)
    if op is StepOp.SIGNAL:
        (name,) = args
        return store.signal_read(lease, name)
    (name,) = args
    return store.step_withdraw(lease, name)


def step_key(job_id: int, name: str) -> str:
    """A step's stable key: the same on every attempt of the job."""
    return f"job:{job_id}:step:{name}"


#: Makes one store call for the attempt; False or None from a fenced call: the lease is lost.
Call = Callable[[StepOp, tuple[Any, ...]], Any]


class Steps:
    """One attempt's steps. Not thread-safe: a handler runs its steps one after another."""

    def __init__(self, job_id: int, call: Call, lease_lost: Callable[[str], None]) -> None:
        self._job_id = job_id
        self._call = call
        self._lease_lost = lease_lost
        self._records: dict[str, StepRecord] | None = None
        self._ran: set[str] = set()
        self.current: str | None = None

    def run(
        self,
        name: str,
        fn: Callable[[], Any],
        reconcile: Callable[[Intent], Any] | None,
        idempotent: bool,
    ) -> Any:
        """The step's recorded result: recorded before, reconciled, or ``fn()``'s now. A
        function or check that returns an awaitable is refused (:class:`InvalidJob`)."""
        return _now(self._step(name, fn, reconcile, idempotent, awaiting=False))

    async def run_async(
        self,
        name: str,
        fn: Callable[[], Any],
        reconcile: Callable[[Intent], Any] | None,
        idempotent: bool,
    ) -> Any:
        """:meth:`run`, awaiting what ``fn`` or ``reconcile`` return when it is awaitable."""
        return await self._step(name, fn, reconcile, idempotent, awaiting=True)

    async def _step(
        self,
        name: str,
        fn: Callable[[], Any],
        reconcile: Callable[[Intent], Any] | None,
        idempotent: bool,
        *,
        awaiting: bool,
    ) -> Any:
        """The step, written once for :meth:`run` and :meth:`run_async`; it awaits only
        what the handler's code returns, and only when ``awaiting``. Under its own span
        (``step <name>``, a child of the attempt's), whether it runs or was recorded before."""
        self._check_name(name)
        with tracing.step_span(name, (Interrupted,)) as span:
            return await self._traced_step(name, fn, reconcile, idempotent, span, awaiting)

    async def _traced_step(
        self,
        name: str,
        fn: Callable[[], Any],
        reconcile: Callable[[Intent], Any] | None,
        idempotent: bool,
        span: tracing.Span,
        awaiting: bool,
    ) -> Any:
        record = (await self._known(awaiting)).get(name)
        if record is not None and record.recorded:
            tracing.step_replayed(span)
            return record.result
        seen = record.lease_token if record is not None else None
        intent = _intent(self._job_id, record)
        if intent is not None:
            if reconcile is None and not idempotent:
                raise StepUncertain(self._job_id, intent)
            # This attempt takes the uncertain step over before finding out.
            await self._fenced(StepOp.INTEND, (name, seen), name, "take over its intent", awaiting)
            if reconcile is not None:
                try:
                    with self._running(name):
                        found = await _value(name, reconcile(intent), awaiting)
                except NotDone:
                    pass
                else:
                    return await self._record(name, found, awaiting)
        else:
            await self._fenced(StepOp.INTEND, (name, seen), name, "commit its intent", awaiting)
        try:
            with self._running(name):
                result = await _value(name, fn(), awaiting)
        except (Exception, Suspended):
            # The function said it did not finish: a later attempt runs it afresh.
            await self._store(StepOp.WITHDRAW, (name,), awaiting)
            raise
        return await self._record(name, result, awaiting)

    async def _store(self, op: StepOp, args: tuple[Any, ...], awaiting: bool) -> Any:
        """One store call. Awaited, it runs on a thread of the loop's executor: an async
        handler's loop serves every async job of the worker, and a statement that waits
        (a lock, PostgreSQL unreachable and retried) must not stop the others."""
        if awaiting:
            return await asyncio.to_thread(self._call, op, args)
        return self._call(op, args)

    def recorded(self, name: str) -> StepRecord | None:
        """Step ``name``'s record if it has an outcome (it does not count as run)."""
        records = _now(self._known(awaiting=False))
        record = records.get(name)
        return record if record is not None and record.recorded else None

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_STEP_NAME:
            raise LeaseqError(
                f"step name must be a string of 1-{MAX_STEP_NAME} characters, got {name!r}"
            )
        if name in self._ran:
            raise StepNameReused(name)
        self._ran.add(name)

    async def _known(self, awaiting: bool) -> dict[str, StepRecord]:
        if self._records is None:
            rows: list[StepRecord] | None = await self._store(StepOp.LIST, (), awaiting)
            if rows is None:
                raise Interrupted("stopped while the job's steps could not be read")
            self._records = {r.name: r for r in rows}
        return self._records

    async def _record(self, name: str, result: Any, awaiting: bool) -> Any:
        # What a later attempt gets back: the JSON value (a tuple comes back a list). A value
        # that is not JSON leaves the intent without a result: the step is uncertain.
        try:
            value = json.loads(json.dumps(result, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise InvalidJob(f"step {name!r} result", f"is not JSON-serialisable ({exc})") from exc
        await self._fenced(StepOp.RECORD, (name, value), name, "record its result", awaiting)
        return value

    async def _fenced(
        self, op: StepOp, args: tuple[Any, ...], name: str, what: str, awaiting: bool
    ) -> None:
        if not await self._store(op, args, awaiting):
            message = f"lease lost: step {name!r} could not {what}"
            self._lease_lost(message)
            raise Interrupted(message)

    @contextlib.contextmanager
    def _running(self, name: str) -> Iterator[None]:
        """:attr:`current` is ``name`` while a step's function or check runs."""
        self.current = name
        try:
            yield
        finally:
            self.current = None


def _now(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine told not to await (``awaiting=False``): it never suspends,
    so it ends within one send."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast("T", done.value)
    coroutine.close()
    raise LeaseqError("a step suspended without awaiting")


async def _value(name: str, value: Any, awaiting: bool) -> Any:
    """``value``, awaited when it is awaitable and ``awaiting``; an awaitable that may not
    be awaited (a plain ``ctx.step`` given an ``async def``) is closed unrun and refused."""
    if not inspect.isawaitable(value):
        return value
    if awaiting:
        return await value
    close = getattr(value, "close", None)
    if callable(close):
        close()
    raise InvalidJob(
        f"step {name!r}",
        "its function returned an awaitable; in an async def handler use "
        "`await ctx.step_async(...)`",
    )


def _intent(job_id: int, record: StepRecord | None) -> Intent | None:
    """The intent ``record`` holds without an outcome (an uncertain step), if it does."""
    if record is None or record.finished_at is not None or record.lease_token is None:
        return None
    if record.attempt is None or record.intended_at is None:
        raise LeaseqError(f"step {record.name!r} has a lease token but no attempt or time")
    key = step_key(job_id, record.name)
    return Intent(job_id, record.name, key, record.attempt, record.lease_token, record.intended_at)
