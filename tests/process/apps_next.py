"""The next release of the process tests' app (``--app apps_next:registry``): it ships a job
type, ``resize``, that ``apps:registry`` (the release before) does not know."""

from __future__ import annotations

from typing import Any

from leaseq.runtime.context import JobContext
from leaseq.runtime.registry import Registry

registry = Registry()


@registry.job("work")
def work(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {"worker": ctx.worker_id}


@registry.job("resize")
def resize(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {"worker": ctx.worker_id, "attempt": ctx.attempt}
