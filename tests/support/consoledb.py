"""Helpers for the web console's tests: the console database's roles, form posts as a
browser sends them, dead jobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.testclient import TestClient

import leaseq
from leaseq.core.schema import ConsoleRole


@dataclass(frozen=True)
class ConsoleDb:
    owner_url: str
    admin_url: str
    readonly_url: str
    admin_role: str
    readonly_role: str


def grant_readonly(db: ConsoleDb) -> None:
    """Make the read-only role the console role (read access, no admin functions), in
    place of the admin one."""
    with leaseq.connect(db.owner_url, action="test") as conn:
        leaseq.migrate(conn, console=ConsoleRole(db.readonly_role, admin=False, replace=True))


def post(client: TestClient, path: str, data: dict[str, str]) -> Any:
    """A form post the way a browser on the page sends it: Origin, the CSRF cookie's token."""
    token = client.cookies.get("leaseq_console_csrf")
    if token is None:
        client.get("/")
        token = client.cookies.get("leaseq_console_csrf")
    return client.post(
        path,
        data={**data, "csrf": token or ""},
        headers={"Origin": str(client.base_url).rstrip("/")},
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
