"""The event loop that runs ``async def`` handlers: one per process, on a thread of its own.

Slots stay what they are (threads, or child processes with ``--isolation process``): a slot
whose handler returned an awaitable hands it to this loop and waits for it, so the attempt
holds its slot until the coroutine ends and ``--concurrency`` bounds async handlers as it
bounds plain ones. One loop for the whole process means that what handlers keep across jobs
(an HTTP client and its connections, an ``asyncio.Lock``) is bound to one loop, whichever
slot runs the job. When the attempt is given up (lease lost, cancelled, timed out, released
at the end of a drain) its coroutine is cancelled at its next ``await``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Sequence
from typing import Any

from leaseq.core import tracing
from leaseq.core.waiters import handler_running
from leaseq.runtime.context import JobContext
from leaseq.runtime.handler_errors import Interrupted

#: What plain handlers return most: skips ``inspect.isawaitable``'s checks on every job.
_PLAIN = frozenset({type(None), dict, list, str, int, float, bool})

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def awaited(value: Any, contexts: Sequence[JobContext]) -> Any:
    """``value``, or what it comes to if it is awaitable (a handler declared ``async def``):
    awaited on the process's handler loop, this thread waiting. Cancelled once every one of
    ``contexts`` (the attempts it serves) is given up; then :class:`Interrupted` is raised
    here. The awaitable's own exception is raised here, with its traceback."""
    if type(value) in _PLAIN or not inspect.isawaitable(value):
        return value
    future = asyncio.run_coroutine_threadsafe(
        _in_handler(value, tracing.captured()), _handler_loop()
    )

    def cancel_once_all_stopped() -> None:
        # A batch's coroutine serves every attempt of it: one attempt given up (its job
        # cancelled, say) must not cost the others their work, so it goes with the last.
        if all(context.should_stop for context in contexts):
            future.cancel()

    for context in contexts:
        context.on_stop(cancel_once_all_stopped)
    try:
        return future.result()
    except concurrent.futures.CancelledError:
        raise Interrupted("stopped: the attempt was given up") from None


async def _in_handler(awaitable: Awaitable[Any], trace_context: tracing.Context) -> Any:
    # The mark and the attempt's span are context variables: they must be set in the task's
    # own context (the task copies the loop thread's, not the slot's).
    with handler_running(), tracing.carried(trace_context):
        return await awaitable


def _handler_loop() -> asyncio.AbstractEventLoop:
    """This process's handler loop, started on first use (a process without async handlers
    never starts it)."""
    global _loop
    loop = _loop
    if loop is not None:
        return loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(
                target=_loop.run_forever, name="leaseq-handler-loop", daemon=True
            ).start()
        return _loop
