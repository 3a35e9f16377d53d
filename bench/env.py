"""Where a benchmark runs: the server, throwaway databases, and what to record about both."""

from __future__ import annotations

import os
import platform
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

import leaseq

# The server parameters a reader needs to judge the numbers (durability, memory, vacuum).
PG_SETTINGS = (
    "shared_buffers",
    "work_mem",
    "max_connections",
    "fsync",
    "synchronous_commit",
    "wal_level",
    "jit",
    "autovacuum",
    "autovacuum_naptime",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_cost_delay",
    "autovacuum_vacuum_cost_limit",
)


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo ("unknown" elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, str]:
    """Cores, CPU model, OS and Python: enough to tell two machines' numbers apart."""
    return {
        "cores": str(os.cpu_count() or 0),
        "cpu_model": cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def server_info(url: str) -> dict[str, str]:
    """PostgreSQL's version and the parameters in PG_SETTINGS, as the server reports them."""
    with psycopg.connect(url, autocommit=True) as conn:
        info = {"pg_version": str(conn.execute("SHOW server_version").fetchone()[0])}  # type: ignore[index]
        rows = conn.execute(
            "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name = ANY(%s)",
            [list(PG_SETTINGS)],
        ).fetchall()
    info.update({f"pg.{name}": str(value) for name, value in rows})
    return info


@contextmanager
def server(url: str | None) -> Iterator[str]:
    """The given server URL, or a throwaway embedded PostgreSQL stopped on exit."""
    if url:
        yield url
        return
    from leaseq.demo.embedded import EmbeddedPostgres

    pg = EmbeddedPostgres()
    try:
        yield pg.url
    finally:
        pg.stop()


@contextmanager
def scratch_database(server_url: str, label: str, *, migrate: bool = True) -> Iterator[str]:
    """A new UTF8 database (migrated to leaseq's schema unless told not to), dropped on exit."""
    name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE \"{name}\" ENCODING 'UTF8' TEMPLATE template0")
    url = make_conninfo(server_url, dbname=name)
    try:
        if migrate:
            with leaseq.connect(url, action="migrate") as conn:
                leaseq.migrate(conn)
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reset_leaseq(url: str) -> None:
    """Empty leaseq's job tables between configurations of one scenario."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE leaseq.jobs, leaseq.job_attempts, leaseq.job_results, leaseq.job_steps,"
            " leaseq.job_stream, leaseq.job_signals"
            " RESTART IDENTITY"
        )


def reset_flow(url: str) -> None:
    """:func:`reset_leaseq`, and empty the flow-control tables too (keys, units, limits)."""
    reset_leaseq(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE leaseq.flow_keys, leaseq.flow_slots, leaseq.flow_limits,"
            " leaseq.flow_buckets, leaseq.flow_aggregates"
        )
