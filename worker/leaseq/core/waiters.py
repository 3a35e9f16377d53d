"""Waiting for jobs to finish: one listening connection per process serves every waiter.

A waiter registers its job ids with the process's :class:`DoneListener` (LISTEN leaseq_done
on a dedicated connection) *before* it reads the rows; then it waits for a wake-up and reads
again, on every wake-up and at least every ``poll`` seconds. A notification only says "read
again": the row is the truth. So a completion that commits before the first read is seen by
that read, one that commits after it wakes the waiter, and a lost notification (listening
connection down) costs at most one safety poll. After each (re)connect every waiter is woken
once, for whatever finished while the connection was away.

A pipeline's waiter does the same with the pipeline's topic (:func:`pipeline_topic`): the
transaction that finishes a pipeline's last job notifies ``pipeline:<id>`` on the same
channel, and the pipeline's row is the truth.

The asyncio twin (:class:`AsyncDoneListener`) is a task on the caller's event loop: no threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Collection, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Generic, Protocol, TypeVar

import psycopg

from leaseq.core._store.astore import AsyncStore
from leaseq.core._store.store import Store
from leaseq.core.adb import aconnect
from leaseq.core.backoff import Backoff
from leaseq.core.db import connect
from leaseq.core.errors import (
    InvalidJob,
    LeaseqError,
    WaitInHandler,
)
from leaseq.core.models import (
    JobOutcome,
    JobStatus,
    PipelineOutcome,
    PipelineRecord,
    PipelineState,
)
from leaseq.core.models import unwrap as unwrap

log = logging.getLogger("leaseq.waiters")

#: Longest a waiter goes without re-reading its rows when no wake-up comes (seconds).
DEFAULT_POLL_SECONDS = 5.0
#: How long a new waiter gives a starting listener to subscribe before it reads anyway.
SUBSCRIBE_WAIT_SECONDS = 2.0
#: How long a listener with nobody waiting keeps its connection before it closes it (the
#: next waiter opens a new one), so a producer that stopped waiting holds no connection.
IDLE_CLOSE_SECONDS = 30.0

_in_handler: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "leaseq_in_handler", default=False
)


class handler_running:
    """Mark the current context as running a job handler: waiting is refused inside it.
    A class, not a generator: it wraps every job's handler, and a generator-based context
    manager costs several Python calls more per job."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _in_handler.set(True)

    def __exit__(self, *exc: object) -> None:
        _in_handler.reset(self._token)


def refuse_in_handler() -> None:
    """Raise :class:`WaitInHandler` when called from a job handler."""
    if _in_handler.get():
        raise WaitInHandler()


def job_ids(ids: Collection[int]) -> list[int]:
    """``ids`` checked and without repeats, in their order."""
    if isinstance(ids, int | str | bytes):
        raise InvalidJob("job_ids", "must be a collection of job ids, not a single value")
    unique = list(dict.fromkeys(ids))
    if not unique:
        raise InvalidJob("job_ids", "must name at least one job")
    for job_id in unique:
        if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 1:
            raise InvalidJob("job_ids", f"{job_id!r} is not a job id")
    return unique


class _Signal(Protocol):
    def set(self) -> None: ...


S = TypeVar("S", bound=_Signal)


def pipeline_topic(pipeline_id: int) -> str:
    """What a waiter for pipeline ``pipeline_id`` watches: the payload of the notification its
    finish sends on the same channel (leaseq.pipeline_changed)."""
    return f"pipeline:{pipeline_id}"


#: What a waiter watches: a job id, or a :func:`pipeline_topic`.
Topic = int | str


class _Registry(Generic[S]):
    """Waiters' signals by topic (a job id, or a pipeline's topic); a notification sets the
    signals of its topic."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[Topic, set[S]] = {}
        self._signals: set[S] = set()
        #: How many times the listening connection subscribed (a reconnect adds one).
        self.subscriptions = 0

    def _add(self, signal: S, ids: Collection[Topic]) -> None:
        with self._lock:
            self._signals.add(signal)
            for job_id in ids:
                self._by_job.setdefault(job_id, set()).add(signal)

    def _remove(self, signal: S, ids: Collection[Topic]) -> None:
        with self._lock:
            self._signals.discard(signal)
            for job_id in ids:
                waiting = self._by_job.get(job_id)
                if waiting is not None:
                    waiting.discard(signal)
                    if not waiting:
                        del self._by_job[job_id]

    def _wake(self, payload: str) -> None:
        topic: Topic = int(payload) if payload.isdigit() else payload
        with self._lock:
            signals = list(self._by_job.get(topic, ()))
        for signal in signals:
            signal.set()

    def _subscribed(self) -> None:
        """Wake every waiter: a completion may have gone unnoticed while unsubscribed."""
        with self._lock:
            self.subscriptions += 1
            signals = list(self._signals)
        for signal in signals:
            signal.set()

    @property
    def waiters(self) -> int:
        with self._lock:
            return len(self._signals)


class DoneListener(_Registry[threading.Event]):
    """The process's listening connection to one database, on a daemon thread started by
    the first waiter; it reconnects with backoff when the connection drops while anyone
    waits, and closes it once nobody has waited for :data:`IDLE_CLOSE_SECONDS`."""

    def __init__(self, conninfo: str) -> None:
        super().__init__()
        self._conninfo = conninfo
        self._store = Store()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.connected = threading.Event()

    @contextmanager
    def watching(self, ids: Collection[Topic]) -> Iterator[threading.Event]:
        """An event set whenever one of ``ids`` (jobs or pipelines) may have finished,
        registered (and the connection subscribed, unless it cannot be within a short wait)
        before the block."""
        signal = threading.Event()
        self._add(signal, ids)
        try:
            self._start()
            self.connected.wait(SUBSCRIBE_WAIT_SECONDS)
            yield signal
        finally:
            self._remove(signal, ids)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stopping.clear()
                self._thread = threading.Thread(
                    target=self._run, name="leaseq-done-listener", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        backoff = Backoff(0.25, 2.0)
        while not self._stopping.is_set():
            try:
                with connect(self._conninfo, action="listen") as conn:
                    self._store.waiter_listen(conn)
                    self.connected.set()
                    backoff.reset()
                    self._subscribed()
                    idle_since = time.monotonic()
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=min(1.0, IDLE_CLOSE_SECONDS)):
                            self._wake(note.payload)
                        with self._lock:
                            if self._signals:
                                idle_since = time.monotonic()
                            elif time.monotonic() - idle_since >= IDLE_CLOSE_SECONDS:
                                # Cleared under the lock, before a new waiter can start a
                                # new thread, so it waits for that thread's subscription.
                                self.connected.clear()
                                self._thread = None
                                log.debug("completion listener idle: connection closed")
                                return
            except (LeaseqError, psycopg.Error) as exc:
                self.connected.clear()
                with self._lock:
                    if not self._signals:
                        # Nobody waits: stop rather than reconnect for no one (the next
                        # waiter starts a new thread; _start decides under the same lock).
                        self._thread = None
                        log.debug("completion listener lost its connection, idle: %s", exc)
                        return
                log.warning("completion listener lost its connection (%s); waiters poll "
                            "meanwhile", exc)  # fmt: skip
            self._stopping.wait(backoff.next())
        self.connected.clear()

    def close(self) -> None:
        """Stop listening and wait for the thread to end (within about a second)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()


class AsyncDoneListener(_Registry[asyncio.Event]):
    """The asyncio twin of :class:`DoneListener`: one task per event loop and database."""

    def __init__(self, conninfo: str) -> None:
        super().__init__()
        self._conninfo = conninfo
        self._store = AsyncStore()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    @asynccontextmanager
    async def watching(self, ids: Collection[Topic]) -> AsyncIterator[asyncio.Event]:
        """Like :meth:`DoneListener.watching`, for coroutines."""
        signal = asyncio.Event()
        self._add(signal, ids)
        try:
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(self._run())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.connected.wait(), SUBSCRIBE_WAIT_SECONDS)
            yield signal
        finally:
            self._remove(signal, ids)

    async def _run(self) -> None:
        backoff = Backoff(0.25, 2.0)
        while True:
            try:
                async with await aconnect(self._conninfo, action="listen") as conn:
                    await self._store.waiter_listen(conn)
                    self.connected.set()
                    backoff.reset()
                    self._subscribed()
                    idle_since = time.monotonic()
                    while True:
                        async for note in conn.notifies(timeout=min(1.0, IDLE_CLOSE_SECONDS)):
                            self._wake(note.payload)
                        if self.waiters:
                            idle_since = time.monotonic()
                        elif time.monotonic() - idle_since >= IDLE_CLOSE_SECONDS:
                            self.connected.clear()
                            log.debug("completion listener idle: connection closed")
                            return
            except (LeaseqError, psycopg.Error) as exc:
                self.connected.clear()
                if not self.waiters:  # nobody waits: the next waiter starts a new task
                    log.debug("completion listener lost its connection, idle: %s", exc)
                    return
                log.warning("completion listener lost its connection (%s); waiters poll "
                            "meanwhile", exc)  # fmt: skip
            finally:
                self.connected.clear()
            await asyncio.sleep(backoff.next())

    async def close(self) -> None:
        """Stop listening and close the connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


_listeners: dict[tuple[int, str], DoneListener] = {}
_async_listeners: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[str, AsyncDoneListener]
] = weakref.WeakKeyDictionary()
_listeners_lock = threading.Lock()


def shared_listener(conninfo: str) -> DoneListener:
    """This process's listener for ``conninfo`` (a forked child gets its own)."""
    key = (os.getpid(), conninfo)
    with _listeners_lock:
        listener = _listeners.get(key)
        if listener is None:
            listener = _listeners[key] = DoneListener(conninfo)
        return listener


def shared_async_listener(conninfo: str) -> AsyncDoneListener:
    """The running event loop's listener for ``conninfo``."""
    loop = asyncio.get_running_loop()
    by_url = _async_listeners.setdefault(loop, {})
    listener = by_url.get(conninfo)
    if listener is None:
        listener = by_url[conninfo] = AsyncDoneListener(conninfo)
    return listener


#: Sinks a pipeline wait reads, unless told otherwise.
DEFAULT_SINKS = 100


def wait_target(pipeline_id: int | None, job: int | None, sinks: int) -> None:
    """InvalidJob unless exactly one of ``pipeline_id`` and ``job`` names something, and
    ``sinks`` is at least 1."""
    if (pipeline_id is None) == (job is None):
        raise InvalidJob("pipeline_id", "name the pipeline, or its root with job=, not both")
    for field, value in (("pipeline_id", pipeline_id), ("job", job), ("sinks", sinks)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidJob(field, f"{value!r} is not an integer")
        if value is not None and value < 1:
            raise InvalidJob(field, f"must be at least 1, got {value}")


def pipeline_outcome(
    record: PipelineRecord, sinks: list[JobOutcome], limit: int
) -> PipelineOutcome:
    """A finished pipeline's outcome from its row and up to ``limit + 1`` of its sinks."""
    state = (
        PipelineState.FAILED
        if record.dead
        else PipelineState.CANCELLED
        if record.cancelled
        else PipelineState.SUCCEEDED
    )
    return PipelineOutcome(
        pipeline_id=record.id,
        state=state,
        total=record.total,
        succeeded=record.succeeded,
        dead=record.dead,
        cancelled=record.cancelled,
        sinks=sinks[-limit:],
        more_sinks=len(sinks) > limit,
    )


def lone_outcome(job: JobOutcome) -> PipelineOutcome:
    """A finished job that started no pipeline, as a pipeline of one."""
    state = {
        JobStatus.SUCCEEDED: PipelineState.SUCCEEDED,
        JobStatus.DEAD: PipelineState.FAILED,
    }.get(job.status, PipelineState.CANCELLED)
    return PipelineOutcome(
        pipeline_id=None,
        state=state,
        total=1,
        succeeded=int(job.status == JobStatus.SUCCEEDED),
        dead=int(job.status == JobStatus.DEAD),
        cancelled=int(job.status == JobStatus.CANCELLED),
        sinks=[job],
    )
