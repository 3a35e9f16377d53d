"""Handlers for the real ``leaseq worker`` processes the benchmarks start
(``--app bench.apps:registry``, run from the repository root)."""

from __future__ import annotations

import time
from typing import Any

from leaseq.runtime.context import JobContext
from leaseq.runtime.registry import Registry

registry = Registry()


@registry.job("noop")
def noop(payload: Any, ctx: JobContext) -> None:
    """Nothing: what is left is the runtime's own cost per job."""
    return None


@registry.job("sleep")
def sleep(payload: Any, ctx: JobContext) -> None:
    """Wait ``payload['seconds']`` (the handler of scenario 1's workload)."""
    ctx.wait(float(payload["seconds"]))


def record_start(path: str, ref: int) -> None:
    """Append ``ref`` and the wall-clock time now to the file at ``path``, in one write of
    one line (lines of concurrent handlers never interleave in a file opened to append)."""
    at = time.time()
    with open(path, "a") as out:
        out.write(f"{ref} {at!r}\n")


@registry.job("stamp")
def stamp(payload: Any, ctx: JobContext) -> None:
    """Record when the handler started (:mod:`bench.start`), then wait ``payload['seconds']``."""
    record_start(payload["file"], payload["ref"])
    ctx.wait(float(payload["seconds"]))


def record(path: str, ref: int, value: float) -> None:
    """Append ``ref`` and ``value`` to the file at ``path`` in one write of one line."""
    with open(path, "a") as out:
        out.write(f"{ref} {value!r}\n")


@registry.job("nap")
def nap(payload: Any, ctx: JobContext) -> None:
    """Sleep durably ``payload['seconds']`` once (:mod:`bench.wakes`), then record how late
    the code after the sleep runs: from the first attempt's time before the sleep (a step,
    so the attempt after the wake reads it back) plus the sleep."""
    seconds = float(payload["seconds"])
    began = ctx.step("began", time.time)
    ctx.sleep(seconds)
    record(payload["file"], payload["ref"], time.time() - began - seconds)


@registry.job("await_go")
def await_go(payload: Any, ctx: JobContext) -> None:
    """Wait durably for the signal ``go`` (:mod:`bench.wakes`), then record its round trip:
    from the wall-clock time the sender put in it to the code after the wait running."""
    sent = ctx.wait_for("go", timeout=120)["sent"]
    record(payload["file"], payload["ref"], time.time() - float(sent))
