"""Database-time helpers: tests move time with ``now=`` instead of sleeping."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import leaseq


def db_now(conn: leaseq.core.db.Conn) -> datetime:
    """The database's current time."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def claim_one(queue: leaseq.Queue, owner: str = "w1", **kw: Any) -> leaseq.ClaimedJob:
    """Claim exactly one job from queue ``q`` (fails the test otherwise)."""
    jobs = queue.claim(["q"], owner, **kw)
    assert len(jobs) == 1, f"expected one job, claimed {len(jobs)}"
    return jobs[0]
