"""Handlers of a pipeline for the cancel process test (``--app cancel_app:registry``): what
each handler sees is appended to a file in ``payload['dir']``, so the test reads it from the
worker process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from leaseq.runtime.context import JobContext
from leaseq.runtime.registry import Registry

registry = Registry()

#: How long the busy handler waits to be told it was cancelled (bounded: a lost cancel fails
#: the test instead of hanging the worker).
PATIENCE = 120.0


def _note(folder: Path, name: str, line: str) -> None:
    with (folder / name).open("a") as f:
        f.write(line + "\n")


@registry.job("root")
def root(payload: dict[str, Any], ctx: JobContext) -> str:
    """Spawns ``busy`` (runs until cancelled), ``napper`` (sleeps durably for an hour),
    ``idle`` (on a queue no worker serves: stays pending) and ``after`` (waits for busy)."""
    busy = ctx.spawn("q", "busy", payload, name="busy")
    ctx.spawn("q", "napper", payload, name="napper")
    ctx.spawn("unserved", "idle", payload, name="idle")
    ctx.spawn("q", "after", payload, name="after", after=[busy])
    return "spawned"


@registry.job("busy")
def busy(payload: dict[str, Any], ctx: JobContext) -> dict[str, bool]:
    """Works until ``ctx.cancelled`` (polled), notes what it saw, then returns a result and
    spawns a job as if it had finished: both must be dropped."""
    folder = Path(payload["dir"])
    _note(folder, "busy", "started")
    deadline = time.monotonic() + PATIENCE
    while not ctx.cancelled and time.monotonic() < deadline:
        ctx.wait(0.05)
    _note(folder, "busy", f"saw {ctx.stop_reason.value if ctx.stop_reason else None}")
    ctx.spawn("q", "late", payload, name="late")
    return {"late": True}


@registry.job("napper")
def napper(payload: dict[str, Any], ctx: JobContext) -> str:
    _note(Path(payload["dir"]), "napper", f"attempt {ctx.attempt}")
    ctx.sleep(3600)
    return "woke"


@registry.job("after")
def after(payload: dict[str, Any], ctx: JobContext) -> str:
    _note(Path(payload["dir"]), "after", "ran")
    return "ran"


@registry.job("late")
def late(payload: dict[str, Any], ctx: JobContext) -> str:
    _note(Path(payload["dir"]), "late", "ran")
    return "ran"
