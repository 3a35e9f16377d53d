"""Fixtures for the web console: a database with console roles (admin and read-only), apps
over them, and jobs in every state."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import leaseq
from leaseq.console import create_app
from leaseq.core.schema import ConsoleRole
from support.consoledb import ConsoleDb
from support.roles import login_roles

LOCAL = ("127.0.0.1", 50000)
BASE = "http://127.0.0.1:8089"


@pytest.fixture
def console_db(database_url: str) -> Iterator[ConsoleDb]:
    """A database whose console role is an admin one; a second login role waits to be made
    the console role read-only (support.consoledb.grant_readonly: one console role at a
    time, a new grant revokes the previous one's)."""
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


@pytest.fixture
def client_for() -> Iterator[Callable[..., TestClient]]:
    made: list[TestClient] = []

    def make(url: str, **kwargs: Any) -> TestClient:
        client = TestClient(create_app(url, **kwargs), client=LOCAL, base_url=BASE)
        client.__enter__()
        made.append(client)
        return client

    yield make
    for client in made:
        client.__exit__(None, None, None)
