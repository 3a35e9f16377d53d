"""Handlers for the fault tests, loaded by real workers with ``--app fault_apps:registry``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import leaseq

registry = leaseq.Registry()


@registry.job("step")
def step(payload: dict[str, Any], ctx: leaseq.JobContext) -> dict[str, Any]:
    """Work ``seconds`` in small steps, checkpointing every ``checkpoint_every`` seconds
    (when set); stop cooperatively when told. The result names the lease token, so a stale
    result is visible in SQL."""
    end = time.monotonic() + float(payload.get("seconds", 0.5))
    every = payload.get("checkpoint_every")
    next_checkpoint = time.monotonic()
    while time.monotonic() < end:
        if every is not None and time.monotonic() >= next_checkpoint:
            ctx.checkpoint({"at": time.time()})
            next_checkpoint = time.monotonic() + float(every)
        if ctx.wait(0.05):
            raise leaseq.Interrupted("told to stop")
    return {"token": ctx.lease_token, "worker": ctx.worker_id, "attempt": ctx.attempt}


@registry.job("stamp")
def stamp(payload: dict[str, Any], ctx: leaseq.JobContext) -> dict[str, Any]:
    """Write ``<dir>/<token>.start`` and, when told to stop, ``<dir>/<token>.stop`` (each
    holding time.time()): when each execution ran, seen from outside the database."""
    folder = Path(payload["dir"])
    (folder / f"{ctx.lease_token}.start").write_text(repr(time.time()))
    end = time.monotonic() + float(payload.get("seconds", 60))
    while time.monotonic() < end:
        if ctx.wait(0.02):
            (folder / f"{ctx.lease_token}.stop").write_text(repr(time.time()))
            raise leaseq.Interrupted("told to stop")
    return {"token": ctx.lease_token}


@registry.job("nul")
def nul(payload: dict[str, Any], ctx: leaseq.JobContext) -> dict[str, Any]:
    """OCR-like text with NUL bytes in a value and a key."""
    return {"text": "page\x00one\x00", "k\x00": 1, "token": ctx.lease_token}


@registry.job("huge_error")
def huge_error(payload: dict[str, Any], ctx: leaseq.JobContext) -> None:
    """An exception whose message is 5 MB, with NULs and control characters in it."""
    raise RuntimeError("bad\x00input\x1b[31m " + "y" * 5_000_000)


@registry.job("interrupt")
def interrupt(payload: dict[str, Any], ctx: leaseq.JobContext) -> None:
    """Always hands the job back, whether or not the worker is shutting down."""
    raise leaseq.Interrupted("not now")


# -- pipelines: a document split into pages (fan-out), read per page, merged (fan-in) ------


def _hold(folder: Path, ctx: leaseq.JobContext) -> None:
    """Wait for the test's ``go`` file (the test locks a row first, so the completion that
    follows blocks where the test wants it)."""
    while not (folder / "go").exists():
        if ctx.wait(0.02):
            raise leaseq.Interrupted("told to stop")


@registry.job("split")
def split(payload: dict[str, Any], ctx: leaseq.JobContext) -> dict[str, Any]:
    """Fan out: one ``page`` job per page and their ``merge``, written with this completion."""
    folder = Path(payload["dir"])
    (folder / f"split-{ctx.lease_token}").write_text("")
    pages = [
        ctx.spawn(
            ctx.queue,
            "page",
            {"dir": payload["dir"], "page": i, "hold": i == payload.get("hold_page")},
            name=f"page-{i}",
        )
        for i in range(int(payload["pages"]))
    ]
    # The aggregating job as a graph of its own, naming the spawned pages by name.
    aggregate = leaseq.Graph()
    aggregate.add(ctx.queue, "merge", {"dir": payload["dir"]}, name="merge",
                  after=[p.name for p in pages])  # fmt: skip
    ctx.add_graph(aggregate)
    if payload.get("hold_split"):
        _hold(folder, ctx)
    return {"pages": len(pages)}


@registry.job("page")
def page(payload: dict[str, Any], ctx: leaseq.JobContext) -> dict[str, Any]:
    if payload.get("hold"):
        _hold(Path(payload["dir"]), ctx)
    return {"text": f"p{payload['page']}"}


@registry.job("merge")
def merge(payload: dict[str, Any], ctx: leaseq.JobContext) -> dict[str, Any]:
    """The aggregating job: each execution leaves a file (counted by the test)."""
    folder = Path(payload["dir"])
    (folder / f"merge-{ctx.job_id}-{ctx.lease_token}").write_text("")
    texts = [r.result["text"] for r in ctx.parent_results(page=2)]
    return {"text": " ".join(texts)}


@registry.job("throttled")
def throttled(payload: dict[str, Any], ctx: leaseq.JobContext) -> dict[str, Any]:
    """The service it calls answers 429 the first time (``<dir>/<job>.429`` marks it)."""
    marker = Path(payload["dir"]) / f"{ctx.job_id}.429"
    if not marker.exists():
        marker.write_text(repr(time.time()))
        raise leaseq.BackOff(float(payload.get("retry_after", 1.0)), "429 Too Many Requests")
    return {"token": ctx.lease_token}


@registry.job("nap")
def nap(payload: dict[str, Any], ctx: leaseq.JobContext) -> dict[str, Any]:
    """Sleeps durably for ``seconds``; each run of the code before the sleep appends a line
    to ``<dir>/before``, each run of the code after it to ``<dir>/after`` (the test counts
    them: the code after a sleep runs once, however the wake went). With ``gate``, the first
    run waits for the test's ``<dir>/gate`` file before it sleeps."""
    folder = Path(payload["dir"])
    with (folder / "before").open("a") as f:
        f.write(f"{ctx.worker_id} {ctx.lease_token}\n")
    while payload.get("gate") and not (folder / "gate").exists():
        if ctx.wait(0.02):
            raise leaseq.Interrupted("told to stop")
    ctx.sleep(float(payload["seconds"]))
    with (folder / "after").open("a") as f:
        f.write(f"{ctx.worker_id} {ctx.lease_token}\n")
    return {"woke": ctx.worker_id, "token": ctx.lease_token}


# -- signals: a wait, then an effect the destination dedupes by its step key ----------------


@registry.job("approval")
def approval(payload: dict[str, Any], ctx: leaseq.JobContext) -> dict[str, Any]:
    """Wait for the signal ``approve``; then note that the code after the wait ran
    (``resumed-<worker>``) and write the effect once, as a step (``act.calls`` counts its
    function's calls). In the worker named ``hang_in`` it then holds until killed."""
    folder = Path(payload["dir"])
    decision = ctx.wait_for("approve", timeout=3600)
    with (folder / "resumed").open("a") as f:
        f.write(f"{ctx.worker_id}\n")

    def act() -> Any:
        with (folder / "act.calls").open("a") as f:
            f.write(f"{ctx.worker_id} {ctx.step_key}\n")
        return decision

    done = ctx.step("act", act, idempotent=True)
    if ctx.worker_id == payload.get("hang_in"):
        while not ctx.wait(0.05):
            pass
        raise leaseq.Interrupted("told to stop")
    return {"decision": done, "by": ctx.worker_id}
