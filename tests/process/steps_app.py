"""Handlers with durable steps for the process tests (``--app steps_app:registry``): every
call of a step's function or check is appended to a file in ``payload['dir']``, so a test
counts them across worker processes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import leaseq
from leaseq.runtime.context import JobContext
from leaseq.runtime.registry import Registry

registry = Registry()


def _note(folder: Path, name: str, line: str) -> None:
    with (folder / name).open("a") as f:
        f.write(line + "\n")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@registry.job("three_steps")
def three_steps(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Three steps; the second charges (appends its key to ``effects``) and, on the first
    attempt, then hangs until the worker is killed. ``mode``: how the second step's
    uncertain outcome is handled (reconcile, idempotent, or neither)."""
    folder = Path(payload["dir"])
    mode = payload["mode"]

    def fetch() -> dict[str, int]:
        _note(folder, "fetch.calls", f"{ctx.worker_id} {ctx.attempt}")
        return {"pages": 3}

    def charge() -> dict[str, str]:
        _note(folder, "charge.calls", f"{ctx.worker_id} {ctx.attempt} {ctx.step_key}")
        # The destination dedupes by key (what idempotent=True relies on).
        if ctx.step_key not in _lines(folder / "effects"):
            _note(folder, "effects", ctx.step_key)
        if ctx.attempt == 1:
            while True:  # killed here, after the effect and before the record
                time.sleep(0.05)
        return {"charged": ctx.step_key}

    def check(intent: leaseq.Intent) -> dict[str, str]:
        _note(folder, "check.calls", f"{ctx.worker_id} {ctx.attempt} {intent.attempt}")
        if intent.key not in _lines(folder / "effects"):
            raise leaseq.NotDone
        return {"charged": intent.key, "found": True}

    def publish(charged: dict[str, str]) -> str:
        _note(folder, "publish.calls", f"{ctx.worker_id} {ctx.attempt}")
        ctx.emit({"published": charged["charged"]})  # a partial result, for producers
        return f"published after {charged['charged']}"

    pages = ctx.step("fetch", fetch)
    options: dict[str, Any] = {
        "reconcile": {"reconcile": check},
        "idempotent": {"idempotent": True},
        "none": {},
    }[mode]
    charged = ctx.step("charge", charge, **options)
    published = ctx.step("publish", publish, charged)
    return {"pages": pages, "charged": charged, "published": published}


@registry.job("gated_step")
def gated_step(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """One idempotent step that notes its start and waits for ``payload['gate']``, ignoring
    the stop flag (a stale attempt that does not notice it lost its lease)."""
    folder = Path(payload["dir"])

    def write() -> dict[str, str]:
        _note(folder, "write.calls", ctx.worker_id)
        while not (folder / "gate").exists():
            time.sleep(0.05)
        return {"by": ctx.worker_id}

    return {"step": ctx.step("write", write, idempotent=True)}


@registry.job("nap")
def nap(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """A step, a durable sleep of ``payload['seconds']``, and a result naming both; the code
    after the sleep notes each run of it in ``after.calls``."""
    folder = Path(payload["dir"])

    def before() -> str:
        _note(folder, "before.calls", f"{ctx.worker_id} {ctx.attempt}")
        return "before"

    done = ctx.step("before", before)
    ctx.sleep(payload["seconds"])
    _note(folder, "after.calls", f"{ctx.worker_id} {ctx.attempt}")
    return {"step": done, "woke": ctx.worker_id}


@registry.job("approval")
def approval(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """A step, a wait for the signal ``approve`` (the seconds in the folder's file ``timeout``,
    else ``payload['timeout']``, an hour by default), and a note per call of the code after
    the wait."""
    folder = Path(payload["dir"])

    def draft() -> str:
        _note(folder, "draft.calls", f"{ctx.worker_id} {ctx.attempt}")
        return "draft"

    written = ctx.step("draft", draft)
    # A file "timeout" in the folder overrides the payload's (a test retrying the job sets it).
    override = folder / "timeout"
    timeout = float(override.read_text()) if override.exists() else payload.get("timeout", 3600)
    decision = ctx.wait_for("approve", timeout=timeout)
    _note(folder, "after.calls", f"{ctx.worker_id} {ctx.attempt}")
    return {"draft": written, "decision": decision}


@registry.job("quick")
def quick(payload: Any, ctx: JobContext) -> str:
    """Nothing to do: a job that needs only a free slot (and a unit of its key)."""
    return ctx.worker_id


@registry.job("drained_step")
def drained_step(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """A paying step, then a second step. In worker ``payload['hold']`` the payment's
    function notes its start and waits for the file ``gate`` before it writes its effect (a
    line naming the worker in ``effects``): a call longer than the drain window. ``mode``:
    ``reconcile`` (the check looks the payment up in ``effects``) or ``none``."""
    folder = Path(payload["dir"])

    def pay() -> dict[str, str]:
        _note(folder, "pay.calls", ctx.worker_id)
        while ctx.worker_id == payload["hold"] and not (folder / "gate").exists():
            time.sleep(0.02)
        _note(folder, "effects", ctx.worker_id)
        return {"paid_by": ctx.worker_id}

    def check(intent: leaseq.Intent) -> dict[str, str]:
        _note(folder, "check.calls", ctx.worker_id)
        paid = _lines(folder / "effects")
        if not paid:
            raise leaseq.NotDone
        return {"paid_by": paid[0]}

    reconcile = check if payload["mode"] == "reconcile" else None
    paid = ctx.step("pay", pay, reconcile=reconcile)
    after = ctx.step("after", lambda: ctx.worker_id)
    return {"paid": paid, "after": after}


@registry.job("swallow")
def swallow(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Asks to sleep or wait (``payload['call']``) inside a ``try`` that catches ``Exception``
    or ``BaseException`` (``payload['catch']``), as handlers do around model calls, then
    returns, or raises something else (``payload['then']``); each catch is noted in the
    file ``caught`` of ``payload['dir']``."""
    caught = Exception if payload["catch"] == "exception" else BaseException
    try:
        if payload["call"] == "sleep":
            ctx.sleep(3600)
            return {"slept": True}
        return {"decision": ctx.wait_for("approve", timeout=3600)}
    except caught:
        _note(Path(payload["dir"]), "caught", payload["catch"])
        if payload["then"] == "raise":
            raise RuntimeError("the model call failed") from None
    return {"decision": None}


@registry.job("same_name")
def same_name(payload: Any, ctx: JobContext) -> None:
    """Two steps of one name: a bug in the handler, met again by every retry."""
    ctx.step("fetch", lambda: 1)
    ctx.step("fetch", lambda: 2)
