"""An app that registers ``parent_only`` in the worker process alone, never in the children
of ``--isolation process``: its jobs are claimed by a worker whose children have no handler
for them (loaded by real workers with ``--app parent_only_app:registry``)."""

from __future__ import annotations

import multiprocessing
from typing import Any

from leaseq.runtime.context import JobContext
from leaseq.runtime.registry import Registry

registry = Registry()


@registry.job("work")
def work(payload: Any, ctx: JobContext) -> Any:
    return payload


if multiprocessing.parent_process() is None:

    @registry.job("parent_only")
    def parent_only(payload: Any, ctx: JobContext) -> Any:
        return payload
