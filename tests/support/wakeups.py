"""The wake-ups sent on channel leaseq_jobs, read by a test's own LISTENing connection."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

Listening = psycopg.Connection[tuple[object, ...]]


@contextmanager
def listening(database_url: str) -> Iterator[Listening]:
    """An autocommit connection LISTENing on leaseq_jobs, closed after the block."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("LISTEN leaseq_jobs")
        yield conn


def notified(listener: Listening) -> list[str]:
    """The wake-ups sent since the last call: a marker is sent last, and everything that
    arrives before it was sent before it (notifications arrive in commit order)."""
    listener.execute("SELECT pg_notify('leaseq_jobs', 'marker')")
    got: list[str] = []
    for n in listener.notifies(timeout=30):
        if n.payload == "marker":
            return got
        got.append(n.payload)
    raise AssertionError("the marker never arrived")
