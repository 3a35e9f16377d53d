"""A database that is not UTF8 is refused with a clear error by `leaseq migrate` and by a
starting worker. With SQL_ASCII, psycopg reads every text value back as bytes: a worker would
claim jobs and fail each one with "no handler for job type b'infer'", saying nothing about why.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

import leaseq
from leaseq.core._store.store import Store
from leaseq.core.schema import known_migrations


@pytest.fixture
def sql_ascii_url(server_url: str) -> Iterator[str]:
    name = f"leaseq_ascii_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'"
            " TEMPLATE template0"
        )
    try:
        yield make_conninfo(server_url, dbname=name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _leaseq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaseq.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",  # not the checkout: the installed package, wherever it lives
    )


def test_migrate_refuses_and_changes_nothing(sql_ascii_url: str) -> None:
    proc = _leaseq("migrate", "--database-url", sql_ascii_url)
    assert proc.returncode != 0, proc.stdout
    assert "encoding is SQL_ASCII; leaseq needs UTF8" in proc.stderr, proc.stderr
    with psycopg.connect(sql_ascii_url) as conn:
        assert conn.execute("SELECT to_regnamespace('leaseq')").fetchone() == (None,)


def test_worker_refuses_to_start_on_a_database_migrated_before_the_check(
    sql_ascii_url: str,
) -> None:
    # An older leaseq migrated it (it did not check the encoding).
    with psycopg.connect(sql_ascii_url, autocommit=True) as conn:
        conn.execute(
            "CREATE SCHEMA leaseq; CREATE TABLE leaseq.schema_migrations"
            " (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for migration in known_migrations():
            with conn.transaction():
                conn.execute(migration.script)
                conn.execute(
                    "INSERT INTO leaseq.schema_migrations (version, name) VALUES (%s, %s)",
                    [migration.version, migration.name],
                )
    proc = _leaseq(
        "worker",
        "--database-url",
        sql_ascii_url,
        "--app",
        "leaseq.demo.app:registry",
        "--queue",
        "infer",
        "--metrics-port",
        "0",
    )
    assert proc.returncode != 0
    assert "encoding is SQL_ASCII; leaseq needs UTF8" in proc.stderr, proc.stderr
    with (
        pytest.raises(leaseq.core.errors.WrongEncoding, match="SQL_ASCII"),
        leaseq.connect(sql_ascii_url, action="check") as conn,
    ):
        leaseq.check_schema(conn)


PAYLOADS = [
    None,
    0,
    -2.5,
    "",
    'é \u2603 \U0001f600 "quoted" \\ back',
    [],
    {},
    {"nested": [1, {"deep": [None, True, False]}], "k\u00e9y": "v"},
    [{"a": 1}, "two", 3.25],
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=range(len(PAYLOADS)))
def test_a_worker_session_reads_back_each_payload_as_stored(
    conn: leaseq.core.db.Conn, payload: object
) -> None:
    # Worker sessions decode JSON with the scanner alone (store._utf8_json): whatever a
    # producer stored must come back equal, through a claim, and as json with whitespace.
    leaseq.Queue.tune_worker_session(conn)
    queue = leaseq.Queue(conn)
    queue.enqueue("q", "t", payload)
    [job] = queue.claim(["q"], "w1", limit=1)
    assert job.payload == payload
    row = conn.execute("SELECT (' ' || %s::jsonb::text || ' ')::json", [Jsonb(payload)])
    assert row.fetchone() == (payload,)


def test_the_server_reports_its_version_and_encoding(conn: leaseq.core.db.Conn) -> None:
    # What leaseq's refusal of an old server or a wrong encoding reads (the rule itself is
    # tested in tests/unit/test_server_refusal.py: no server older than 15 runs here).
    version_num, version, encoding = Store().migration_server(conn)
    assert version_num == conn.info.server_version
    assert version.startswith(str(version_num // 10000))
    assert encoding == "UTF8"
