"""Handlers for the process tests, loaded by real workers with ``--app apps:registry``
(the tests put this folder on the workers' PYTHONPATH)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from leaseq.runtime.context import Interrupted, JobContext, PermanentError
from leaseq.runtime.registry import Registry

registry = Registry()
STARTED: list[float] = []


@registry.on_startup
def started() -> None:
    STARTED.append(time.time())


def _seconds(payload: dict[str, Any], ctx: JobContext) -> float:
    by_worker = payload.get("seconds_by_worker", {})
    if ctx.worker_id in by_worker:
        return float(by_worker[ctx.worker_id])
    by_attempt = payload.get("seconds_by_attempt")
    if by_attempt:
        return float(by_attempt[min(ctx.attempt, len(by_attempt)) - 1])
    return float(payload.get("seconds", 0.0))


@registry.job("work")
def work(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Work for a while, reporting progress. Ignores the stop flag unless ``cooperative``:
    a stale worker that does not notice it lost its lease is what fencing is for."""
    end = time.monotonic() + _seconds(payload, ctx)
    while (left := end - time.monotonic()) > 0:
        ctx.progress({"left": round(left, 2)})
        if payload.get("cooperative"):
            ctx.raise_if_stopped()
        time.sleep(min(0.05, left))
    if payload.get("fail"):
        raise RuntimeError("asked to fail")
    return {"worker": ctx.worker_id, "attempt": ctx.attempt}


@registry.job("gated")
def gated(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Run until the file ``payload['gate']`` exists; hand the job back if told to stop."""
    gate = Path(payload["gate"])
    while not gate.exists():
        if ctx.wait(0.05):
            raise Interrupted("stopped before the gate opened")
    return {"worker": ctx.worker_id, "draining": ctx.draining}


@registry.job("broken")
def broken(payload: dict[str, Any], ctx: JobContext) -> None:
    raise PermanentError("this input can never work")


@registry.job("silent", progress_timeout=0.5)
def silent(payload: dict[str, Any], ctx: JobContext) -> None:
    """Never reports progress: the worker must stop renewing and fail it."""
    ctx.wait(30)
