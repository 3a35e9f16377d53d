"""An app whose ``probe`` handler writes to the database, on its own connection, for as long
as it lives: each row is the database time (``clock_timestamp()``) of one committed write, so
the last row says when the handler last changed anything, in database time (loaded by real
workers with ``--app probe_app:registry``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg

from leaseq.runtime.context import JobContext
from leaseq.runtime.registry import Registry

registry = Registry()


@registry.job("probe")
def probe(payload: dict[str, Any], ctx: JobContext) -> None:
    """Write ``clock_timestamp()`` into ``probe`` in a loop of autocommitted statements, after
    recording this process's pid in ``payload['pid_file']``; never returns."""
    with psycopg.connect(payload["url"], autocommit=True) as conn:
        Path(payload["pid_file"]).write_text(str(os.getpid()))
        while True:
            conn.execute("INSERT INTO probe (at) VALUES (clock_timestamp())")
