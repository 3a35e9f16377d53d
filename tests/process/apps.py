"""Handlers for the process tests, loaded by real workers with ``--app apps:registry``
(the tests put this folder on the workers' PYTHONPATH)."""

from __future__ import annotations

import ctypes
import json
import os
import time
from pathlib import Path
from typing import Any

from leaseq.runtime.context import Interrupted, JobContext, PermanentError
from leaseq.runtime.registry import Registry

registry = Registry()
STARTED: list[float] = []


@registry.on_startup
def started() -> None:
    """Record the start-up, in memory and as ``started-<pid>`` in the working directory
    (so a test can tell which processes ran it)."""
    STARTED.append(time.time())
    Path(f"started-{os.getpid()}").touch()


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


def _note_pid(payload: dict[str, Any]) -> None:
    if "pid_file" in payload:
        Path(payload["pid_file"]).write_text(str(os.getpid()))


@registry.job("hold_gil")
def hold_gil(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Sit in a C call that keeps the GIL for ``payload['seconds']``: ``ctypes.PyDLL``
    never releases it, so no other thread of this process runs meanwhile."""
    _note_pid(payload)
    ctypes.PyDLL(None).sleep(int(payload["seconds"]))
    return {"pid": os.getpid()}


@registry.job("die")
def die(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """On the first attempt, note the pid and die as asked: ``wait`` (to be killed from
    outside), ``exit`` (``os._exit(3)``) or ``segfault``; later attempts succeed."""
    if ctx.attempt > 1:
        return {"attempt": ctx.attempt, "pid": os.getpid()}
    _note_pid(payload)
    how = payload["how"]
    if how == "exit":
        os._exit(3)
    if how == "segfault":
        ctypes.string_at(0)
    while True:
        time.sleep(0.05)


@registry.job("late_effect")
def late_effect(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The first attempt notes its pid and sleeps ``payload['seconds']`` (deaf to stop
    requests) before its effect; each attempt appends its number to ``payload['effect']``."""
    if ctx.attempt == 1:
        _note_pid(payload)
        time.sleep(float(payload["seconds"]))
    with Path(payload["effect"]).open("a") as out:
        out.write(f"{ctx.attempt}\n")
    return {"attempt": ctx.attempt}


@registry.job("runaway")
def runaway(payload: dict[str, Any], ctx: JobContext) -> None:
    """Ignore every stop request, forever (only a kill ends it)."""
    _note_pid(payload)
    while True:
        time.sleep(0.05)


@registry.job("steps")
def steps(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Progress and a checkpoint, then (first attempt) wait for ``gate`` and fail; the next
    attempt returns what it found; ``should_stop`` and the stop reason are reported too."""
    if ctx.attempt > 1:
        return {"resumed": ctx.last_checkpoint, "pid": os.getpid()}
    ctx.progress({"pct": 50})
    stored = ctx.checkpoint({"step": 3})
    gate = Path(payload["gate"])
    while not gate.exists():
        if ctx.wait(0.05):
            raise Interrupted(f"stopped: {ctx.stop_reason}")
    raise RuntimeError(f"crash after the checkpoint (stored={stored})")


@registry.batch("embed", max_batch=8, max_wait=0.2)
def embed(payloads: list[dict[str, Any]], ctxs: list[JobContext]) -> list[Any]:
    """One result per job (its text's length and the batch it ran in), or an error for a
    bad input; waits for ``gate`` first when a payload names one, after touching
    ``<gate>.entered`` (the batch has closed and holds its slot)."""
    for payload in payloads:
        gate = payload.get("gate")
        if gate:
            Path(f"{gate}.entered").touch()
        while gate and not Path(gate).exists():
            time.sleep(0.02)
    batch = [ctx.job_id for ctx in ctxs]
    results: list[Any] = []
    for payload in payloads:
        if not isinstance(payload.get("text"), str):
            results.append(PermanentError(f"no text in {payload!r}"))
        else:
            results.append({"length": len(payload["text"]), "batch": batch, "pid": os.getpid()})
    return results


@registry.batch("embed_fill", max_batch=3, max_wait=60)
def embed_fill(payloads: list[dict[str, Any]], ctxs: list[JobContext]) -> list[Any]:
    """Waits up to a minute for three jobs: only a full batch runs in a test."""
    return [{"batch": [ctx.job_id for ctx in ctxs]} for _ in payloads]


@registry.batch("embed_backlog", max_batch=4, max_wait=2)
def embed_backlog(payloads: list[dict[str, Any]], ctxs: list[JobContext]) -> list[Any]:
    """Batches of four from a backlog: waits for ``gate`` first when a payload names one,
    then reports the batch it ran in (the job ids)."""
    for payload in payloads:
        gate = payload.get("gate")
        while gate and not Path(gate).exists():
            time.sleep(0.02)
    return [{"batch": [ctx.job_id for ctx in ctxs]} for _ in payloads]


@registry.job("late_checkpoint")
def late_checkpoint(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Wait for ``gate``, then checkpoint; write what the context said to ``report``."""
    gate = Path(payload["gate"])
    while not gate.exists():
        time.sleep(0.02)
    stored = ctx.checkpoint({"late": True})
    seen = {
        "stored": stored,
        "should_stop": ctx.should_stop,
        "reason": ctx.stop_reason.value if ctx.stop_reason else None,
        "wait": ctx.wait(0),
    }
    Path(payload["report"]).write_text(json.dumps(seen))
    return seen


def _parse_page(page: Any) -> int:
    return int(page)  # raises ValueError for a page that is not a number


@registry.job("traceback")
def traceback_job(payload: dict[str, Any], ctx: JobContext) -> int:
    """Raise from a nested call, with ``payload['secret']`` in the message: the attempt's
    stored traceback must name both frames and must not show the secret."""
    try:
        return _parse_page(payload["page"])
    except ValueError as exc:
        raise ValueError(f"page {payload['page']!r} unreadable, see {payload['secret']}") from exc


# -- a tenant's document pipeline: split, one job per page, merge -------------------------


@registry.job("doc.split")
def doc_split(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Spawn one ``doc.page`` job per page and their ``doc.merge``; each inherits this job's
    flow key (none is given). ``fail_after_spawn``: raise a permanent error after spawning
    (the fan-out must not be written)."""
    pages = [
        ctx.spawn(ctx.queue, "doc.page", {**payload, "page": n}, name=f"page-{n}")
        for n in range(int(payload["pages"]))
    ]
    ctx.spawn(ctx.queue, "doc.merge", {"pages": len(pages)}, name="merge", after=pages)
    if payload.get("fail_after_spawn"):
        raise PermanentError("the document's schema version is not supported")
    return {"pages": len(pages)}


@registry.job("doc.page")
def doc_page(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Read a page for ``seconds``; page ``bad_page`` is an input that can never work."""
    if payload.get("bad_page") == payload["page"]:
        raise PermanentError(f"page {payload['page']} is not an image")
    if ctx.wait(float(payload.get("seconds", 0.0))):
        raise Interrupted("stopped while reading")
    return {"page": payload["page"], "text": f"text of page {payload['page']}"}


@registry.job("doc.merge")
def doc_merge(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The document's text from its pages' results, in page order."""
    pages = sorted((r.result for r in ctx.parent_results()), key=lambda p: int(p["page"]))
    return {"pages": len(pages), "text": " / ".join(p["text"] for p in pages)}
