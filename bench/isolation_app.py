"""Handlers for ``python -m bench.isolation``: a no-op, and a stand-in model whose every call
costs ``CALL_SECONDS`` plus ``ITEM_SECONDS`` per input (sleeping, as a GPU call leaves the CPU
to others), called once per job or once per batch."""

from __future__ import annotations

import time
from typing import Any

from leaseq.runtime.context import JobContext
from leaseq.runtime.registry import Registry

CALL_SECONDS = 0.02
ITEM_SECONDS = 0.0005

registry = Registry()


def model(inputs: list[Any]) -> list[int]:
    time.sleep(CALL_SECONDS + ITEM_SECONDS * len(inputs))
    return [len(str(x)) for x in inputs]


@registry.job("noop")
def noop(payload: Any, ctx: JobContext) -> None:
    return None


@registry.job("infer")
def infer(payload: Any, ctx: JobContext) -> int:
    return model([payload])[0]


@registry.batch("infer_batch", max_batch=32, max_wait=0.02)
def infer_batch(payloads: list[Any], ctxs: list[JobContext]) -> list[int]:
    return model(payloads)


def _calls(payloads: list[Any], ctxs: list[JobContext]) -> list[dict[str, int]]:
    """One model call; every job's result names the call (its first job), so the database
    says how many calls ran."""
    model(payloads)
    return [{"call": ctxs[0].job_id}] * len(payloads)


# The inference setting (batches of up to 8, half a second to fill), and the same
# handler one job per call.
registry.batch("embed8", max_batch=8, max_wait=0.5)(_calls)
registry.batch("embed1", max_batch=1, max_wait=0.5)(_calls)
