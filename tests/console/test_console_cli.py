"""`leaseq migrate --console-role` grants the console's role; `leaseq console` refuses to serve
without authentication on a public address."""

from __future__ import annotations

import psycopg
import pytest

from leaseq.cli.main import main
from support.roles import login_roles


def _can(url: str, function: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT has_function_privilege(%s, 'EXECUTE')", (function,)).fetchone()
    assert row is not None
    return bool(row[0])


RETRY = "leaseq.console_retry_dead(bigint[], text, text, jsonb)"


def test_migrate_grants_the_console_role(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with login_roles(database_url, "console") as roles:
        role, url = roles.names["console"], roles.urls["console"]
        assert main(["migrate", "--database-url", database_url, "--console-role", role]) == 0
        assert "GRANT EXECUTE ON FUNCTION leaseq.console_retry_dead" in capsys.readouterr().out
        assert _can(url, RETRY)
        args = ["migrate", "--database-url", database_url, "--console-role", role]
        assert main([*args, "--console-admin", "false"]) == 0
        assert not _can(url, RETRY)
        with psycopg.connect(url) as conn:  # still reads
            conn.execute("SELECT count(*) FROM leaseq.jobs").fetchone()


def test_the_console_role_must_not_be_a_component_role(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with login_roles(database_url) as roles:
        worker = roles.names["worker"]
        base = ["migrate", "--database-url", database_url, "--worker-role", worker]
        assert main([*base, "--console-role", worker]) == 2
        assert "component" in capsys.readouterr().err


def test_console_without_auth_refuses_a_public_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["console", "--database-url", "postgresql://c@db/app", "--address", "0.0.0.0"]
    assert main(args) == 2
    assert "not loopback" in capsys.readouterr().err
