"""An older leaseq's schema in a database: the migrations before a version, applied and
recorded as that release's `leaseq migrate` did."""

from __future__ import annotations

import leaseq
from leaseq.core.schema import known_migrations


def migrate_before(conn: leaseq.core.db.Conn, version: int) -> None:
    """Apply the migrations older than ``version`` to an empty database."""
    conn.execute(
        "CREATE SCHEMA leaseq; CREATE TABLE leaseq.schema_migrations (version integer PRIMARY"
        " KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
    )
    for m in known_migrations():
        if m.version < version:
            with conn.transaction():
                conn.execute(m.script)
                conn.execute(
                    "INSERT INTO leaseq.schema_migrations (version, name) VALUES (%s, %s)",
                    (m.version, m.name),
                )
