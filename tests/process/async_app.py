"""``async def`` handlers for the process tests (``--app async_app:registry``)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from leaseq.runtime.context import JobContext, PermanentError
from leaseq.runtime.registry import Registry

registry = Registry()

# Module-level asyncio objects are bound to the loop that first uses them: a job on another
# loop would fail with "bound to a different event loop".
_arrived = asyncio.Condition()
_inside = 0


@registry.job("together")
async def together(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Return once ``payload['n']`` jobs of this type are inside at once: only jobs that run
    concurrently on one loop get there (a bounded wait, so a failure ends the job)."""
    global _inside
    async with _arrived:
        _inside += 1
        _arrived.notify_all()
        await asyncio.wait_for(_arrived.wait_for(lambda: _inside >= payload["n"]), 60)
    loop = asyncio.get_running_loop()
    return {"loop": id(loop), "thread": threading.get_ident(), "pid": os.getpid()}


def _note(folder: str, name: str) -> None:
    with Path(folder, name).open("a") as f:
        f.write("x\n")


@registry.job("steps")
async def steps(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """An async step and a plain one, each noted in ``payload['dir']`` when it runs; the
    first attempt then fails, so the second gets both steps' results back."""

    async def double(x: int) -> int:
        await asyncio.sleep(0)
        _note(payload["dir"], "double")
        return 2 * x

    def plus_one(x: int) -> int:
        _note(payload["dir"], "plus_one")
        return x + 1

    a = await ctx.step_async("double", double, payload["x"])
    b = await ctx.step_async("plus-one", plus_one, a)
    if ctx.attempt == 1:
        raise RuntimeError("after the steps")
    return {"a": a, "b": b}


@registry.job("one_step")
async def one_step(payload: dict[str, Any], ctx: JobContext) -> int:
    return int(await ctx.step_async("double", lambda: 2 * payload["x"]))


@registry.job("refuse")
async def refuse(payload: dict[str, Any], ctx: JobContext) -> None:
    await asyncio.sleep(0)
    raise PermanentError("not a document")


@registry.job("forever")
async def forever(payload: dict[str, Any], ctx: JobContext) -> None:
    """Wait for an hour; note the cancellation when the attempt is given up."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        _note(payload["dir"], "cancelled")
        raise


@registry.job("quick")
async def quick(payload: Any, ctx: JobContext) -> str:
    return "done"


@registry.batch("embed", max_batch=4, max_wait=2.0)
async def embed(payloads: list[dict[str, Any]], ctxs: list[JobContext]) -> list[Any]:
    await asyncio.sleep(0)
    return [{"x": p["x"], "batch": len(payloads)} for p in payloads]


@registry.batch("gated_batch", max_batch=2, max_wait=5.0)
async def gated_batch(payloads: list[dict[str, Any]], ctxs: list[JobContext]) -> list[Any]:
    """Wait (at most a minute) until the file ``payload['gate']`` exists."""
    gate = Path(payloads[0]["gate"])
    for _ in range(1200):
        if gate.exists():
            return [{"batch": len(payloads)} for _ in payloads]
        await asyncio.sleep(0.05)
    raise TimeoutError("the gate never opened")


@registry.job("swallow")
async def swallow(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """steps_app's ``swallow`` with the awaitable forms: asks to sleep or wait inside a
    ``try`` that catches ``Exception`` or ``BaseException``, then returns or raises."""
    caught = Exception if payload["catch"] == "exception" else BaseException
    try:
        if payload["call"] == "sleep":
            await ctx.sleep_async(3600)
            return {"slept": True}
        return {"decision": await ctx.wait_for_async("approve", timeout=3600)}
    except caught:
        with Path(payload["dir"], "caught").open("a") as f:
            f.write(payload["catch"] + "\n")
        if payload["then"] == "raise":
            raise RuntimeError("the model call failed") from None
    return {"decision": None}
