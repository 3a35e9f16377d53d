"""Handlers for the tracing test (``--app tracing_app:registry``): one that does nothing, one
with two durable steps that logs inside the second, one that fails its first attempt, one
that streams an item and sleeps, one that waits for a signal, and a batch handler."""

from __future__ import annotations

import logging
from typing import Any

from leaseq.runtime.context import JobContext
from leaseq.runtime.registry import Registry

registry = Registry()
log = logging.getLogger("tracing_app")


@registry.job("noop")
def noop(payload: dict[str, Any], ctx: JobContext) -> None:
    return None


@registry.job("two_steps")
def two_steps(payload: dict[str, Any], ctx: JobContext) -> str:
    pages = ctx.step("fetch", lambda: 3)

    def save() -> str:
        log.warning("saving %s pages", pages)
        return "saved"

    return str(ctx.step("save", save))


@registry.job("flaky")
def flaky(payload: dict[str, Any], ctx: JobContext) -> str:
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return "second attempt"


@registry.job("sleepy")
def sleepy(payload: dict[str, Any], ctx: JobContext) -> str:
    ctx.emit("half way")  # each run: the stream keeps both
    ctx.sleep(0.2)
    return "woke"


@registry.job("waiter")
def waiter(payload: dict[str, Any], ctx: JobContext) -> Any:
    return ctx.wait_for("go", timeout=60)


@registry.batch("batched", max_batch=3, max_wait=5)
def batched(payloads: list[Any], ctxs: list[JobContext]) -> list[None]:
    return [None] * len(payloads)
