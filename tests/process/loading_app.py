"""An app whose on_startup stands for a slow model load: it blocks until the file named by
LEASEQ_TEST_LOAD_GATE exists (the test creates it to end the load)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from leaseq.runtime.context import JobContext
from leaseq.runtime.registry import Registry

registry = Registry()


@registry.on_startup
def load_model() -> None:
    gate = Path(os.environ["LEASEQ_TEST_LOAD_GATE"])
    waiting = threading.Event()
    while not gate.exists():
        waiting.wait(0.02)


@registry.job("echo")
def echo(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {"worker": ctx.worker_id}
