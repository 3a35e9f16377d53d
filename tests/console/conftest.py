"""Fixtures for the web console: a database with console roles (admin and read-only), apps
over them, and jobs in every state."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from starlette.testclient import TestClient

import leaseq
from leaseq.console import create_app
from leaseq.core.schema import ConsoleRole
from support.roles import login_roles

LOCAL = ("127.0.0.1", 50000)


@dataclass(frozen=True)
class ConsoleDb:
    owner_url: str
    admin_url: str
    readonly_url: str
    admin_role: str
    readonly_role: str


@pytest.fixture
def console_db(database_url: str) -> Iterator[ConsoleDb]:
    """The console's admin role granted with admin, a second database's worth of read-only
    role (roles are cluster-wide, grants per database: the read-only role is granted in the
    same database by a second console role registry entry is not possible, so the read-only
    role gets its grants through a second call that replaces the first)."""
    with login_roles(database_url, "console", "console_ro") as roles:
        with leaseq.connect(database_url, action="test") as conn:
            leaseq.migrate(conn, console=ConsoleRole(roles.names["console"], admin=True))
        yield ConsoleDb(
            owner_url=database_url,
            admin_url=roles.urls["console"],
            readonly_url=roles.urls["console_ro"],
            admin_role=roles.names["console"],
            readonly_role=roles.names["console_ro"],
        )


def grant_readonly(db: ConsoleDb) -> None:
    """Make the read-only role the console role (read access, no admin functions)."""
    with leaseq.connect(db.owner_url, action="test") as conn:
        leaseq.migrate(conn, console=ConsoleRole(db.readonly_role, admin=False))


@pytest.fixture
def client_for() -> Iterator[Callable[..., TestClient]]:
    made: list[TestClient] = []

    def make(url: str, **kwargs: Any) -> TestClient:
        client = TestClient(create_app(url, **kwargs), client=LOCAL)
        client.__enter__()
        made.append(client)
        return client

    yield make
    for client in made:
        client.__exit__(None, None, None)


def post(client: TestClient, path: str, data: dict[str, str]) -> Any:
    """A form post the way a browser on the page sends it: Origin, the CSRF cookie's token."""
    token = client.cookies.get("leaseq_console_csrf")
    if token is None:
        client.get("/")
        token = client.cookies.get("leaseq_console_csrf")
    return client.post(
        path, data={**data, "csrf": token or ""}, headers={"Origin": "http://testserver"}
    )


def make_dead(conn: leaseq.core.db.Conn, queue: str, job_type: str, n: int, code: str) -> list[int]:
    """n dead jobs (inserted dead, as a failed last attempt leaves them)."""
    rows = conn.execute(
        "INSERT INTO leaseq.jobs (queue, job_type, payload, status, attempt_count, max_attempts,"
        " finished_at, last_error, last_error_code)"
        " SELECT %s, %s, jsonb_build_object('n', g, 'api_key', 'sk-live-123'), 'dead', 1, 1,"
        " now(), 'boom ' || g, %s FROM generate_series(1, %s) g RETURNING id",
        (queue, job_type, code, n),
    ).fetchall()
    return [r[0] for r in rows]


