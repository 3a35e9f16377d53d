"""Handlers for the real ``leaseq worker`` processes the benchmarks start
(``--app bench.apps:registry``, run from the repository root)."""

from __future__ import annotations

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
