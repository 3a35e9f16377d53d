"""Test PostgreSQL: LEASEQ_TEST_DATABASE_URL if set, else an embedded server for the session.

A template database is migrated once; every test that asks for ``database_url`` gets its own
database created from it (and dropped after), so tests never see each other's rows.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

import leaseq
from leaseq.demo.embedded import EmbeddedPostgres
from support.time_limit import (  # noqa: F401 - pytest's hooks, taken in by name
    pytest_runtest_call,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)

# The tools scripts/setup-tests.sh fetches into .tools/bin (helm, kubectl) are found by every
# test and the processes it starts, without an `export PATH=...` step.
_TOOLS = Path(os.environ.get("LEASEQ_TOOLS_DIR") or Path(__file__).resolve().parents[1] / ".tools")
os.environ["PATH"] = f"{_TOOLS / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    url = os.environ.get("LEASEQ_TEST_DATABASE_URL")
    if url:
        yield url
        return
    server = EmbeddedPostgres()
    try:
        yield server.url
    finally:
        server.stop()


def _admin(server_url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(server_url, autocommit=True)


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    name = f"leaseq_tpl_{uuid.uuid4().hex[:10]}"
    with _admin(server_url) as admin:
        admin.execute(f"CREATE DATABASE \"{name}\" ENCODING 'UTF8' TEMPLATE template0")
    with leaseq.connect(make_conninfo(server_url, dbname=name), action="migrate") as conn:
        leaseq.migrate(conn)
    yield name
    with _admin(server_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def _database(server_url: str, prefix: str, template: str) -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with _admin(server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}" ENCODING \'UTF8\' TEMPLATE "{template}"')
    try:
        yield make_conninfo(server_url, dbname=name)
    finally:
        with _admin(server_url) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(server_url: str, template_db: str) -> Iterator[str]:
    """A fresh database with leaseq's schema, dropped after the test."""
    with _database(server_url, "leaseq_t", template_db) as url:
        yield url


@pytest.fixture
def empty_database_url(server_url: str) -> Iterator[str]:
    """A database with no leaseq schema at all."""
    with _database(server_url, "leaseq_e", "template0") as url:
        yield url


@pytest.fixture
def conn(database_url: str) -> Iterator[leaseq.core.db.Conn]:
    with leaseq.connect(database_url, action="test") as c:
        yield c


@pytest.fixture
def queue(conn: leaseq.core.db.Conn) -> leaseq.Queue:
    return leaseq.Queue(conn)


@pytest.fixture
def workers(conn: leaseq.core.db.Conn) -> leaseq.Workers:
    return leaseq.Workers(conn)


@pytest.fixture
def pool(database_url: str) -> Iterator[ConnectionPool[leaseq.core.db.Conn]]:
    p = leaseq.open_pool(database_url, min_size=2, max_size=20)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """In-process CLI tests configure logging onto pytest's captured stderr; put the root
    logger back so later log lines never go to a closed stream."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
