"""The handlers ``leaseq demo`` runs: simulated model inference that reports progress,
checkpoints as it goes (so a reclaimed job resumes instead of restarting), one flaky input
and one input that always fails."""

from __future__ import annotations

import time
from typing import Any

from leaseq.runtime.context import Interrupted, JobContext
from leaseq.runtime.registry import Registry

registry = Registry()
MODEL: dict[str, str] = {}
STEPS = 10


@registry.on_startup
def load_model() -> None:
    """Runs once per worker process, before its first claim (not once per job)."""
    time.sleep(0.2)
    MODEL["weights"] = "demo-classifier-v1"


@registry.job("infer", progress_timeout=30)
def infer(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Pretend to classify a document in ``STEPS`` steps over ``payload['seconds']``."""
    if payload.get("always_fails"):
        ctx.wait(0.3)
        raise RuntimeError("model rejected the input: unsupported file type")
    if payload.get("flaky") and ctx.attempt == 1:
        ctx.wait(0.3)
        raise RuntimeError("transient error: GPU out of memory")
    resumed_from = int((ctx.last_checkpoint or {}).get("step", 0))
    step_seconds = float(payload["seconds"]) / STEPS
    for step in range(resumed_from + 1, STEPS + 1):
        if ctx.wait(step_seconds):
            raise Interrupted(f"stopped at step {step} ({ctx.stop_reason})")
        ctx.progress({"step": step, "of": STEPS})
        if step % 3 == 0 and step < STEPS:
            ctx.checkpoint({"step": step})
    label = sum(map(ord, str(payload.get("doc")))) % 7
    return {
        "label": f"class-{label}",
        "model": MODEL["weights"],
        "resumed_from_step": resumed_from,
        "worker": ctx.worker_id,
    }
