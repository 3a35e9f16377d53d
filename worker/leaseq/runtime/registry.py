"""Handlers by job type, and start-up hooks, loaded from an import path (``pkg.module:name``).

::

    registry = leaseq.Registry()

    @registry.on_startup
    def load_model() -> None:
        MODEL.update(weights=load_weights())      # once per process, before any claim

    @registry.job("ocr", progress_timeout=120)
    def ocr(payload, ctx):
        ...
        return {"pages": 12}                     # stored as the job's result and effect

    @registry.job("summarise")
    async def summarise(payload, ctx):            # async handlers share one event loop
        answer = await ctx.step_async("llm", ask_model, payload["text"])   # JSON, memoized
        return {"summary": answer["summary"]}

    @registry.batch("embed", max_batch=32, max_wait=0.02)
    def embed(payloads, ctxs):
        vectors = MODEL["m"].encode([p["text"] for p in payloads])   # one model call
        return [{"vector": v} for v in vectors]  # one result (or exception) per job

    registry.schedule("nightly-reindex", "30 2 * * *", queue="batch", job_type="reindex",
                      timezone="Europe/Berlin")   # declared when a worker starts

``leaseq worker --app mypkg.jobs:registry`` loads it with :func:`load_app`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leaseq.core import validation
from leaseq.core.cron import DEFAULT_CATCHUP_SECONDS
from leaseq.core.errors import ConfigError, InvalidJob, WaitTimedOut
from leaseq.core.schedule_models import Overlap, ScheduleSpec
from leaseq.core.schedules import check_spec
from leaseq.runtime.handler_errors import Interrupted, PermanentError

if TYPE_CHECKING:
    from leaseq.runtime.context import JobContext

Handler = Callable[[Any, "JobContext"], Any]
#: ``handler(payloads, ctxs)``: one result, or one exception instance, per job, in order.
BatchHandler = Callable[[list[Any], list["JobContext"]], Sequence[Any]]
StartupHook = Callable[[], None]
ExceptionTypes = tuple[type[Exception], ...]

#: What fails a job at once, in every registry: a handler's :class:`PermanentError`, and the
#: :class:`InvalidJob` leaseq raises itself when an argument describing a job (a payload, a
#: ``ctx.spawn``) is unusable, and :class:`WaitTimedOut` (a wait for a signal whose deadline
#: passed). Retrying any of them runs the same code on the same input again.
DEFAULT_PERMANENT: ExceptionTypes = (PermanentError, InvalidJob, WaitTimedOut)


@dataclass(frozen=True)
class Batching:
    """How a batch job type gathers its attempts: up to ``max_batch`` at once, waiting at
    most ``max_wait`` seconds after the first for the others."""

    max_batch: int
    max_wait: float
    handler: BatchHandler


@dataclass(frozen=True)
class JobType:
    """A registered handler. ``progress_timeout``: when set, the worker stops renewing the
    lease and fails the attempt (error code ``NO_PROGRESS``, retried per policy) if the
    handler reported no progress for that many seconds. ``batch``: set for a batch type
    (then ``handler`` runs a batch of one). ``permanent``: the exception types that send the
    job to ``dead`` at once, with their traceback, instead of retrying it."""

    name: str
    handler: Handler
    progress_timeout: float | None = None
    batch: Batching | None = None
    permanent: ExceptionTypes = DEFAULT_PERMANENT


def batch_results(values: Any, count: int) -> list[Any]:
    """A batch handler's return value as a list of ``count`` entries; TypeError otherwise."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise TypeError(f"a batch handler must return a list, got {type(values).__name__}")
    if len(values) != count:
        raise TypeError(f"a batch handler returned {len(values)} results for {count} jobs")
    return list(values)


def _batch_of_one(handler: BatchHandler) -> Handler:
    def one(payload: Any, ctx: JobContext) -> Any:
        (value,) = batch_results(handler([payload], [ctx]), 1)
        if isinstance(value, BaseException):
            raise value
        return value

    return one


def _exception_types(where: str, types: Iterable[type[Exception]]) -> ExceptionTypes:
    """``types`` as a tuple of exception classes; ConfigError names one that is not (or that
    hands a job back, which cannot also fail it)."""
    found = tuple(types)
    for kind in found:
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise ConfigError(f"permanent= of {where} must list exception classes, got {kind!r}")
        if issubclass(kind, Interrupted):
            raise ConfigError(
                f"permanent= of {where}: {kind.__name__} hands a job back without failing it; "
                "leave it out"
            )
    return found


class Registry:
    """Job types a worker can run, and hooks to run once per process before the first claim.

    ``permanent``: exception types (beyond :data:`DEFAULT_PERMANENT`) that fail a job of any
    of its types at once, e.g. ``Registry(permanent=(ValueError, TypeError))``; a job type can
    add its own with ``job(..., permanent=...)``."""

    def __init__(self, *, permanent: Iterable[type[Exception]] = ()) -> None:
        self._permanent = DEFAULT_PERMANENT + _exception_types("the registry", permanent)
        self._types: dict[str, JobType] = {}
        self._startup: list[StartupHook] = []
        self._schedules: dict[str, ScheduleSpec] = {}

    def job(
        self,
        job_type: str,
        *,
        progress_timeout: float | None = None,
        permanent: Iterable[type[Exception]] = (),
    ) -> Callable[[Handler], Handler]:
        """Decorator registering ``handler(payload, ctx)`` for ``job_type``.

        The handler's return value (JSON) is the job's result; an exception fails the attempt
        (retried with backoff; one of the registry's permanent types, or of ``permanent``,
        goes straight to dead). Raises ConfigError for a bad or duplicate name.
        """
        self._check(job_type, progress_timeout)
        kinds = self._permanent + _exception_types(repr(job_type), permanent)

        def register(handler: Handler) -> Handler:
            self._types[job_type] = JobType(job_type, handler, progress_timeout, permanent=kinds)
            return handler

        return register

    def batch(
        self,
        job_type: str,
        *,
        max_batch: int,
        max_wait: float,
        progress_timeout: float | None = None,
        permanent: Iterable[type[Exception]] = (),
    ) -> Callable[[BatchHandler], BatchHandler]:
        """Decorator registering ``handler(payloads, ctxs)`` for ``job_type``, called with up
        to ``max_batch`` claimed jobs at once: the worker waits at most ``max_wait`` seconds
        after claiming the first for more to join.

        It returns one entry per job, in order: the job's result, or an exception instance
        that fails only that job (one of the permanent types, as for :meth:`job`: straight to
        dead). Raising fails every job of the batch. Each job keeps its own lease and token, and the
        batch's successes complete in one statement. Raises ConfigError for bad settings.
        """
        self._check(job_type, progress_timeout)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"max_batch of {job_type!r} must be a positive integer")
        try:
            validation.non_negative("max_wait", max_wait)
        except InvalidJob as exc:
            raise ConfigError(f"{job_type!r}: {exc}") from exc
        kinds = self._permanent + _exception_types(repr(job_type), permanent)

        def register(handler: BatchHandler) -> BatchHandler:
            batching = Batching(max_batch, float(max_wait), handler)
            self._types[job_type] = JobType(
                job_type, _batch_of_one(handler), progress_timeout, batching, kinds
            )
            return handler

        return register

    def _check(self, job_type: str, progress_timeout: float | None) -> None:
        try:
            validation.name("job_type", job_type)
            if progress_timeout is not None:
                validation.positive("progress_timeout", progress_timeout)
        except InvalidJob as exc:
            raise ConfigError(str(exc)) from exc
        if job_type in self._types:
            raise ConfigError(f"job type {job_type!r} is registered twice")

    def schedule(
        self,
        name: str,
        cron: str,
        *,
        queue: str,
        job_type: str,
        payload: Any = None,
        timezone: str = "UTC",
        priority: int = 100,
        max_attempts: int = 5,
        overlap: Overlap = Overlap.SKIP,
        catchup_seconds: float = DEFAULT_CATCHUP_SECONDS,
    ) -> None:
        """Declare a schedule (see :class:`leaseq.Schedules`): every worker starting with this
        registry upserts it, and disables the ones its app declared before and no longer
        does. ConfigError names a bad cron, time zone or other field, or a duplicate name."""
        spec = ScheduleSpec(
            name, cron, queue, job_type, {} if payload is None else payload, timezone,
            priority, max_attempts, overlap, catchup_seconds,
        )  # fmt: skip
        try:
            spec = check_spec(spec)
        except InvalidJob as exc:
            raise ConfigError(f"schedule {name!r}: {exc}") from exc
        if name in self._schedules:
            raise ConfigError(f"schedule {name!r} is declared twice")
        self._schedules[name] = spec

    @property
    def schedules(self) -> list[ScheduleSpec]:
        """The declared schedules, by name."""
        return [self._schedules[name] for name in sorted(self._schedules)]

    def on_startup(self, hook: StartupHook) -> StartupHook:
        """Decorator: run ``hook()`` once per worker process before it claims anything (load
        models here, not in the handler)."""
        self._startup.append(hook)
        return hook

    def run_startup(self) -> None:
        """Run the start-up hooks in registration order; an exception propagates."""
        for hook in self._startup:
            hook()

    def get(self, job_type: str) -> JobType | None:
        return self._types.get(job_type)

    @property
    def job_types(self) -> list[str]:
        return sorted(self._types)

    @property
    def largest_batch(self) -> int:
        """The largest ``max_batch`` of the batch types (1 when there are none)."""
        return max((t.batch.max_batch for t in self._types.values() if t.batch), default=1)


def load_app(path: str) -> Registry:
    """Import ``module:attribute`` and return that :class:`Registry`; ConfigError says what
    is wrong with the path otherwise."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"--app {path!r} must look like 'package.module:registry'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {path!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        found = getattr(module, attribute)
    except AttributeError as exc:
        raise ConfigError(f"--app {path!r}: module {module_name!r} has no {attribute!r}") from exc
    if not isinstance(found, Registry):
        raise ConfigError(
            f"--app {path!r}: {attribute!r} is a {type(found).__name__}, not a leaseq.Registry"
        )
    return found
