"""A worker app declaring the schedules named in LEASEQ_TEST_SCHEDULES (comma-separated)."""

from __future__ import annotations

import os
from typing import Any

from leaseq import JobContext, Registry

registry = Registry()

for name in filter(None, os.environ.get("LEASEQ_TEST_SCHEDULES", "").split(",")):
    registry.schedule(
        name, "0 3 * * *", queue="periodic", job_type="noop", timezone="Europe/Berlin"
    )


@registry.job("noop")
def noop(payload: Any, ctx: JobContext) -> None:
    return None
